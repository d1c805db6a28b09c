#!/usr/bin/env bash
# rootspec-serve with real clients (`make test-serve`, run by .ci/run): the openai Python
# package, installed into a venv of its own under build/, drives tests/serve_test.py; curl
# checks the raw server-sent events. Needs build/rootspec-serve, rootspec-serve-san (the
# malformed-request flood runs under ASan+UBSan), rootspec-target and rootspec-draft, and
# the default model. Ends with `serve: N passed, M failed`; exits 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
venv=build/serve-venv
for b in rootspec-serve rootspec-serve-san rootspec-target rootspec-draft; do
  [ -x "build/$b" ] || { echo "serve_test: build/$b missing (make test-serve builds it)" >&2; exit 1; }
done
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import openai' 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'openai>=1.0,<3'
fi

# curl: the SSE frames themselves, and the stream's end.
curl_fail=0
log=$(mktemp)
build/rootspec-serve --model "$MODEL" --port 0 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 600); do grep -q 'listening on' "$log" && break; sleep 0.1; done
port=$(grep -o '127\.0\.0\.1:[0-9]*' "$log" | head -1 | cut -d: -f2)
sse=$(curl -sN --max-time 60 "http://127.0.0.1:$port/v1/chat/completions" \
        -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"stream":true,"temperature":0}')
frames=$(printf '%s\n' "$sse" | grep -c '^data: ' || true)
if [ "$(printf '%s\n' "$sse" | grep '^data: ' | tail -1)" != "data: [DONE]" ] || [ "$frames" -lt 4 ] ||
   printf '%s\n' "$sse" | grep -v '^data: ' | grep -q .; then
  echo "FAIL  curl SSE: expected data: frames ending in data: [DONE], got:"; printf '%s\n' "$sse"
  curl_fail=1
else
  echo "ok    curl SSE: $frames data: frames ending in [DONE]"
fi
# curl: /tokenize and /detokenize round trip (llama-server's shapes).
toks=$(curl -s --max-time 30 "http://127.0.0.1:$port/tokenize" -H 'Content-Type: application/json' \
         -d '{"content":"The capital of France is"}' | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["tokens"]))' || true)
back=$(curl -s --max-time 30 "http://127.0.0.1:$port/detokenize" -H 'Content-Type: application/json' \
         -d "{\"tokens\":${toks:-null}}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["content"])' || true)
if [ "$back" != "The capital of France is" ] || [ "${toks:0:1}" != "[" ]; then
  echo "FAIL  curl /tokenize then /detokenize: tokens '$toks', text back '$back'"
  curl_fail=1
else
  echo "ok    curl /tokenize then /detokenize: $toks"
fi
# curl: completions echo with logprobs (the first prompt token's null), and n=3 streamed
# (every choice index, each finished, one [DONE]).
echo_ok=$(curl -s --max-time 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt":"The capital of France is","max_tokens":3,"temperature":0,"echo":true,"logprobs":2}' |
  python3 -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; l=c["logprobs"]
print(int(c["text"].startswith("The capital of France is") and l["token_logprobs"][0] is None and
          l["top_logprobs"][0] is None and all(x is not None for x in l["token_logprobs"][1:]) and
          "".join(l["tokens"]) == c["text"]))' || true)
if [ "$echo_ok" != 1 ]; then echo "FAIL  curl echo with logprobs"; curl_fail=1
else echo "ok    curl echo with logprobs: the prompt's text and tokens first, the first logprob null"; fi
nsse=$(curl -sN --max-time 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"n":3,"seed":2,"temperature":0.8,"stream":true}')
n_ok=$(printf '%s\n' "$nsse" | python3 -c 'import json,sys
f=[l[6:] for l in sys.stdin.read().splitlines() if l.startswith("data: ")]
ch=[c for x in f[:-1] for c in json.loads(x)["choices"]]
print(int(f[-1] == "[DONE]" and {c["index"] for c in ch} == {0, 1, 2} and
          sorted(c["index"] for c in ch if c["finish_reason"]) == [0, 1, 2]))' || true)
if [ "$n_ok" != 1 ]; then echo "FAIL  curl n=3 streamed:"; printf '%s\n' "$nsse"; curl_fail=1
else echo "ok    curl n=3 streamed: chunks of choices 0, 1 and 2, each finished, then [DONE]"; fi
kill "$pid"; wait "$pid" || true
trap - EXIT
rm -f "$log"

py_rc=0
BUILD=build MODEL="$MODEL" "$venv/bin/python" tests/serve_test.py || py_rc=$?
if [ "$curl_fail" -ne 0 ]; then echo "serve: a curl check failed"; exit 1; fi
exit "$py_rc"
