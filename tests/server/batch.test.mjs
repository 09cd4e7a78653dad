// Continuous batching: 8 concurrent streams at temperature 0 equal their
// sequential outputs token for token (logprobs included); a seeded sampled
// request replays alone and under load; per-slot prompt caching.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, model, post, get, sse, metric, chatTokens, chatText, sleep, PROMPTS } from './lib.mjs';

const oa = client();

async function stream(body) {
    const w = await sse('/v1/chat/completions', { ...body, stream: true });
    assert.equal(w.status, 200, w.raw);
    assert.equal(w.error, null);
    assert.equal(w.events[w.events.length - 1], '[DONE]');
    const fin = w.events.filter((e) => e !== '[DONE]' && e.choices.length && e.choices[0].finish_reason);
    return { text: chatText(w.events), tokens: chatTokens(w.events), finish: fin.length ? fin[0].choices[0].finish_reason : null };
}

/* Run fn while polling /metrics; resolves [fn's result, most requests seen running at once]. */
async function withLoadProbe(fn) {
    let peak = 0;
    let done = false;
    const probe = (async () => {
        while (!done) {
            const r = await get('/metrics');
            peak = Math.max(peak, metric(r.text, 'vllm:num_requests_running') || 0);
            await sleep(3);
        }
    })();
    const out = await fn();
    done = true;
    await probe;
    return [out, peak];
}

const bodies = async () => {
    const m = await model();
    return PROMPTS.map((p) => ({
        model: m, messages: [{ role: 'user', content: p }], max_tokens: 40, temperature: 0,
        logprobs: true, top_logprobs: 2,
    }));
};

test('8 concurrent streams at temperature 0 equal their sequential outputs', async () => {
    const bs = await bodies();
    const seq = [];
    for (const b of bs) seq.push(await stream(b));
    const [par, peak] = await withLoadProbe(() => Promise.all(bs.map((b) => stream(b))));
    assert.ok(peak >= 2, `never more than ${peak} request running at once: no batching seen`);
    for (let i = 0; i < bs.length; i++) {
        assert.ok(seq[i].tokens.length >= 1, `stream ${i} reported no logprobs`);
        assert.equal(par[i].text, seq[i].text, `stream ${i} text`);
        assert.equal(par[i].finish, seq[i].finish, `stream ${i} finish_reason`);
        assert.deepEqual(par[i].tokens, seq[i].tokens, `stream ${i} tokens and logprobs`);
    }
    // the 8 prompts are different: so are (most of) the outputs
    assert.ok(new Set(seq.map((s) => s.text)).size >= 4, 'outputs do not depend on the prompt');
});

test('a seeded sampled request replays alone and under load', async () => {
    const bs = await bodies();
    const m = await model();
    const seeded = {
        model: m, messages: [{ role: 'user', content: 'Tell me about the temple.' }], max_tokens: 40,
        temperature: 0.9, top_k: 40, top_p: 0.95, seed: 4242, logprobs: true, top_logprobs: 2,
    };
    const alone = await stream(seeded);
    const again = await stream(seeded);
    assert.deepEqual(again.tokens, alone.tokens, 'seeded replay alone');
    const [res, peak] = await withLoadProbe(() => Promise.all([
        ...bs.slice(0, 3).map((b) => stream(b)), stream(seeded), ...bs.slice(3, 7).map((b) => stream(b)),
    ]));
    assert.ok(peak >= 2, 'no batching seen');
    assert.equal(res[3].text, alone.text);
    assert.deepEqual(res[3].tokens, alone.tokens, 'seeded replay under load');
    // non-streamed, through the client, in parallel with itself
    const [x, y] = await Promise.all([oa.chat.completions.create(seeded), oa.chat.completions.create(seeded)]);
    assert.equal(x.choices[0].message.content, alone.text);
    assert.equal(y.choices[0].message.content, alone.text);
});

test('per-slot prompt caching: /completion prefills only the new tokens', async () => {
    const p1 = 'And it came to pass after these things, that God did tempt Abraham, and said unto him, Abraham: and he said, Behold, here I am.';
    const p2 = `${p1} And he said, Take now thy son, thine only son Isaac, whom thou lovest.`;
    const t1 = (await post('/tokenize', { content: p1 })).json.tokens.length;
    const t2 = (await post('/tokenize', { content: p2 })).json.tokens.length;
    const a = await post('/completion', { prompt: p1, n_predict: 4, temperature: 0 });
    assert.equal(a.status, 200, a.text);
    const b = await post('/completion', { prompt: p2, n_predict: 4, temperature: 0 });
    assert.equal(b.json.id_slot, a.json.id_slot, 'the slot holding the prefix was not chosen');
    assert.ok(b.json.timings.prompt_n <= t2 - t1 + 2,
        `extended prompt prefilled ${b.json.timings.prompt_n} tokens, ${t2 - t1} new of ${t2}`);
    assert.ok(b.json.timings.prompt_n >= 1);
    // the cached and the uncached runs agree
    const c = await post('/completion', { prompt: p2, n_predict: 4, temperature: 0, cache_prompt: false, n_probs: 2 });
    const d = await post('/completion', { prompt: p2, n_predict: 4, temperature: 0, n_probs: 2 });
    assert.ok(d.json.timings.prompt_n <= 2);
    assert.equal(c.json.content, b.json.content);
    assert.deepEqual(d.json.completion_probabilities, c.json.completion_probabilities, 'cached prefix changes logprobs');
});

test('per-slot prompt caching: a chat turn reports cached_tokens', async () => {
    const m = await model();
    const msgs = [{ role: 'user', content: 'Who built the ark, and how long was it?' }];
    const r1 = await oa.chat.completions.create({ model: m, messages: msgs, max_tokens: 12, temperature: 0 });
    const msgs2 = [...msgs, { role: 'assistant', content: r1.choices[0].message.content },
        { role: 'user', content: 'And who went into it?' }];
    const r2 = await oa.chat.completions.create({ model: m, messages: msgs2, max_tokens: 4, temperature: 0 });
    const cached = r2.usage.prompt_tokens_details && r2.usage.prompt_tokens_details.cached_tokens;
    assert.equal(typeof cached, 'number', JSON.stringify(r2.usage));
    assert.ok(cached >= r1.usage.prompt_tokens - 1, `cached ${cached} of the first turn's ${r1.usage.prompt_tokens}`);
    assert.ok(cached < r2.usage.prompt_tokens);
    // a fresh conversation shares only the template's head, if anything
    const r3 = await oa.chat.completions.create({
        model: m, max_tokens: 2, temperature: 0, messages: [{ role: 'user', content: 'Zebras? Quartz! Jumping.' }],
    });
    assert.ok(r3.usage.prompt_tokens_details.cached_tokens < 8, JSON.stringify(r3.usage));
});
