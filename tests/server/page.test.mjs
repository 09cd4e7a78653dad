// The chat page (GET /) in headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core; scripts/deps.sh installs it, so a missing
// browser fails the test): type a message, send it, watch the reply stream
// in from /v1/chat/completions; then stop a request with the stop button.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { URL_BASE, TMP, get, sse, metric, slotBusy, sleep } from './lib.mjs';

const CHROMIUM = process.env.MUSER_CHROMIUM || '/usr/bin/chromium';
// the ids asked of the page; the first present selector of each list is used
const SEL = {
    input: ['#input', 'textarea', 'input[type=text]'],
    send: ['#send', 'button[type=submit]', 'form button'],
    messages: ['#messages', '#chat', 'main'],
    stop: ['#stop'],
};

let browser = null;
let page = null;
const pageErrors = [];

async function find(kind) {
    for (const s of SEL[kind]) if (await page.$(s)) return s;
    return null;
}

before(async () => {
    assert.ok(fs.existsSync(CHROMIUM), `no browser at ${CHROMIUM} (scripts/deps.sh installs Debian's chromium)`);
    const profile = fs.mkdtempSync(path.join(TMP, 'chromium-profile-'));
    browser = await chromium.launchPersistentContext(profile, {
        executablePath: CHROMIUM,
        headless: true,
        args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
            '--disable-background-networking', '--disable-component-update', '--disable-sync'],
        timeout: 60000,
    });
    page = browser.pages()[0] || await browser.newPage();
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    // a failed load is reported by its response below (a browser asks for
    // /favicon.ico on its own: that one may be missing)
    page.on('console', (m) => {
        if (m.type() === 'error' && !/^Failed to load resource/.test(m.text())) pageErrors.push(`console: ${m.text()}`);
    });
    page.on('response', (r) => {
        if (r.status() >= 400 && !r.url().endsWith('/favicon.ico')) pageErrors.push(`${r.status()} ${r.url()}`);
    });
});

after(async () => {
    if (browser) await browser.close();
});

test('GET / serves the chat page', async () => {
    const r = await fetch(`${URL_BASE}/`);
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/html/);
    const html = await r.text();
    assert.match(html, /<html/i);
    assert.match(html, /v1\/chat\/completions/, 'the page talks to /v1/chat/completions');
});

test('the page sends a message and streams the reply in', async () => {
    const resp = await page.goto(`${URL_BASE}/`, { waitUntil: 'load', timeout: 30000 });
    assert.equal(resp.status(), 200);
    const input = await find('input');
    const send = await find('send');
    const messages = await find('messages');
    assert.ok(input && send && messages, `page lacks input/send/messages: ${input} ${send} ${messages}`);
    const before = await page.innerText(messages);
    const chatReq = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST', { timeout: 30000 });
    const question = 'Who was the first king of Israel?';
    await page.fill(input, question);
    await page.click(send);
    const rq = await chatReq;
    const body = JSON.parse(rq.postData());
    assert.equal(body.stream, true, 'the page asks for a stream');
    assert.equal(body.messages[body.messages.length - 1].content, question);
    assert.equal(body.messages[body.messages.length - 1].role, 'user');
    const rs = await rq.response();
    assert.equal(rs.status(), 200);
    assert.match(rs.headers()['content-type'], /^text\/event-stream/);
    // the streamed reply, as the server sent it, appears on the page
    const sse = (await rs.text()).split('\n').filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
        .map((l) => JSON.parse(l.slice(6)));
    const reply = sse.map((e) => (e.choices.length && e.choices[0].delta.content) || '').join('');
    assert.ok(reply.trim().length > 0, 'the server streamed an empty reply');
    await page.waitForFunction(({ sel, q, r }) => {
        const t = document.querySelector(sel).innerText;
        return t.includes(q) && t.includes(r);
    }, { sel: messages, q: question, r: reply.trim().split('\n')[0].trim() }, { timeout: 30000 });
    const after = await page.innerText(messages);
    assert.notEqual(after, before);
    await page.screenshot({ path: path.join(TMP, 'chat-page.png'), fullPage: true });
    assert.ok(fs.statSync(path.join(TMP, 'chat-page.png')).size > 1000);
    // the input is free for the next message
    assert.equal(await page.inputValue(input), '');
    assert.deepEqual(pageErrors, []);
});

test('the page\'s stop button cancels its request', async () => {
    const stop = await find('stop');
    assert.ok(stop, 'no #stop on the page');
    const input = await find('input');
    const send = await find('send');
    // glimmer-tiny's chat replies are too short to stop by hand: the page's
    // request is stopped while it waits for a slot. The four slots run long
    // generations and AHEAD more wait before the page's request; the queue is
    // first come first served, so the page's request cannot get a slot before
    // AHEAD / 4 whole generations have run in every slot, however fast the
    // model decodes (a 1000-token stream can end within a second). That the
    // queue ahead had not drained when stop was pressed is checked, not hoped.
    const AHEAD = 16;
    const bgAbort = new AbortController();
    const m00 = await get('/metrics');
    const submitted0 = metric(m00.text, 'muser_requests_total');
    const cancelled0 = metric(m00.text, 'muser_requests_cancelled_total');
    const bg = [];
    for (let i = 0; i < 4 + AHEAD; i++) {
        bg.push(sse('/completion',
            { prompt: `${i} And it came to pass`, n_predict: 1000, ignore_eos: true, temperature: 0, stream: true },
            { signal: bgAbort.signal }));
    }
    const t0 = Date.now();
    for (;;) {
        const m = await get('/metrics');
        if (metric(m.text, 'muser_requests_total') === submitted0 + 4 + AHEAD
            && metric(m.text, 'vllm:num_requests_running') === 4) break;
        assert.ok(Date.now() - t0 < 10000, 'the long generations were never all submitted');
        await sleep(5);
    }
    const chatReq = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'), { timeout: 30000 });
    await page.fill(input, 'Who was Samuel?');
    await page.click(send);
    await chatReq;
    await page.waitForFunction((sel) => !document.querySelector(sel).disabled, stop, { timeout: 5000 });
    for (;;) { // the page's request reached the scheduler, behind the others
        const m = await get('/metrics');
        if (metric(m.text, 'muser_requests_total') === submitted0 + 4 + AHEAD + 1) break;
        assert.ok(Date.now() - t0 < 10000, 'the page\'s request never reached the server');
        await sleep(5);
    }
    await page.click(stop, { timeout: 5000 });
    const t1 = Date.now();
    let m1;
    for (;;) {
        m1 = await get('/metrics');
        if (metric(m1.text, 'muser_requests_cancelled_total') !== cancelled0) break;
        assert.ok(Date.now() - t1 < 1000, 'the stopped request was not cancelled 1 s after stop');
        await sleep(10);
    }
    // generations that still wait were ahead of the page's request all along
    assert.ok(metric(m1.text, 'vllm:num_requests_waiting') >= 1,
        `the ${AHEAD} generations queued ahead of the page's request drained before stop took effect`);
    assert.equal(metric(m1.text, 'vllm:num_requests_running'), 4, 'the long generations ended before the check');
    assert.equal(metric(m1.text, 'muser_requests_cancelled_total'), cancelled0 + 1, 'only the stopped request was cancelled');
    await page.waitForFunction((sel) => document.querySelector(sel).disabled, stop, { timeout: 5000 });
    await page.screenshot({ path: path.join(TMP, 'chat-page-stopped.png'), fullPage: true });
    bgAbort.abort();
    const ws = await Promise.all(bg);
    assert.ok(ws.every((w) => w.aborted && w.error === null), JSON.stringify(ws.map((w) => [w.aborted, String(w.error)])));
    for (;;) {
        const sl = await get('/slots');
        const m = await get('/metrics');
        if (!sl.json.some(slotBusy) && metric(m.text, 'vllm:num_requests_waiting') === 0) break;
        assert.ok(Date.now() - t1 < 5000, 'slots still busy');
        await sleep(10);
    }
    assert.deepEqual(pageErrors.filter((e) => !/abort/i.test(e)), []);
});
