// The malformed-request corpus (malformed.json): every case must get its
// 4xx with an OpenAI-style error object ({"error": {"message", "type",
// "param", "code"}}) whose param names the offending field; never a 5xx,
// never a crash. Cases with "server": "auth" go to a second server started
// with --api-key.
//
// A case: {name, method, path, headers?, body? | json? | body_bytes?,
// body_encoding?, chunked?, expect_status: N | [N...], expect_param: "field" | null,
// server?}. headers default to Content-Type: application/json; "@LONG@" in
// a body stands for a text longer than the context; body_bytes makes a body
// of that many bytes (a JSON string of spaces), sent over a bare socket
// (Transfer-Encoding: chunked with chunked: true).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { URL_BASE, raw, rawSocket, get, post, startServer, stopServer, serverLog, PROMPTS } from './lib.mjs';

const CORPUS = JSON.parse(fs.readFileSync(fileURLToPath(new URL('./malformed.json', import.meta.url)), 'utf8'));
const KEY = 'sk-muser-test-key';
// ~6000 tokens, far past any slot's context
const LONG = Array.from({ length: 1500 }, (_, i) => `${PROMPTS[i % PROMPTS.length]} ${i}`).join(' ').slice(0, 60000);

let auth = null;
before(async () => {
    auth = await startServer(['--parallel', '1', '--api-key', KEY], 'auth');
});
after(async () => {
    if (auth) {
        const ex = await stopServer(auth);
        assert.deepEqual(ex, { code: 0, signal: null }, `auth server exit:\n${serverLog(auth)}`);
    }
});

function bodyOf(c) {
    if (c.body_bytes !== undefined) {
        const b = Buffer.alloc(c.body_bytes, 0x20);
        b[0] = 0x22; // "  ...  "
        b[c.body_bytes - 1] = 0x22;
        return b;
    }
    let s;
    if (c.json !== undefined) s = JSON.stringify(c.json);
    else if (c.body !== undefined) s = c.body;
    else return null;
    s = s.replace('@LONG@', LONG);
    return Buffer.from(s, c.body_encoding || 'utf8');
}

test('the corpus has 50+ cases, each with a name, path and expected 4xx', () => {
    assert.ok(CORPUS.length >= 50, String(CORPUS.length));
    const names = new Set();
    for (const c of CORPUS) {
        assert.ok(c.name && !names.has(c.name), `duplicate or unnamed case ${c.name}`);
        names.add(c.name);
        for (const s of [].concat(c.expect_status)) assert.ok(s >= 400 && s < 500, c.name);
    }
});

for (const c of CORPUS) {
    test(`malformed: ${c.name}`, async () => {
        const base = c.server === 'auth' ? auth.base : URL_BASE;
        const body = bodyOf(c);
        const headers = { ...(c.headers || { 'Content-Type': 'application/json' }) };
        if (body) headers['Content-Length'] = String(body.length);
        let r;
        try {
            r = c.body_bytes !== undefined
                ? await rawSocket(c.method, c.path, headers, body, { base, chunked: !!c.chunked })
                : await raw(c.method, c.path, headers, body, base);
        } catch (e) {
            assert.fail(`${c.method} ${c.path}: no HTTP answer (${e.code || e.message})`);
        }
        const want = [].concat(c.expect_status);
        const what = `${c.method} ${c.path} -> ${r.status} ${r.text.slice(0, 300)}`;
        assert.ok(r.status < 500, `5xx for a client's mistake: ${what}`);
        assert.ok(want.includes(r.status), `expected ${want.join('|')}: ${what}`);
        assert.ok(r.json && typeof r.json.error === 'object' && r.json.error !== null, `no error object: ${what}`);
        const e = r.json.error;
        assert.equal(typeof e.message, 'string', what);
        assert.ok(e.message.length > 0, what);
        const type = r.status === 401 ? 'authentication_error' : r.status === 404 ? 'not_found_error' : 'invalid_request_error';
        assert.equal(e.type, type, what);
        assert.match(r.headers['content-type'] || '', /^application\/json/, what);
        if (c.expect_param) {
            assert.equal(typeof e.param, 'string', `param should name ${c.expect_param}: ${what}`);
            assert.ok(e.param.includes(c.expect_param), `param ${JSON.stringify(e.param)} should name ${c.expect_param}: ${what}`);
        }
        if (r.status === 401) assert.ok(r.headers['www-authenticate'] === undefined || /Bearer/.test(r.headers['www-authenticate']));
    });
}

test('the servers are still up and serving after the corpus', async () => {
    const h = await get('/health');
    assert.equal(h.status, 200);
    const r = await post('/completion', { prompt: 'In the beginning', n_predict: 2 });
    assert.equal(r.status, 200, r.text);
    assert.equal(auth.exit, null, 'auth server died');
});

test('--api-key: the right Bearer key is let in', async () => {
    const r = await raw('POST', '/v1/chat/completions',
        { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
        JSON.stringify({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 }), auth.base);
    assert.equal(r.status, 200, r.text);
    const s = await raw('GET', '/slots', { Authorization: `Bearer ${KEY}` }, null, auth.base);
    assert.equal(s.status, 200, s.text);
});
