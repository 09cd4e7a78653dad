#!/bin/bash
# Quick end-to-end checks of `muser serve` with curl and the shipped model:
# the routes answer in their shapes, client mistakes get 4xx with an
# OpenAI error object naming the field, the API key and the loopback rule
# hold, a client that hangs up frees its slot, SIGTERM exits 0; the
# --prompt-cache store serves a second server process. The full
# suite (openai client, malformed corpus, browser) lives in tests/server/.
set -u
source "$(dirname "$0")/lib_cli.sh" serve
CURL=(curl --noproxy 127.0.0.1 -s -S -m 60)

expect_fail "without an API key" "$M" serve --host 0.0.0.0 --port 0
expect_fail "go together" "$M" serve --port 0 --ssl-cert-file /nonexistent
expect_fail "unknown option" "$M" serve --bogus

"$M" serve --port 0 -np 2 -c 1024 --api-key k1 >"$T/log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q listening "$T/log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
port=$(grep -o ':[0-9][0-9]*/' "$T/log" | tr -d ':/')
B="http://127.0.0.1:$port"
A=(-H "Authorization: Bearer k1")
J=(-H "Content-Type: application/json")

# status and body of one request: code goes to $T/code, body to $T/body
req() { "${CURL[@]}" -o "$T/body" -w '%{http_code}' "$@" >"$T/code"; }
is() { # is CODE PYTHON-EXPR-ON-d
    local want="$1" expr="$2"
    if [ "$(cat "$T/code")" != "$want" ]; then echo "FAILED: status $(cat "$T/code") != $want: $(head -c 300 "$T/body")" >&2; fail=1; return; fi
    check $PY -c "import json; d=json.load(open('$T/body')); assert $expr, d"
}

req "$B/health"; is 200 "d=={'status':'ok'}"
req "$B/v1/models"; is 401 "d['error']['type']=='authentication_error'"
req "${A[@]}" "$B/v1/models"; is 200 "d['data'][0]['object']=='model'"
req "${A[@]}" -X POST "$B/v1/models"; is 405 "d['error']['code']==405"
req "${A[@]}" "$B/nowhere"; is 404 "d['error']['type']=='not_found_error'"
req "${A[@]}" -d '{}' "$B/v1/chat/completions"; is 415 "d['error']['param']=='Content-Type'"
req "${A[@]}" "${J[@]}" -d '{"messages":[' "$B/v1/chat/completions"; is 400 "'line 1' in d['error']['message']"
req "${A[@]}" "${J[@]}" -d '{"messages":[{"role":"user","content":"hi"}],"bogus":1}' "$B/v1/chat/completions"
is 400 "d['error']['param']=='bogus'"
req "${A[@]}" "${J[@]}" -d '{"messages":[{"role":"user","content":"hi"}],"temperature":"x"}' "$B/v1/chat/completions"
is 400 "d['error']['param']=='temperature'"
req "${A[@]}" "${J[@]}" -d '{"prompt":"x","grammar":"root ::= ("}' "$B/completion"; is 400 "d['error']['param']=='grammar'"
head -c 9000000 /dev/zero | tr '\0' ' ' >"$T/big"
req "${A[@]}" "${J[@]}" --data-binary @"$T/big" "$B/v1/completions"; is 413 "d['error']['code']==413"

req "${A[@]}" "${J[@]}" -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0,"logprobs":true,"top_logprobs":2}' "$B/v1/chat/completions"
is 200 "d['object']=='chat.completion' and d['choices'][0]['finish_reason'] in ('stop','length') and d['usage']['total_tokens']==d['usage']['prompt_tokens']+d['usage']['completion_tokens'] and len(d['choices'][0]['logprobs']['content'][0]['top_logprobs'])==2"
cp "$T/body" "$T/first.json"
req "${A[@]}" "${J[@]}" -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0,"logprobs":true,"top_logprobs":2}' "$B/v1/chat/completions"
check $PY -c "import json; a=json.load(open('$T/first.json')); b=json.load(open('$T/body')); assert a['choices'][0]['message']==b['choices'][0]['message'] and b['usage']['prompt_tokens_details']['cached_tokens']>0"

"${CURL[@]}" -N "${A[@]}" "${J[@]}" -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}' "$B/v1/chat/completions" >"$T/sse"
check $PY - "$T/sse" <<'PY'
import json, sys
ev = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert ev[-1] == "[DONE]", ev[-1]
ch = [json.loads(e) for e in ev[:-1]]
assert ch[0]["choices"][0]["delta"]["role"] == "assistant"
assert ch[-1]["choices"] == [] and ch[-1]["usage"]["completion_tokens"] >= 1
assert ch[-2]["choices"][0]["finish_reason"] in ("stop", "length")
PY

req "${A[@]}" "${J[@]}" -d '{"prompt":"And it came to pass","max_tokens":3,"n":2,"temperature":0,"logprobs":1}' "$B/v1/completions"
is 200 "d['object']=='text_completion' and len(d['choices'])==2 and d['choices'][0]['text']==d['choices'][1]['text'] and len(d['choices'][0]['logprobs']['tokens'])==3"
req "${A[@]}" "${J[@]}" -d '{"prompt":"And it came to pass","n_predict":4,"temperature":0,"n_probs":2}' "$B/completion"
is 200 "d['stop'] and d['tokens_predicted']==4 and d['stop_type']=='limit' and 'predicted_ms' in d['timings'] and len(d['completion_probabilities'])==4"
req "${A[@]}" "${J[@]}" -d '{"messages":[{"role":"user","content":"JSON please"}],"max_tokens":120,"seed":3,"response_format":{"type":"json_object"}}' "$B/v1/chat/completions"
is 200 "d['choices'][0]['finish_reason']!='stop' or isinstance(json.loads(d['choices'][0]['message']['content']), dict)"
req "${A[@]}" "${J[@]}" -d '{"content":"Hello world","with_pieces":true}' "$B/tokenize"; is 200 "d['tokens'][0]['piece']=='He'"
req "${A[@]}" "${J[@]}" -d '{"tokens":[654,282,111,1047]}' "$B/detokenize"; is 200 "d['content']=='Hello world'"
req "${A[@]}" "${J[@]}" -d '{"messages":[{"role":"user","content":"Hi"}]}' "$B/apply-template"; is 200 "'Hi' in d['prompt']"
req "${A[@]}" "$B/props"; is 200 "d['total_slots']==2 and 'chat_template' in d"
req "${A[@]}" -X POST "$B/slots/0?action=erase"; is 200 "d['id_slot']==0"
req "${A[@]}" -X POST "$B/slots/0?action=save"; is 501 "d['error']['param']=='action'"
req "$B/"; check grep -q 'id="messages"' "$T/body"
"${CURL[@]}" "${A[@]}" "$B/metrics" >"$T/metrics"
for name in vllm:num_requests_running vllm:num_requests_waiting vllm:kv_cache_usage_perc vllm:cache_config_info \
    'vllm:time_to_first_token_seconds_bucket{model_name="glimmer-tiny-q4_k_xl.gguf",le="+Inf"}' muser_requests_total; do
    check grep -qF "$name" "$T/metrics"
done

# a client that hangs up frees its slot
"${CURL[@]}" "${A[@]}" "${J[@]}" -m 1 -d '{"prompt":"Once","n_predict":1000,"ignore_eos":true}' "$B/completion" >/dev/null 2>&1
sleep 0.5
req "${A[@]}" "$B/slots"; is 200 "not any(s['is_processing'] for s in d)"

kill -TERM $pid
wait $pid
check [ $? -eq 0 ]

# --prompt-cache: a second server process on the same store answers a repeated
# prompt with the same tokens without prefilling it (an exact hit: the stored
# logits row), and a prompt sharing its first 256-token block prefills only
# the rest, with the tokens of a full prefill (cache_prompt false)
start() { # start LOG ARGS...: a server on a free port; B is its URL
    local log="$1"; shift
    "$M" serve --port 0 -np 1 -c 1024 -t 2 "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q listening "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    B="http://127.0.0.1:$(grep -o ':[0-9][0-9]*/' "$log" | tr -d ':/')"
}
stop() { kill -TERM $pid; wait $pid; check [ $? -eq 0 ]; }
"$PY" -c "
import json
base = 'In the beginning God created the heaven and the earth. And the earth was without form, and void. ' * 14
for i, tail in enumerate(['And God said, Let there be light', 'And the evening and the morning were']):
    json.dump({'prompt': base + tail, 'n_predict': 12, 'temperature': 0}, open('$T/pc%d.json' % (i + 1), 'w'))
d = json.load(open('$T/pc2.json')); d['cache_prompt'] = False; json.dump(d, open('$T/pc2full.json', 'w'))"
start "$T/pc-a.log" --prompt-cache "$T/pcs" --compress zstd
req "${J[@]}" -d @"$T/pc1.json" "$B/completion"; is 200 "d['timings']['cache_n']==0 and d['tokens_evaluated']>256"
cp "$T/body" "$T/pc-a.json"
stop    # the writer thread publishes what it has queued before the server exits
check test "$(ls "$T/pcs"/*.kvpack | wc -l)" -eq 2   # the prompt's 256-token block and the whole prompt
check "$M" kvpack ls --store "$T/pcs" >"$T/pc-ls.txt"
check grep -q "zstd: kv" "$T/pc-ls.txt"
# whole requests on the greedy chain (a lone greedy request's bursts): its last row stays on the
# backend, and the slot save below must still find the logits row of the slot's last token
export MUSER_CHAIN_BURST=64
start "$T/pc-b.log" --prompt-cache "$T/pcs" --slot-save-path "$T/slots"
unset MUSER_CHAIN_BURST
req "${J[@]}" -d @"$T/pc1.json" "$B/completion"
is 200 "d['timings']['prompt_n']==0 and d['timings']['cache_n']==d['tokens_evaluated'] and d['tokens_cached']==d['tokens_evaluated']"
check "$PY" -c "import json; a=json.load(open('$T/pc-a.json')); b=json.load(open('$T/body')); assert a['content']==b['content'] and len(a['content'])>0, (a['content'], b['content'])"
req -X POST "$B/slots/0?action=erase"; is 200 "d['id_slot']==0"   # the slot's own prefix would serve it
req "${J[@]}" -d @"$T/pc2.json" "$B/completion"
is 200 "d['timings']['cache_n']==256 and d['timings']['prompt_n']==d['tokens_evaluated']-256"
cp "$T/body" "$T/pc-delta.json"
req "${J[@]}" -d @"$T/pc2full.json" "$B/completion"; is 200 "d['timings']['cache_n']==0"
check "$PY" -c "import json; a=json.load(open('$T/pc-delta.json')); b=json.load(open('$T/body')); assert a['content']==b['content'], (a['content'], b['content'])"
"${CURL[@]}" "$B/metrics" >"$T/pc-metrics"
check grep -q '^muser_prompt_cache_store_hits_total{model_name="glimmer-tiny-q4_k_xl.gguf"} 2$' "$T/pc-metrics"
check grep -q '^muser_prompt_cache_store_tokens_total{.*} [1-9]' "$T/pc-metrics"
check grep -q '^muser_prompt_cache_store_errors_total{.*} 0$' "$T/pc-metrics"
req "${J[@]}" -d '{"filename":"plain.bin"}' -X POST "$B/slots/0?action=save"; is 200 "d['n_saved']>256"
stop
# with a DFlash assistant the packs carry its context: the restored slot speculates on
DR=(--draft "$MUSER_SOURCE_DIR/models/glimmer-tiny-dflash-q4_k_xl.gguf" --spec-always --prompt-cache "$T/pcd")
start "$T/pcd-a.log" "${DR[@]}"
req "${J[@]}" -d @"$T/pc1.json" "$B/completion"; is 200 "d['timings']['cache_n']==0"
cp "$T/body" "$T/pcd-a.json"
stop
check "$M" kvpack ls --store "$T/pcd" >"$T/pcd-ls.txt"
check grep -q "DFlash context" "$T/pcd-ls.txt"
start "$T/pcd-b.log" "${DR[@]}" --spec-tree --slot-save-path "$T/slots"
req "${J[@]}" -d @"$T/pc1.json" "$B/completion"; is 200 "d['timings']['prompt_n']==0"
cp "$T/body" "$T/pcd-b.json"
check "$PY" -c "import json; a=json.load(open('$T/pcd-a.json')); b=json.load(open('$T/body')); assert a['content']==b['content'] and a['content']==json.load(open('$T/pc-a.json'))['content']"
"${CURL[@]}" "$B/metrics" >"$T/pcd-metrics"
check grep -q '^muser_spec_drafted_tokens_total{.*} [1-9]' "$T/pcd-metrics"
# slot files under an assistant: a slot that speculated saves (its last verify row is its logits
# row) and restores; a file without the assistant's context is refused naming the field
req "${J[@]}" -d '{"filename":"spec.bin"}' -X POST "$B/slots/0?action=save"; is 200 "d['n_saved']>256"
req "${J[@]}" -d '{"filename":"plain.bin"}' -X POST "$B/slots/0?action=restore"
is 400 "d['error']['param']=='filename' and 'assistant_sha256' in d['error']['message']"
req -X POST "$B/slots/0?action=erase"; is 200 "d['id_slot']==0"
req "${J[@]}" -d '{"filename":"spec.bin"}' -X POST "$B/slots/0?action=restore"; is 200 "d['n_restored']>256"
stop
exit $fail
