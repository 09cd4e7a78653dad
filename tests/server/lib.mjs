// Shared helpers of the `muser serve` tests (run by tests/cli_server.sh,
// which starts the shared server and sets MUSER_URL, MUSER_BIN,
// MUSER_SOURCE_DIR and MUSER_TEST_TMP). Written for Node 18 (Debian 12's
// nodejs) and later: global fetch, node:test, no newer built-ins.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import OpenAI from 'openai';

export const URL_BASE = process.env.MUSER_URL || 'http://127.0.0.1:8080';
export const BIN = process.env.MUSER_BIN;
export const SRC = process.env.MUSER_SOURCE_DIR;
export const TMP = process.env.MUSER_TEST_TMP || fs.mkdtempSync('/tmp/muser-srvtest-');

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function client(base = URL_BASE, apiKey = 'sk-no-key-needed') {
    return new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
}

let modelId = null;
/* The id /v1/models reports (what a client passes as `model`). */
export async function model(base = URL_BASE) {
    if (modelId && base === URL_BASE) return modelId;
    const r = await fetch(`${base}/v1/models`);
    const j = await r.json();
    if (base === URL_BASE) modelId = j.data[0].id;
    return j.data[0].id;
}

/* JSON request; returns {status, headers, json, text}. */
export async function req(method, p, body, { base = URL_BASE, headers = {} } = {}) {
    const init = { method, headers: { ...headers } };
    if (body !== undefined) {
        init.body = typeof body === 'string' ? body : JSON.stringify(body);
        if (!('Content-Type' in init.headers)) init.headers['Content-Type'] = 'application/json';
    }
    const r = await fetch(base + p, init);
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: r.status, headers: r.headers, json, text };
}
export const post = (p, body, o) => req('POST', p, body, o);
export const get = (p, o) => req('GET', p, undefined, o);

/* Raw HTTP/1.1 request with exactly the given headers (fetch would add a
 * Content-Type of its own); body a string or Buffer. */
export function raw(method, p, headers, body, base = URL_BASE) {
    const u = new URL(base + p);
    return new Promise((resolve, reject) => {
        const rq = http.request({ host: u.hostname, port: u.port, method, path: u.pathname + u.search, headers },
            (res) => {
                const chunks = [];
                res.on('data', (c) => chunks.push(c));
                res.on('end', () => {
                    const text = Buffer.concat(chunks).toString('utf8');
                    let json = null;
                    try { json = JSON.parse(text); } catch { /* not JSON */ }
                    resolve({ status: res.statusCode, headers: res.headers, text, json });
                });
                res.on('error', reject);
            });
        rq.on('error', reject);
        if (body !== undefined && body !== null) rq.write(body);
        rq.end();
    });
}

/* The same over a bare socket, for bodies a server may refuse before it
 * has read them (413): the headers go first and an early answer is read
 * before and while the body is written; a write error after the answer
 * arrived is no failure (curl behaves so; Node's http client and fetch
 * report EPIPE instead of the answer). chunked sends the body with
 * Transfer-Encoding: chunked. */
export function rawSocket(method, p, headers, body, { base = URL_BASE, chunked = false } = {}) {
    const u = new URL(base + p);
    return new Promise((resolve, reject) => {
        const sock = net.connect(Number(u.port), u.hostname);
        const got = [];
        let settled = false;
        const finish = (err) => {
            if (settled) return;
            const buf = Buffer.concat(got);
            const k = buf.indexOf('\r\n\r\n');
            if (k < 0) {
                settled = true;
                reject(err || new Error(`no HTTP answer (${buf.length} bytes)`));
                return;
            }
            const head = buf.slice(0, k).toString('latin1').split('\r\n');
            const status = Number(head[0].split(' ')[1]);
            const hs = {};
            for (const l of head.slice(1)) {
                const i = l.indexOf(':');
                hs[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
            }
            let rest = buf.slice(k + 4);
            if (hs['content-length'] !== undefined) {
                if (rest.length < Number(hs['content-length']) && !err && !sock.destroyed) return; // wait for more
                rest = rest.slice(0, Number(hs['content-length']));
            }
            settled = true;
            sock.destroy();
            const text = rest.toString('utf8');
            let json = null;
            try { json = JSON.parse(text); } catch { /* not JSON */ }
            resolve({ status, headers: hs, text, json });
        };
        sock.on('data', (d) => { got.push(d); finish(null); });
        sock.on('end', () => finish(new Error('closed')));
        sock.on('close', () => finish(new Error('closed')));
        sock.on('error', () => { /* EPIPE / ECONNRESET while writing: the answer decides */ });
        sock.on('connect', () => {
            const hs = { Host: `${u.hostname}:${u.port}`, Connection: 'close', ...headers };
            if (chunked) { delete hs['Content-Length']; hs['Transfer-Encoding'] = 'chunked'; }
            let head = `${method} ${u.pathname}${u.search} HTTP/1.1\r\n`;
            for (const [k, v] of Object.entries(hs)) head += `${k}: ${v}\r\n`;
            sock.write(`${head}\r\n`);
            if (!body) return;
            // in pieces, each once the last has drained (as curl does), so
            // that an early answer is read while the body is still going out
            const step = 1 << 16;
            let i = 0;
            const more = () => {
                while (i < body.length && !sock.destroyed && !settled) {
                    const part = body.slice(i, i + step);
                    i += step;
                    let ok;
                    if (chunked) {
                        sock.write(`${part.length.toString(16)}\r\n`);
                        sock.write(part);
                        ok = sock.write('\r\n');
                    } else {
                        ok = sock.write(part);
                    }
                    if (!ok) { sock.once('drain', more); return; }
                }
                if (chunked && i >= body.length && !sock.destroyed && !settled) sock.write('0\r\n\r\n');
            };
            // an answer to the headers alone (413 on Content-Length) is read
            // before the body goes out: a server that closes at once would
            // otherwise reset the connection under it
            setTimeout(more, 200);
        });
    });
}

/* POST a streaming request and collect its server-sent events: every
 * `data:` payload in order (parsed JSON, or the string '[DONE]'). onEvent
 * (ev, i) may return false to abort the request (the client goes away);
 * so do abortMs and an abort of signal. */
export async function sse(p, body, { base = URL_BASE, onEvent = null, headers = {}, abortMs = 0, signal = null } = {}) {
    const ac = new AbortController();
    const out = { status: 0, headers: null, events: [], raw: '', aborted: false, error: null };
    let timer = null;
    if (abortMs) timer = setTimeout(() => { out.aborted = true; ac.abort(); }, abortMs);
    if (signal) {
        const hangUp = () => { out.aborted = true; ac.abort(); };
        if (signal.aborted) hangUp();
        else signal.addEventListener('abort', hangUp, { once: true });
    }
    let r;
    try {
        r = await fetch(base + p, {
            method: 'POST', signal: ac.signal,
            headers: { 'Content-Type': 'application/json', ...headers },
            body: JSON.stringify(body),
        });
    } catch (e) {
        clearTimeout(timer);
        if (!out.aborted) out.error = e;
        return out;
    }
    out.status = r.status;
    out.headers = r.headers;
    try {
        return await readEvents(r, out, ac, onEvent);
    } finally {
        clearTimeout(timer);
    }
}

async function readEvents(r, out, ac, onEvent) {
    if (!(r.headers.get('content-type') || '').startsWith('text/event-stream')) {
        out.raw = await r.text();
        return out;
    }
    const dec = new TextDecoder();
    let buf = '';
    const reader = r.body.getReader();
    try {
        for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            const s = dec.decode(value, { stream: true });
            out.raw += s;
            buf += s;
            let k;
            while ((k = buf.indexOf('\n\n')) >= 0) {
                const block = buf.slice(0, k);
                buf = buf.slice(k + 2);
                const data = block.split('\n').filter((l) => l.startsWith('data:'))
                    .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
                if (!data) continue;
                const ev = data === '[DONE]' ? '[DONE]' : JSON.parse(data);
                out.events.push(ev);
                if (onEvent && onEvent(ev, out.events.length - 1) === false) {
                    out.aborted = true;
                    ac.abort();
                    return out;
                }
            }
        }
    } catch (e) {
        if (!out.aborted) out.error = e;
    }
    out.rest = buf;
    return out;
}

/* A free loopback TCP port (closed again before it is returned). */
export function freePort() {
    return new Promise((resolve, reject) => {
        const s = net.createServer();
        s.on('error', reject);
        s.listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
    });
}

/* Start another `muser serve` (the shipped default model) with extra
 * flags; resolves once GET /health answers 200. Its output goes to a log
 * file under TMP. */
export async function startServer(args, name) {
    const port = await freePort();
    const log = path.join(TMP, `server-${name}-${port}.log`);
    const fd = fs.openSync(log, 'w');
    const proc = spawn(BIN, ['serve', '--host', '127.0.0.1', '--port', String(port), ...args],
        { stdio: ['ignore', fd, fd] });
    fs.closeSync(fd);
    const s = { proc, port, base: `http://127.0.0.1:${port}`, log, exit: null };
    s.exited = new Promise((resolve) => proc.on('exit', (code, signal) => { s.exit = { code, signal }; resolve(s.exit); }));
    const t0 = Date.now();
    for (;;) {
        if (s.exit) throw new Error(`server ${name} exited ${JSON.stringify(s.exit)} before /health:\n${fs.readFileSync(log, 'utf8')}`);
        try {
            const r = await fetch(`${s.base}/health`);
            if (r.status === 200) break;
        } catch { /* not listening yet */ }
        if (Date.now() - t0 > 60000) {
            proc.kill('SIGKILL');
            throw new Error(`server ${name} not healthy after 60 s:\n${fs.readFileSync(log, 'utf8')}`);
        }
        await sleep(50);
    }
    return s;
}

/* SIGTERM, then the exit status (SIGKILL after timeoutMs and throw). */
export async function stopServer(s, timeoutMs = 30000) {
    if (!s.exit) s.proc.kill('SIGTERM');
    const t = setTimeout(() => s.proc.kill('SIGKILL'), timeoutMs);
    const ex = await s.exited;
    clearTimeout(t);
    return ex;
}

export function serverLog(s) {
    try { return fs.readFileSync(s.log, 'utf8'); } catch { return ''; }
}

/* Prometheus text: the value of the first sample of `name` (labels ignored). */
export function metric(text, name) {
    for (const line of text.split('\n')) {
        if (line.startsWith('#')) continue;
        const m = line.match(/^([^\s{]+)(\{[^}]*\})?\s+(\S+)/);
        if (m && m[1] === name) return Number(m[3]);
    }
    return undefined;
}

/* A chat or completion SSE stream reduced to per-token records. */
export function chatTokens(events) {
    const toks = [];
    for (const ev of events) {
        if (ev === '[DONE]' || !ev.choices || !ev.choices.length) continue;
        const c = ev.choices[0];
        if (c.logprobs && c.logprobs.content) {
            for (const lp of c.logprobs.content) toks.push(lp);
        }
    }
    return toks;
}
export function chatText(events) {
    let s = '';
    for (const ev of events) {
        if (ev === '[DONE]' || !ev.choices || !ev.choices.length) continue;
        const d = ev.choices[0].delta;
        if (d && typeof d.content === 'string') s += d.content;
    }
    return s;
}

/* Slots from GET /slots: [{id, busy}] whatever the field is called. */
export function slotBusy(s) {
    if ('is_processing' in s) return !!s.is_processing;
    if ('busy' in s) return !!s.busy;
    if ('state' in s) return s.state !== 0 && s.state !== 'idle';
    throw new Error(`slot without is_processing/busy/state: ${JSON.stringify(s)}`);
}

/* Prompts of different lengths and topics for the concurrency tests. */
export const PROMPTS = [
    'And it came to pass, when the king',
    'In the beginning',
    'The LORD is my shepherd;',
    'Blessed are the poor in spirit:',
    'And Moses said unto the people,',
    'Now the serpent was more subtil than any beast of the field',
    'Vanity of vanities, saith the Preacher,',
    'Then answered Jesus and said unto them,',
];
