// Connections and the process: a client that goes away mid-stream frees
// its slot at once; the bounded admission queue answers 429 with
// Retry-After; SIGTERM during streams finishes or ends them cleanly and
// exits 0; a non-loopback bind needs an API key.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { BIN, URL_BASE, get, post, raw, sse, metric, slotBusy, sleep, freePort,
    startServer, stopServer, serverLog, PROMPTS } from './lib.mjs';

async function idleWithin(ms, base = URL_BASE) {
    const t0 = Date.now();
    for (;;) {
        const s = await get('/slots', { base });
        const m = await get('/metrics', { base });
        const busy = s.json.filter(slotBusy).length;
        const running = metric(m.text, 'vllm:num_requests_running');
        const waiting = metric(m.text, 'vllm:num_requests_waiting');
        if (busy === 0 && running === 0 && waiting === 0) return Date.now() - t0;
        if (Date.now() - t0 > ms) return { busy, running, waiting, slots: s.json };
        await sleep(10);
    }
}

const LONG_GEN = (content) => ({
    model: 'x', messages: [{ role: 'user', content }], max_tokens: 900, temperature: 0, ignore_eos: true, stream: true,
});

test('a client that disconnects mid-stream leaves no busy slot', async () => {
    assert.equal(typeof await idleWithin(5000), 'number', 'slots busy before the test');
    const m0 = (await get('/metrics')).text;
    // read a dozen tokens of a 900-token generation, then go away
    const w = await sse('/v1/chat/completions', LONG_GEN('Tell me everything about Solomon.'), {
        onEvent: (ev, i) => i < 12,
    });
    assert.equal(w.aborted, true, `stream ended before the client left: ${w.raw.slice(-200)}`);
    const left = await idleWithin(2000);
    assert.equal(typeof left, 'number', `still busy 2 s after the disconnect: ${JSON.stringify(left)}`);
    // counted in tokens, not time (a loaded machine is slower at both): the
    // job stopped soon after the client left, far short of its 900 tokens
    const m1 = (await get('/metrics')).text;
    const d = (name) => metric(m1, name) - metric(m0, name);
    assert.equal(d('muser_requests_cancelled_total'), 1, 'the job was not counted as cancelled');
    assert.ok(d('muser_generation_tokens_total') < 250,
        `${d('muser_generation_tokens_total')} tokens generated for a client gone after 12`);
});

test('disconnects of running and queued streams free every slot', async () => {
    // 6 streams on 4 slots: 4 run, 2 wait; all go away
    const m0 = (await get('/metrics')).text;
    const ws = await Promise.all(PROMPTS.slice(0, 6).map((p, i) => sse('/v1/chat/completions', LONG_GEN(p), {
        abortMs: 400 + 30 * i,
    })));
    for (const w of ws) assert.equal(w.error, null, String(w.error));
    assert.ok(ws.every((w) => w.aborted), 'a 900-token stream finished within half a second');
    const left = await idleWithin(3000);
    assert.equal(typeof left, 'number', `busy after the disconnects: ${JSON.stringify(left)}`);
    const m1 = (await get('/metrics')).text;
    assert.equal(metric(m1, 'muser_requests_cancelled_total') - metric(m0, 'muser_requests_cancelled_total'), 6,
        'six streams left, six jobs cancelled');
    // and the server serves as before
    const r = await post('/completion', { prompt: PROMPTS[0], n_predict: 4, temperature: 0 });
    assert.equal(r.status, 200, r.text);
    const s = await get('/slots');
    assert.equal(s.json.length, 4);
});

test('bounded admission queue: 429 with Retry-After beyond it', async () => {
    const s = await startServer(['--parallel', '1', '--max-queue', '1'], 'queue');
    try {
        const body = { prompt: PROMPTS[1], n_predict: 300, ignore_eos: true, temperature: 0 };
        const rs = await Promise.all(Array.from({ length: 8 }, () => post('/completion', body, { base: s.base })));
        const by = {};
        for (const r of rs) by[r.status] = (by[r.status] || 0) + 1;
        assert.deepEqual(Object.keys(by).filter((k) => k !== '200' && k !== '429'), [], JSON.stringify(by));
        assert.ok(by[200] >= 2, `one running and one queued should succeed: ${JSON.stringify(by)}`);
        assert.ok(by[429] >= 1, `no 429 for 8 requests on 1 slot and a queue of 1: ${JSON.stringify(by)}`);
        for (const r of rs.filter((x) => x.status === 429)) {
            const ra = r.headers.get('retry-after');
            assert.ok(ra && /^\d+$/.test(ra) && Number(ra) >= 1, `Retry-After ${ra}`);
            assert.equal(typeof r.json.error.message, 'string');
        }
        for (const r of rs.filter((x) => x.status === 200)) assert.equal(r.json.tokens_predicted, 300);
        // streaming requests are refused before the stream starts
        const ws = await Promise.all(Array.from({ length: 5 }, () => sse('/completion', { ...body, stream: true }, { base: s.base })));
        const refused = ws.filter((w) => w.status === 429);
        assert.ok(refused.length >= 1, ws.map((w) => w.status).join(','));
        for (const w of refused) assert.ok(w.headers.get('retry-after'));
        const m = await get('/metrics', { base: s.base });
        assert.equal(metric(m.text, 'vllm:num_requests_waiting'), 0);
    } finally {
        const ex = await stopServer(s);
        assert.deepEqual(ex, { code: 0, signal: null }, serverLog(s));
    }
});

test('SIGTERM during streams: they finish or end cleanly, exit 0', async () => {
    const s = await startServer(['--parallel', '2'], 'sigterm');
    let started = 0;
    let release;
    const bothStarted = new Promise((r) => { release = r; });
    const onEvent = (ev, i) => { if (i === 0 && ++started === 2) release(); return true; };
    const streams = [
        sse('/v1/chat/completions', { ...LONG_GEN('Who was Elijah?'), max_tokens: 300 }, { base: s.base, onEvent }),
        sse('/completion', { prompt: PROMPTS[2], n_predict: 300, ignore_eos: true, stream: true }, { base: s.base, onEvent }),
    ];
    await bothStarted;
    s.proc.kill('SIGTERM');
    // a request after SIGTERM is refused (503) or finds nobody listening
    await sleep(20);
    try {
        const late = await post('/completion', { prompt: 'Hi', n_predict: 2 }, { base: s.base });
        assert.equal(late.status, 503, `a request after SIGTERM got ${late.status} ${late.text}`);
        assert.ok(late.headers.get('retry-after'));
    } catch (e) {
        assert.ok(/ECONNREFUSED|ECONNRESET|fetch failed|other side closed/.test(String(e.cause || e)), String(e.cause || e));
    }
    const [chat, comp] = await Promise.all(streams);
    const ex = await stopServer(s, 30000);
    assert.deepEqual(ex, { code: 0, signal: null }, `exit after SIGTERM:\n${serverLog(s)}`);
    assert.equal(chat.error, null, `chat stream broke: ${chat.error}`);
    assert.equal(comp.error, null, `completion stream broke: ${comp.error}`);
    assert.equal(chat.events[chat.events.length - 1], '[DONE]', `chat stream not ended: ${chat.raw.slice(-300)}`);
    const fin = chat.events.filter((e) => e !== '[DONE]' && e.choices.length && e.choices[0].finish_reason);
    assert.equal(fin.length, 1, 'one finish_reason');
    const last = comp.events.filter((e) => e !== '[DONE]').pop();
    assert.equal(last.stop, true, `completion stream not ended: ${comp.raw.slice(-300)}`);
});

test('binding a non-loopback address without an API key is refused', async () => {
    const port = await freePort();
    const p = spawn(BIN, ['serve', '--host', '0.0.0.0', '--port', String(port)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { out += d; });
    const killer = setTimeout(() => p.kill('SIGKILL'), 20000);
    const code = await new Promise((r) => p.on('exit', (c) => r(c)));
    clearTimeout(killer);
    assert.notEqual(code, 0, 'served 0.0.0.0 without a key');
    assert.ok(code !== null, 'had to be killed: it served 0.0.0.0 without a key');
    assert.match(out, /api-key/, out);
    // with a key it serves (reached here through loopback)
    const s = await startServer(['--parallel', '1', '--host', '0.0.0.0', '--api-key', 'k'], 'anyaddr');
    try {
        const r = await raw('GET', '/health', {}, null, s.base);
        assert.equal(r.status, 200);
    } finally {
        const ex = await stopServer(s);
        assert.deepEqual(ex, { code: 0, signal: null }, serverLog(s));
    }
});
