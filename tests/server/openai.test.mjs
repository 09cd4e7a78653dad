// The OpenAI surface through the official openai npm client: chat and text
// completions, streaming, logprobs, stop, logit_bias, response_format, n,
// seeds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, model, post, get, sse, chatText, PROMPTS } from './lib.mjs';

const oa = client();
const USER = [{ role: 'user', content: 'Who was the first king of Israel?' }];

test('GET /v1/models lists the served model', async () => {
    const list = await oa.models.list();
    assert.ok(list.data.length >= 1);
    assert.equal(typeof list.data[0].id, 'string');
    assert.ok(list.data[0].id.length > 0);
    assert.equal(list.data[0].object, 'model');
});

test('chat completion: shape, usage, max_tokens', async () => {
    const m = await model();
    const r = await oa.chat.completions.create({ model: m, messages: USER, max_tokens: 12, temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(typeof r.id, 'string');
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.equal(c.index, 0);
    assert.equal(c.message.role, 'assistant');
    assert.equal(typeof c.message.content, 'string');
    assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
    assert.ok(r.usage.prompt_tokens > 5, JSON.stringify(r.usage));
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12, JSON.stringify(r.usage));
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, 12);
    // the prompt went through the chat template: more tokens than the bare text
    const tk = await post('/tokenize', { content: USER[0].content });
    assert.ok(r.usage.prompt_tokens > tk.json.tokens.length,
        `prompt_tokens ${r.usage.prompt_tokens} vs ${tk.json.tokens.length} for the bare text`);
    // max_completion_tokens is the newer name of the same limit
    const r2 = await oa.chat.completions.create({ model: m, messages: USER, max_completion_tokens: 3, temperature: 0 });
    assert.ok(r2.usage.completion_tokens <= 3, JSON.stringify(r2.usage));
    assert.ok(c.message.content.startsWith(r2.choices[0].message.content) || r2.choices[0].finish_reason === 'stop');
});

test('chat completion: a system message and history change the prompt', async () => {
    const m = await model();
    const a = await oa.chat.completions.create({ model: m, messages: USER, max_tokens: 1, temperature: 0 });
    const b = await oa.chat.completions.create({
        model: m, max_tokens: 1, temperature: 0,
        messages: [{ role: 'system', content: 'You are terse.' }, ...USER],
    });
    assert.ok(b.usage.prompt_tokens > a.usage.prompt_tokens, `${b.usage.prompt_tokens} <= ${a.usage.prompt_tokens}`);
});

test('text completion equals /completion at temperature 0', async () => {
    const m = await model();
    const r = await oa.completions.create({ model: m, prompt: PROMPTS[0], max_tokens: 16, temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.equal(typeof r.choices[0].text, 'string');
    assert.ok(r.choices[0].text.length > 0);
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 16);
    const l = await post('/completion', { prompt: PROMPTS[0], n_predict: 16, temperature: 0 });
    assert.equal(l.status, 200, l.text);
    assert.equal(l.json.content, r.choices[0].text);
    assert.equal(l.json.tokens_predicted, r.usage.completion_tokens);
});

test('text completion: stop strings cut the text before them', async () => {
    const m = await model();
    const full = await oa.completions.create({ model: m, prompt: PROMPTS[0], max_tokens: 24, temperature: 0 });
    const text = full.choices[0].text;
    assert.ok(text.length >= 12, `greedy text too short to pick a stop from: ${JSON.stringify(text)}`);
    // a stop string from the middle of the greedy text
    const at = Math.floor(text.length / 2);
    const stop = text.slice(at, at + 3);
    const cut = text.indexOf(stop);
    const r = await oa.completions.create({ model: m, prompt: PROMPTS[0], max_tokens: 24, temperature: 0, stop: [stop] });
    assert.equal(r.choices[0].text, text.slice(0, cut));
    assert.equal(r.choices[0].finish_reason, 'stop');
});

test('chat streaming: role first, content equals the non-streamed reply, [DONE], include_usage', async () => {
    const m = await model();
    const body = { model: m, messages: USER, max_tokens: 16, temperature: 0 };
    const ref = await oa.chat.completions.create(body);
    // through the client
    const stream = await oa.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    const chunks = [];
    for await (const ch of stream) chunks.push(ch);
    assert.ok(chunks.length >= 2);
    assert.equal(chunks[0].object, 'chat.completion.chunk');
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    for (const ch of chunks.slice(1)) {
        if (ch.choices.length) assert.equal(ch.choices[0].delta.role, undefined, 'role only in the first chunk');
    }
    const text = chunks.map((ch) => (ch.choices.length && ch.choices[0].delta.content) || '').join('');
    assert.equal(text, ref.choices[0].message.content);
    const fin = chunks.filter((ch) => ch.choices.length && ch.choices[0].finish_reason);
    assert.equal(fin.length, 1, 'one chunk carries finish_reason');
    assert.equal(fin[0].choices[0].finish_reason, ref.choices[0].finish_reason);
    const last = chunks[chunks.length - 1];
    assert.deepEqual(last.choices, [], 'the usage chunk has no choices');
    // (cached_tokens may differ: the reference left its prompt in a slot)
    const counts = (u) => [u.prompt_tokens, u.completion_tokens, u.total_tokens];
    assert.deepEqual(counts(last.usage), counts(ref.usage));
    for (const ch of chunks) assert.equal(ch.id, chunks[0].id, 'one id for the whole stream');
    // on the wire: SSE ending in data: [DONE]
    const w = await sse('/v1/chat/completions', { ...body, stream: true });
    assert.equal(w.status, 200);
    assert.match(w.headers.get('content-type'), /^text\/event-stream/);
    assert.equal(w.events[w.events.length - 1], '[DONE]');
    assert.ok(w.raw.trimEnd().endsWith('data: [DONE]'));
    assert.equal(chatText(w.events), ref.choices[0].message.content);
    // without include_usage no chunk carries usage
    assert.ok(w.events.slice(0, -1).every((ev) => !ev.usage), 'usage without include_usage');
});

test('text completion streaming ends in [DONE] and equals the non-streamed text', async () => {
    const m = await model();
    const body = { model: m, prompt: PROMPTS[1], max_tokens: 16, temperature: 0 };
    const ref = await oa.completions.create(body);
    const stream = await oa.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage = null;
    for await (const ch of stream) {
        if (ch.choices.length) text += ch.choices[0].text;
        if (ch.usage) usage = ch.usage;
    }
    assert.equal(text, ref.choices[0].text);
    const counts = (u) => [u.prompt_tokens, u.completion_tokens, u.total_tokens];
    assert.deepEqual(counts(usage), counts(ref.usage));
    const w = await sse('/v1/completions', { ...body, stream: true });
    assert.equal(w.events[w.events.length - 1], '[DONE]');
});

test('chat logprobs and top_logprobs', async () => {
    const m = await model();
    const r = await oa.chat.completions.create({
        model: m, messages: USER, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 3,
    });
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, r.usage.completion_tokens);
    let joined = '';
    for (const t of lp) {
        assert.equal(typeof t.token, 'string');
        assert.ok(t.logprob <= 0 && Number.isFinite(t.logprob), JSON.stringify(t));
        assert.ok(Array.isArray(t.bytes));
        assert.equal(t.top_logprobs.length, 3);
        for (let i = 1; i < 3; i++) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob, 'sorted');
        // greedy: the drawn token is the most likely one
        assert.equal(t.top_logprobs[0].token, t.token);
        assert.equal(t.top_logprobs[0].logprob, t.logprob);
        joined += t.token;
    }
    if (r.choices[0].finish_reason === 'length') assert.equal(joined, r.choices[0].message.content);
    // without logprobs none are reported
    const r2 = await oa.chat.completions.create({ model: m, messages: USER, max_tokens: 4, temperature: 0 });
    assert.ok(r2.choices[0].logprobs == null, JSON.stringify(r2.choices[0].logprobs));
});

test('text completion logprobs (legacy shape)', async () => {
    const m = await model();
    const r = await oa.completions.create({ model: m, prompt: PROMPTS[2], max_tokens: 6, temperature: 0, logprobs: 2 });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, r.usage.completion_tokens);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    assert.equal(lp.top_logprobs.length, lp.tokens.length);
    for (let i = 0; i < lp.tokens.length; i++) {
        assert.ok(lp.token_logprobs[i] <= 0);
        const top = lp.top_logprobs[i];
        assert.equal(Object.keys(top).length <= 2 && Object.keys(top).length >= 1, true, JSON.stringify(top));
        assert.equal(Math.max(...Object.values(top)), lp.token_logprobs[i]);
    }
});

test('logit_bias bans the greedy first token', async () => {
    const m = await model();
    const l = await post('/completion', { prompt: PROMPTS[3], n_predict: 1, temperature: 0, n_probs: 2 });
    assert.equal(l.status, 200, l.text);
    const first = l.json.completion_probabilities[0];
    const id = first.id;
    assert.equal(typeof id, 'number', JSON.stringify(first));
    const r = await oa.completions.create({
        model: m, prompt: PROMPTS[3], max_tokens: 1, temperature: 0, logprobs: 1, logit_bias: { [String(id)]: -100 },
    });
    assert.notEqual(r.choices[0].logprobs.tokens[0], first.token, 'banned token drawn anyway');
    // the second most likely token takes its place
    assert.equal(r.choices[0].logprobs.tokens[0], first.top_logprobs[1].token);
});

test('response_format json_schema: output parses and matches the schema', async () => {
    const m = await model();
    const schema = {
        type: 'object',
        properties: {
            name: { type: 'string', maxLength: 12 },
            age: { type: 'integer', minimum: 0, maximum: 150 },
            tribe: { type: 'string', enum: ['Judah', 'Benjamin', 'Levi'] },
        },
        required: ['name', 'age', 'tribe'],
        additionalProperties: false,
    };
    const r = await oa.chat.completions.create({
        model: m, max_tokens: 120, temperature: 0,
        messages: [{ role: 'user', content: 'Describe King Saul as JSON.' }],
        response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', `did not finish: ${JSON.stringify(c.message.content)}`);
    const v = JSON.parse(c.message.content);
    assert.deepEqual(Object.keys(v).sort(), ['age', 'name', 'tribe']);
    assert.equal(typeof v.name, 'string');
    assert.ok(v.name.length <= 12);
    assert.ok(Number.isInteger(v.age) && v.age >= 0 && v.age <= 150, String(v.age));
    assert.ok(['Judah', 'Benjamin', 'Levi'].includes(v.tribe), v.tribe);
    // seeded sampling under the same schema stays inside it
    for (const seed of [1, 2, 3]) {
        const s = await oa.chat.completions.create({
            model: m, max_tokens: 120, temperature: 1, seed,
            messages: [{ role: 'user', content: 'Describe someone as JSON.' }],
            response_format: { type: 'json_schema', json_schema: { name: 'person', schema } },
        });
        if (s.choices[0].finish_reason !== 'stop') continue;
        const w = JSON.parse(s.choices[0].message.content);
        assert.ok(['Judah', 'Benjamin', 'Levi'].includes(w.tribe), JSON.stringify(w));
        assert.ok(Number.isInteger(w.age));
    }
});

test('response_format json_object: output is a JSON object', async () => {
    const m = await model();
    const r = await oa.chat.completions.create({
        model: m, max_tokens: 200, temperature: 0,
        messages: [{ role: 'user', content: 'Give me a JSON object.' }],
        response_format: { type: 'json_object' },
    });
    const c = r.choices[0];
    if (c.finish_reason === 'stop') {
        const v = JSON.parse(c.message.content);
        assert.equal(typeof v, 'object');
        assert.ok(v !== null && !Array.isArray(v));
    } else {
        // cut by max_tokens: still the start of an object
        assert.match(c.message.content, /^\s*\{/);
    }
});

test('n=2: two choices; identical at temperature 0', async () => {
    const m = await model();
    const r = await oa.chat.completions.create({ model: m, messages: USER, max_tokens: 8, temperature: 0, n: 2 });
    assert.equal(r.choices.length, 2);
    assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1]);
    assert.equal(r.choices[0].message.content, r.choices[1].message.content);
    const t = await oa.completions.create({ model: m, prompt: PROMPTS[4], max_tokens: 8, temperature: 0, n: 2 });
    assert.equal(t.choices.length, 2);
    assert.equal(t.choices[0].text, t.choices[1].text);
    // usage counts both completions
    const one = await oa.completions.create({ model: m, prompt: PROMPTS[4], max_tokens: 8, temperature: 0 });
    assert.equal(t.usage.completion_tokens, 2 * one.usage.completion_tokens);
    // sampled with a seed, the two choices are two different draws
    const s = await oa.completions.create({ model: m, prompt: PROMPTS[4], max_tokens: 24, temperature: 1.5, n: 2, seed: 7 });
    assert.equal(s.choices.length, 2);
    assert.notEqual(s.choices[0].text, s.choices[1].text, 'n=2 drew the same text twice');
    // streamed n=2 carries both indexes
    const w = await sse('/v1/chat/completions', { model: m, messages: USER, max_tokens: 4, temperature: 0, n: 2, stream: true });
    const idx = new Set(w.events.filter((e) => e !== '[DONE]' && e.choices.length).map((e) => e.choices[0].index));
    assert.deepEqual([...idx].sort(), [0, 1]);
});

test('seed replay: a seeded sampled request replays; other seeds differ', async () => {
    const m = await model();
    const body = { model: m, messages: USER, max_tokens: 24, temperature: 1.0, top_p: 1, seed: 1234, logprobs: true };
    const a = await oa.chat.completions.create(body);
    const b = await oa.chat.completions.create(body);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    assert.deepEqual(a.choices[0].logprobs, b.choices[0].logprobs);
    const others = [];
    for (const seed of [1, 2, 3]) {
        const o = await oa.chat.completions.create({ ...body, seed });
        others.push(o.choices[0].message.content);
    }
    assert.ok(others.some((t) => t !== a.choices[0].message.content), 'the seed changes nothing');
    // text completions too
    const tb = { model: m, prompt: PROMPTS[5], max_tokens: 24, temperature: 0.9, seed: 99 };
    const x = await oa.completions.create(tb);
    const y = await oa.completions.create(tb);
    assert.equal(x.choices[0].text, y.choices[0].text);
});

test('sampler fields: penalties and llama.cpp extras are accepted and act', async () => {
    const m = await model();
    const base = { model: m, prompt: PROMPTS[0], max_tokens: 48, temperature: 0 };
    const plain = await oa.completions.create(base);
    const pen = await oa.completions.create({ ...base, frequency_penalty: 2.0, presence_penalty: 2.0 });
    assert.notEqual(pen.choices[0].text, plain.choices[0].text, 'penalties changed nothing');
    // llama.cpp's extra sampler fields through the OpenAI route
    const r = await post('/v1/completions', { ...base, top_k: 1, min_p: 0.05, repeat_penalty: 1.0, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    // top_k 1 is greedy; ignore_eos only lets it run past an end of generation
    assert.ok(r.json.choices[0].text.startsWith(plain.choices[0].text),
        `${JSON.stringify(r.json.choices[0].text)} vs ${JSON.stringify(plain.choices[0].text)}`);
    assert.equal(r.json.usage.completion_tokens, 48, 'ignore_eos: the full max_tokens');
});
