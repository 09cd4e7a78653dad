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
    // glimmer-tiny's chat replies are too short to stop by hand: the four
    // slots are kept busy with long generations, so the page's request
    // waits in the queue while the stop button is pressed
    let stopBg = false;
    const bg = [0, 1, 2, 3].map((i) => sse('/completion',
        { prompt: `${i} And it came to pass`, n_predict: 1000, ignore_eos: true, temperature: 0, stream: true },
        { onEvent: () => !stopBg }));
    const t0 = Date.now();
    for (;;) {
        const m = await get('/metrics');
        if (metric(m.text, 'vllm:num_requests_running') === 4) break;
        assert.ok(Date.now() - t0 < 10000, 'the four long generations never ran');
        await sleep(5);
    }
    const m0 = await get('/metrics');
    const cancelled0 = metric(m0.text, 'muser_requests_cancelled_total');
    const chatReq = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'), { timeout: 30000 });
    await page.fill(input, 'Who was Samuel?');
    await page.click(send);
    await chatReq;
    await page.waitForFunction((sel) => !document.querySelector(sel).disabled, stop, { timeout: 5000 });
    for (;;) {
        const m = await get('/metrics');
        if (metric(m.text, 'vllm:num_requests_waiting') === 1) break;
        assert.ok(Date.now() - t0 < 10000, 'the page\'s request never queued');
        await sleep(5);
    }
    await page.click(stop, { timeout: 5000 });
    const t1 = Date.now();
    let m1;
    for (;;) {
        m1 = await get('/metrics');
        if (metric(m1.text, 'vllm:num_requests_waiting') === 0) break;
        assert.ok(Date.now() - t1 < 1000, 'the stopped request still waits for a slot 1 s after stop');
        await sleep(10);
    }
    assert.equal(metric(m1.text, 'vllm:num_requests_running'), 4, 'the long generations ended before the check');
    assert.equal(metric(m1.text, 'muser_requests_cancelled_total'), cancelled0 + 1, 'the stopped request was not cancelled');
    await page.waitForFunction((sel) => document.querySelector(sel).disabled, stop, { timeout: 5000 });
    await page.screenshot({ path: path.join(TMP, 'chat-page-stopped.png'), fullPage: true });
    stopBg = true;
    const ws = await Promise.all(bg);
    assert.ok(ws.every((w) => w.aborted && w.error === null));
    for (;;) {
        const sl = await get('/slots');
        if (!sl.json.some(slotBusy)) break;
        assert.ok(Date.now() - t1 < 5000, 'slots still busy');
        await sleep(10);
    }
    assert.deepEqual(pageErrors.filter((e) => !/abort/i.test(e)), []);
});
