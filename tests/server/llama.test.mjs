// The llama.cpp routes over plain HTTP: /completion (streaming, n_probs,
// cache_prompt), /tokenize, /detokenize, /apply-template, /props, /slots,
// /slots/{id}?action=..., /health, /metrics. The CLI (muser tokenize,
// muser chat-template) is the oracle for the tokenizer and the template.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { BIN, SRC, TMP, post, get, raw, sse, metric, slotBusy, PROMPTS } from './lib.mjs';

const MODEL = path.join(SRC, 'models/glimmer-tiny-q4_k_xl.gguf');

test('GET /health', async () => {
    const r = await get('/health');
    assert.equal(r.status, 200);
    assert.equal(r.json.status, 'ok');
});

test('POST /completion: llama.cpp response shape', async () => {
    const r = await post('/completion', { prompt: PROMPTS[0], n_predict: 12, temperature: 0 });
    assert.equal(r.status, 200, r.text);
    const j = r.json;
    assert.equal(typeof j.content, 'string');
    assert.ok(j.content.length > 0);
    assert.equal(j.stop, true);
    assert.ok(j.tokens_predicted >= 1 && j.tokens_predicted <= 12);
    const want = execFileSync(BIN, ['tokenize', '-m', MODEL, PROMPTS[0], '--ids']).toString().trim().split(',');
    assert.equal(j.tokens_evaluated, want.length, 'prompt tokens (with BOS) as muser tokenize counts them');
    assert.ok(['eos', 'limit', 'word'].includes(j.stop_type), j.stop_type);
    if (j.stop_type === 'limit') assert.equal(j.tokens_predicted, 12);
    assert.ok(Number.isInteger(j.id_slot) && j.id_slot >= 0 && j.id_slot < 4, String(j.id_slot));
    assert.equal(typeof j.timings, 'object');
    assert.equal(j.timings.predicted_n, j.tokens_predicted);
    assert.ok(j.timings.prompt_n >= 1 && j.timings.prompt_n <= j.tokens_evaluated);
    // the same run as `muser run` at --temp 0
    const cli = execFileSync(BIN, ['run', '-m', MODEL, '-p', PROMPTS[0], '-n', '12', '--temp', '0'],
        { stdio: ['ignore', 'pipe', 'ignore'] }).toString();
    assert.ok(cli.includes(j.content), `muser run printed ${JSON.stringify(cli)}, server ${JSON.stringify(j.content)}`);
});

test('POST /completion streaming equals the non-streamed content', async () => {
    const body = { prompt: PROMPTS[1], n_predict: 16, temperature: 0 };
    const ref = await post('/completion', body);
    const w = await sse('/completion', { ...body, stream: true });
    assert.equal(w.status, 200, w.raw);
    const evs = w.events.filter((e) => e !== '[DONE]');
    assert.ok(evs.length >= 2);
    const last = evs[evs.length - 1];
    assert.equal(last.stop, true);
    for (const e of evs.slice(0, -1)) assert.equal(e.stop, false);
    assert.equal(evs.map((e) => e.content || '').join(''), ref.json.content);
    assert.equal(last.tokens_predicted, ref.json.tokens_predicted);
    assert.equal(typeof last.timings, 'object');
});

test('POST /completion n_probs: per-token probabilities', async () => {
    const r = await post('/completion', { prompt: PROMPTS[2], n_predict: 6, temperature: 0, n_probs: 3 });
    assert.equal(r.status, 200, r.text);
    const cp = r.json.completion_probabilities;
    assert.equal(cp.length, r.json.tokens_predicted);
    let text = '';
    for (const t of cp) {
        assert.equal(typeof t.id, 'number');
        assert.equal(typeof t.token, 'string');
        assert.ok(t.logprob <= 0);
        assert.equal(t.top_logprobs.length, 3);
        assert.equal(t.top_logprobs[0].id, t.id, 'greedy draws the most likely token');
        assert.equal(t.top_logprobs[0].logprob, t.logprob);
        for (let i = 1; i < 3; i++) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
        text += t.token;
    }
    if (r.json.stop_type === 'limit') assert.equal(text, r.json.content);
    // the ids detokenize to the content
    const d = await post('/detokenize', { tokens: cp.map((t) => t.id) });
    assert.equal(d.json.content, text);
    // streamed, each event carries its token's probabilities
    const w = await sse('/completion', { prompt: PROMPTS[2], n_predict: 6, temperature: 0, n_probs: 3, stream: true });
    const ids = [];
    for (const e of w.events) if (e !== '[DONE]' && e.completion_probabilities) ids.push(...e.completion_probabilities.map((t) => t.id));
    assert.deepEqual(ids, cp.map((t) => t.id));
});

test('POST /tokenize and /detokenize round trip (against muser tokenize)', async () => {
    const texts = ['Hello world', 'And the LORD spake unto Moses, saying,', '  spaces\tand\nnewlines ', 'naïve café — ünïcode ✓'];
    for (const content of texts) {
        const t = await post('/tokenize', { content });
        assert.equal(t.status, 200, t.text);
        const want = execFileSync(BIN, ['tokenize', '-m', MODEL, content, '--ids', '--no-bos']).toString().trim();
        assert.equal(t.json.tokens.join(','), want, content);
        const d = await post('/detokenize', { tokens: t.json.tokens });
        assert.equal(d.status, 200, d.text);
        assert.equal(d.json.content, content);
    }
    // add_special adds the BOS muser tokenize adds
    const s = await post('/tokenize', { content: 'Hello world', add_special: true });
    const want = execFileSync(BIN, ['tokenize', '-m', MODEL, 'Hello world', '--ids']).toString().trim();
    assert.equal(s.json.tokens.join(','), want);
    // with_pieces: {id, piece}
    const p = await post('/tokenize', { content: 'Hello world', with_pieces: true });
    assert.equal(p.status, 200, p.text);
    assert.equal(p.json.tokens.map((x) => x.piece).join(''), 'Hello world');
});

test('POST /apply-template renders as muser chat-template does', async () => {
    const messages = [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Hi there' },
        { role: 'assistant', content: 'Hello.' },
        { role: 'user', content: 'Who was David?' },
    ];
    const r = await post('/apply-template', { messages });
    assert.equal(r.status, 200, r.text);
    const f = path.join(TMP, 'msgs.json');
    fs.writeFileSync(f, JSON.stringify(messages));
    const want = execFileSync(BIN, ['chat-template', '-m', MODEL, '--messages', f]).toString();
    assert.equal(r.json.prompt, want);
});

test('GET /props', async () => {
    const r = await get('/props');
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.total_slots, 4);
    assert.equal(typeof r.json.chat_template, 'string');
    assert.ok(r.json.chat_template.includes('header_start'), 'the model\'s template');
    const n_ctx = r.json.default_generation_settings.n_ctx;
    const s = await get('/slots');
    assert.equal(n_ctx, s.json[0].n_ctx);
    assert.ok(n_ctx >= 256);
});

test('GET /slots: one entry per slot, idle', async () => {
    const r = await get('/slots');
    assert.equal(r.status, 200, r.text);
    assert.ok(Array.isArray(r.json));
    assert.deepEqual(r.json.map((s) => s.id), [0, 1, 2, 3]);
    for (const s of r.json) {
        assert.equal(slotBusy(s), false);
        assert.ok(s.n_ctx > 0);
    }
});

test('id_slot, cache_prompt and POST /slots/0?action=erase', async () => {
    const prompt = PROMPTS.join(' ');
    const body = { prompt, n_predict: 2, temperature: 0, id_slot: 0, cache_prompt: true };
    const a = await post('/completion', body);
    assert.equal(a.status, 200, a.text);
    assert.equal(a.json.id_slot, 0);
    const full = a.json.tokens_evaluated;
    assert.ok(full > 40);
    const b = await post('/completion', body);
    assert.equal(b.json.id_slot, 0);
    assert.ok(b.json.timings.prompt_n <= 2, `same prompt in the same slot prefilled ${b.json.timings.prompt_n} of ${full}`);
    assert.ok(b.json.tokens_cached >= full - 1 || b.json.tokens_cached === undefined, String(b.json.tokens_cached));
    assert.equal(b.json.content, a.json.content);
    // cache_prompt false prefills everything
    const c = await post('/completion', { ...body, cache_prompt: false });
    assert.equal(c.json.timings.prompt_n, full);
    assert.equal(c.json.content, a.json.content);
    await post('/completion', body); // cached again
    const e = await post('/slots/0?action=erase', {});
    assert.equal(e.status, 200, e.text);
    assert.equal(e.json.id_slot, 0);
    assert.ok(e.json.n_erased > 0, JSON.stringify(e.json));
    const sl = await get('/slots');
    const s0 = sl.json.find((s) => s.id === 0);
    if ('n_cached' in s0) assert.equal(s0.n_cached, 0);
    const d = await post('/completion', body);
    assert.equal(d.json.timings.prompt_n, full, 'erased slot still had the prompt');
    assert.equal(d.json.content, a.json.content);
});

test('POST /slots/{id}?action=save|restore: a kvpack file moves a slot to another', async () => {
    const prompt = PROMPTS.join(' ');
    const body = { prompt, n_predict: 2, temperature: 0, id_slot: 0, cache_prompt: true };
    const a = await post('/completion', body);
    assert.equal(a.status, 200, a.text);
    const s = await post('/slots/0?action=save', { filename: 'slot0.bin' });
    assert.equal(s.status, 200, s.text);
    assert.equal(s.json.id_slot, 0);
    assert.ok(s.json.n_saved >= a.json.tokens_evaluated && s.json.n_written > 0, s.text);
    const r = await post('/slots/1?action=restore', { filename: 'slot0.bin' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.n_restored, s.json.n_saved);
    assert.equal(r.json.n_read, s.json.n_written);
    // slot 1 now holds slot 0's prompt: nothing but the last token is prefilled, same output
    const b = await post('/completion', { ...body, id_slot: 1 });
    assert.equal(b.status, 200, b.text);
    assert.ok(b.json.timings.prompt_n <= 2, `restored slot prefilled ${b.json.timings.prompt_n}`);
    assert.equal(b.json.content, a.json.content);
    // refusals name the field
    const bad = await post('/slots/1?action=restore', { filename: '../slot0.bin' });
    assert.equal(bad.status, 400, bad.text);
    assert.equal(bad.json.error.param, 'filename');
    const missing = await post('/slots/1?action=restore', { filename: 'never-saved.bin' });
    assert.equal(missing.status, 404, missing.text);
    const none = await post('/slots/1?action=save', {});
    assert.equal(none.status, 400, none.text);
    assert.equal(none.json.error.param, 'filename');
});

test('GET /metrics: Prometheus text with vLLM gauges, consistent histograms', async () => {
    await post('/completion', { prompt: PROMPTS[3], n_predict: 4, temperature: 0 });
    const r = await raw('GET', '/metrics', {});
    assert.equal(r.status, 200);
    assert.match(r.headers['content-type'], /^text\/plain/);
    const t = r.text;
    for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc']) {
        assert.ok(new RegExp(`^# TYPE ${name} gauge$`, 'm').test(t), `no gauge ${name}`);
        assert.notEqual(metric(t, name), undefined, name);
    }
    assert.equal(metric(t, 'vllm:num_requests_running'), 0);
    assert.equal(metric(t, 'vllm:num_requests_waiting'), 0);
    const kv = metric(t, 'vllm:kv_cache_usage_perc');
    assert.ok(kv > 0 && kv <= 1, `kv usage ${kv} with cached prompts in the slots`);
    assert.match(t, /^vllm:cache_config_info\{[^}]*\} 1(\.0*)?$/m);
    // every sample line is `name{labels} value`
    const seen = new Map();
    for (const line of t.split('\n')) {
        if (!line || line.startsWith('#')) continue;
        const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.eE+-]+|NaN|\+Inf|-Inf)$/);
        assert.ok(m, `bad sample line: ${line}`);
        seen.set(m[1] + (m[2] || ''), Number(m[3]));
    }
    // histograms: cumulative buckets ending at +Inf = _count
    const hists = [...t.matchAll(/^# TYPE (\S+) histogram$/gm)].map((x) => x[1]);
    assert.ok(hists.length >= 2, 'latency histograms');
    for (const h of hists) {
        const buckets = [...seen.entries()].filter(([k]) => k.startsWith(`${h}_bucket{`));
        assert.ok(buckets.length >= 2, h);
        let prev = 0;
        for (const [, v] of buckets) { assert.ok(v >= prev, `${h} not cumulative`); prev = v; }
        const inf = buckets.find(([k]) => k.includes('le="+Inf"'));
        assert.ok(inf, `${h} without +Inf`);
        assert.equal(inf[1], metric(t, `${h}_count`), `${h} +Inf != count`);
        assert.ok(metric(t, `${h}_sum`) >= 0, `${h}_sum`);
    }
    // request and token counters moved
    const counters = [...t.matchAll(/^# TYPE (\S+) counter$/gm)].map((x) => x[1]);
    assert.ok(counters.length >= 3, 'request and token counters');
    const value = (c) => (metric(t, c) !== undefined ? metric(t, c) : metric(t, `${c}_total`));
    assert.ok(counters.some((c) => /request/.test(c) && value(c) > 0), 'a request counter > 0');
    assert.ok(counters.some((c) => /token/.test(c) && value(c) > 0), 'a token counter > 0');
});

test('GET /v1/models and a 404 for an unknown model route', async () => {
    const r = await get('/v1/models');
    assert.equal(r.status, 200);
    assert.equal(r.json.object, 'list');
    const n = await get('/v1/nope');
    assert.equal(n.status, 404);
    assert.equal(n.json.error.type, 'not_found_error');
});
