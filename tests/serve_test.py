"""rootspec-serve against real clients (run by tests/serve_test.sh, which makes the venv).

The openai package drives chat and text completions, streamed and whole; raw sockets send
what no well-behaved client would. Every check compares with an independent reference:
rootspec-target's own T=0 text, the same request unstreamed, or the HTTP status the API
documents. Prints `serve: N passed, M failed` and exits 1 on any failure.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import openai

BUILD = os.environ.get("BUILD", "build")
MODEL = os.environ.get("MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
NAME = os.path.basename(MODEL)
PROMPT = "What is the capital of France?"
results = {"passed": 0, "failed": 0}


def check(name, cond, detail=""):
    if cond:
        results["passed"] += 1
        print(f"ok    {name}")
    else:
        results["failed"] += 1
        print(f"FAIL  {name} {detail}")


class Server:
    """A rootspec-serve on a free port; its stderr is kept for the ASan check."""

    def __init__(self, *args, binary="rootspec-serve", model=MODEL):
        self.proc = subprocess.Popen([f"{BUILD}/{binary}", "--model", model, "--port", "0", *args],
                                     stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.port = None
        deadline = time.time() + 120
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line or time.time() > deadline:
                raise RuntimeError(f"rootspec-serve did not start: {''.join(self.lines)}")
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                                    max_retries=0, timeout=120)

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def raw(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def metric(self, name):
        _, text = self.raw("GET", "/metrics")
        m = re.search(rf"^{re.escape(name)} (\S+)$", text.decode(), re.M)
        return float(m.group(1)) if m else None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        self.reader.join(timeout=5)
        return rc


def target_text(*args):
    out = subprocess.run([f"{BUILD}/rootspec-target", "--model", MODEL, *args],
                         capture_output=True, text=True, check=True).stdout
    return out[:-1] if out.endswith("\n") else out


def chat(s, content=PROMPT, **kw):
    return s.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": content}], **kw)


def chat_stream(s, **kw):
    parts, finish, usage, roles = [], None, None, []
    for ch in chat(s, stream=True, **kw):
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                parts.append(c.delta.content)
            finish = c.finish_reason or finish
    return "".join(parts), finish, usage, roles


# ---- the AR server ----------------------------------------------------------------------

def test_chat(s, ref):
    r = chat(s, max_tokens=24, temperature=0)
    check("chat T=0 text equals rootspec-target's", r.choices[0].message.content == ref,
          f"{r.choices[0].message.content!r} vs {ref!r}")
    check("chat finish_reason length and usage", r.choices[0].finish_reason == "length" and
          r.usage.completion_tokens == 24 and r.usage.prompt_tokens > 0, str(r.usage))
    text, finish, usage, roles = chat_stream(s, max_tokens=24, temperature=0,
                                             stream_options={"include_usage": True})
    check("chat stream equals the whole answer", text == ref, f"{text!r}")
    check("chat stream: role first, finish, usage", roles == ["assistant"] and finish == "length"
          and usage and usage.completion_tokens == 24, f"{roles} {finish} {usage}")


def test_conversation(s):
    """A system turn and an earlier exchange, through the model's ChatML template: the same
    T=0 text as a completion of the prompt ChatML spells out (written here, not by the
    server); an assistant-last conversation is refused."""
    msgs = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"}]
    spelled = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    spelled += "<|im_start|>assistant\n"
    r = s.client.chat.completions.create(model=NAME, messages=msgs, max_tokens=16, temperature=0)
    c = s.client.completions.create(model=NAME, prompt=spelled, max_tokens=16, temperature=0)
    check("a 4-turn conversation (system, assistant turns) equals its spelled-out prompt",
          r.choices[0].message.content == c.choices[0].text and c.choices[0].text,
          f"{r.choices[0].message.content!r} vs {c.choices[0].text!r}")
    try:
        s.client.chat.completions.create(model=NAME, messages=msgs[:3], max_tokens=4)
        check("a conversation ending with the assistant: 400", False)
    except openai.BadRequestError as e:
        check("a conversation ending with the assistant: 400", "last message" in str(e.body), str(e.body))


def test_completions(s):
    ref = target_text("--prompt", "The capital of France is", "--max-new", "16")
    r = s.client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=16, temperature=0)
    check("completion T=0 text equals rootspec-target's", r.choices[0].text == ref, f"{r.choices[0].text!r} vs {ref!r}")
    parts = [c.choices[0].text for c in s.client.completions.create(
        model=NAME, prompt="The capital of France is", max_tokens=16, temperature=0, stream=True) if c.choices]
    check("completion stream equals the whole answer", "".join(parts) == ref, f"{parts}")


def test_stop(s, ref):
    words = ref.split(" ")
    stop = " " + words[len(words) // 2] if len(words) > 2 else ref[len(ref) // 2:]
    want = ref[:ref.index(stop)]
    r = chat(s, max_tokens=24, temperature=0, stop=[stop, "\u0001never"])
    check("stop string cuts the text before it", r.choices[0].message.content == want and
          r.choices[0].finish_reason == "stop", f"{r.choices[0].message.content!r} vs {want!r} ({stop!r})")
    text, finish, _, _ = chat_stream(s, max_tokens=24, temperature=0, stop=stop)
    check("stop string while streaming (partial match held back)", text == want and finish == "stop", f"{text!r}")


def test_models_health(s):
    ids = [m.id for m in s.client.models.list()]
    check("GET /v1/models lists the model", ids == [NAME], str(ids))
    st, body = s.raw("GET", "/health")
    check("GET /health", st == 200 and json.loads(body)["status"] == "ok")


def test_concurrent(s, ref):
    out = [None] * 8

    def one(i):
        try:
            out[i] = chat(s, max_tokens=6, temperature=0).choices[0].message.content
        except Exception as e:  # noqa: BLE001 - reported below
            out[i] = e
    ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    ok = all(isinstance(o, str) and ref.startswith(o) and o for o in out)
    check("8 concurrent clients all served, same T=0 text", ok, str(out))


def test_disconnect(s):
    cancelled0 = s.metric('rootspec_decodes_finished_total{reason="cancelled"}')
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    body = json.dumps({"messages": [{"role": "user", "content": "Write a very long story."}],
                       "max_tokens": 1500, "stream": True, "temperature": 0})
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    r.fp.readline()
    r.fp.readline()
    r.fp.readline()
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    t0 = time.time()
    ans = chat(s, max_tokens=4, temperature=0)
    dt = time.time() - t0
    check("a disconnect mid-stream frees the server for the next request",
          ans.choices[0].finish_reason == "length" and dt < 10, f"{dt:.1f} s")
    time.sleep(0.3)
    check("the disconnected decode is counted as cancelled",
          s.metric('rootspec_decodes_finished_total{reason="cancelled"}') == cancelled0 + 1)


def test_errors(s):
    try:
        s.client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        check("unknown model: 404", False)
    except openai.NotFoundError as e:
        check("unknown model: 404 with an error object", e.body and e.body.get("code") == "model_not_found", str(e.body))
    try:
        chat(s, max_tokens=4, top_p=1.5)
        check("top_p 1.5: 400", False)
    except openai.BadRequestError as e:
        check("top_p 1.5: 400 naming top_p", "top_p" in e.body.get("message", ""), str(e.body))
    a, b = (chat(s, max_tokens=12, temperature=0.7, top_p=0.9, seed=7, extra_body={"top_k": 40, "min_p": 0.05})
            .choices[0].message.content for _ in range(2))
    check("sampling with a seed: the same text twice", a == b and a, f"{a!r} {b!r}")
    st, body = s.raw("POST", "/v1/completions", body=b"x" * (2 << 20))
    check("a body over --max-body: 413", st == 413 and "error" in json.loads(body), f"{st}")
    try:
        s.client.completions.create(model=NAME, prompt="hi " * 3000, max_tokens=4)
        check("a prompt over the context: 400", False)
    except openai.BadRequestError as e:
        check("a prompt over the context: 400 context_length_exceeded", e.body.get("code") == "context_length_exceeded", str(e.body))


def test_queue_full():
    # --timeout 1: the waiting request sits on its connection longer than the idle timeout
    s = Server("--queue", "1", "--timeout", "1")
    statuses = []

    def one():  # long enough that all four arrive while the first decodes, even on a busy CPU
        try:
            chat(s, max_tokens=160, temperature=0)
            statuses.append(200)
        except openai.RateLimitError:
            statuses.append(429)
        except Exception as e:  # noqa: BLE001
            statuses.append(str(e))
    ts = [threading.Thread(target=one) for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    check("queue full: 429 (one decoding, one waiting, the rest refused)",
          sorted(statuses) == [200, 200, 429, 429], str(statuses))
    check("429s are counted", s.metric('rootspec_requests_total{code="429"}') == 2)
    s.stop()


# ---- speculative decoding ---------------------------------------------------------------

def test_speculative(ref):
    s = Server("--decoder", "rootdraw", "--budget", "16")
    r = chat(s, max_tokens=24, temperature=0)
    check("rootdraw (in-process drafter) T=0 text equals AR's", r.choices[0].message.content == ref,
          f"{r.choices[0].message.content!r}")
    r = chat(s, max_tokens=24, temperature=0, extra_body={"rootspec": {"decoder": "ar"}})
    check("per-request decoder through the extension object", r.choices[0].message.content == ref)
    rounds = s.metric("rootspec_rounds_total")
    check("tokens per round counted", rounds is not None and 0 < rounds < 48, f"{rounds}")
    s.stop()


def test_drafter_failure():
    sock = tempfile.mktemp(prefix="rs-serve-", suffix=".sock")
    ep = f"ipc://{sock}"
    ref = target_text("--prompt", "Count from one to fifty in words.", "--chat", "--max-new", "160")
    d = subprocess.Popen([f"{BUILD}/rootspec-draft", "--model", MODEL, "--draft-layers", "0-5", "--bind", ep],
                         stderr=subprocess.DEVNULL)
    s = Server("--decoder", "rootdraw", "--budget", "8", "--draft-endpoint", ep, "--draft-timeout-ms", "1500")
    parts, killed = [], False
    for ch in chat(s, content="Count from one to fifty in words.", max_tokens=160, temperature=0, stream=True):
        for c in ch.choices:
            parts.append(c.delta.content or "")
        if not killed and len("".join(parts)) > 10:
            d.kill()
            killed = True
    d.wait()
    check("drafter killed mid-request: the request completes with AR's text", "".join(parts) == ref,
          f"{''.join(parts)!r} vs {ref!r}")
    check("the fallback is counted", s.metric("rootspec_drafter_fallbacks_total") == 1)
    s.stop()
    if os.path.exists(sock):
        os.unlink(sock)


# ---- malformed requests under ASan ------------------------------------------------------

def send_raw(port, data, read=True):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(data)
            if read:
                c.shutdown(socket.SHUT_WR)
                return c.recv(65536)
    except OSError:
        return b""
    return b""


def post(path, body, ctype="application/json"):
    if isinstance(body, str):
        body = body.encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


BAD_BODIES = [
    "", "{", "[]", "null", "42", '"x"', '{"prompt": 5}', '{"prompt": []}', '{"prompt": [-1]}',
    '{"prompt": [1.5]}', '{"prompt": [99999999]}', '{"prompt": {"a": 1}}', '{"messages": "x"}',
    '{"messages": []}', '{"messages": [{"role": "user"}]}', '{"messages": [{"role": 1, "content": "x"}]}',
    '{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
    '{"prompt": [1], "max_tokens": "3"}', '{"prompt": [1], "max_tokens": -1}', '{"prompt": [1], "max_tokens": 1e30}',
    '{"prompt": [1], "stream": "yes"}', '{"prompt": [1], "stop": 3}', '{"prompt": [1], "stop": ["", "a"]}',
    '{"prompt": [1], "stop": ["a","b","c","d","e"]}', '{"prompt": [1], "temperature": "hot"}',
    '{"prompt": [1], "temperature": -1}', '{"prompt": [1], "top_p": 1.5}', '{"prompt": [1], "min_p": 2}',
    '{"prompt": [1], "n": 2}', '{"prompt": [1], "seed": "s"}', '{"prompt": [1], "rootspec": 1}',
    '{"prompt": [1], "rootspec": {"decoder": "oracle"}}', '{"prompt": [1], "rootspec": {"budget": 0}}',
    '{"prompt": [1], "rootspec": {"decoder": "rootdraw"}}', '{"prompt": [1], "stream_options": 1}',
    '{"model": 7, "prompt": [1]}', '{"prompt": "text but no tokenizer"}', "[" * 5000 + "]" * 5000,
    '{"prompt": "\udcff"}'.encode("utf-8", "surrogatepass").decode("latin-1"), "\x00\xff\xfe" * 100,
]


def test_flood():
    s = Server("--max-body", "65536", binary="rootspec-serve-san", model="random:tiny")
    statuses = []
    for i, b in enumerate(BAD_BODIES):
        path = "/v1/completions" if i % 2 == 0 else "/v1/chat/completions"
        r = send_raw(s.port, post(path, b.encode("latin-1") if isinstance(b, str) else b))
        statuses.append(int(r.split(b" ")[1]) if r.startswith(b"HTTP/1.1 ") else 0)
    check("malformed bodies: every one a 4xx with an error object", all(400 <= x < 500 for x in statuses),
          str(list(zip(statuses, range(len(statuses))))))
    junk = [b"GARBAGE\r\n\r\n", b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x00\xa5",
            b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
            b"8000\r\n" + b"a" * 0x8000 + b"\r\n" + b"8000\r\n" + b"a" * 0x8000 + b"\r\n" + b"10\r\n" + b"b" * 16 +
            b"\r\n0\r\n\r\n", b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
            b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 5000 + b"\r\n"]
    for j in junk:
        send_raw(s.port, j)
    st, _ = s.raw("DELETE", "/v1/models")
    st2, _ = s.raw("GET", "/v1/nothing")
    st3, body = s.raw("POST", "/v1/completions", body=b"{\"prompt\": [1, 2, 3], \"max_tokens\": 4}")
    check("unknown route 404, wrong method 405", st == 405 and st2 == 404, f"{st} {st2}")
    check("a good request after the flood (ASan build)", st3 == 200 and
          json.loads(body)["usage"]["completion_tokens"] == 4, f"{st3} {body[:200]}")
    half = [threading.Thread(target=send_raw, args=(s.port, post("/v1/completions", '{"prompt":[1],"max_tokens":200,"stream":true}'), False))
            for _ in range(8)]
    [t.start() for t in half]
    [t.join() for t in half]
    rc = s.stop()
    log = "".join(s.lines)
    check("the ASan build stops cleanly, no sanitizer report",
          rc == 0 and "Sanitizer" not in log and "runtime error" not in log, f"rc={rc}\n{log[-3000:]}")


# ---- --parallel: continuous batching --------------------------------------------------

BATCH_PROMPTS = ["What is the capital of France?", "Name three colours.",
                 "Explain in two sentences why the sky is blue.", "Count from one to ten.",
                 "Write a haiku about the sea.", "What is 12 times 7?",
                 "Give me a short recipe for pancakes with eggs, flour and milk, step by step.",
                 "Translate 'good morning' into Spanish and German.", "Who wrote Hamlet?",
                 "List four planets of the solar system.", "What does a CPU do?",
                 "Summarize the plot of Cinderella in one sentence."]


def stream_raw(port, content, max_tokens, extra=None, drop_after=None):
    """A streamed chat completion over a raw socket: (text, finish_reason); with drop_after,
    the connection is cut after that many data frames and (None, None) comes back."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": True, "temperature": 0}
    body.update(extra or {})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return f"HTTP {r.status}", None
    parts, finish, frames = [], None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        frames += 1
        if drop_after is not None and frames >= drop_after:
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
            return None, None
        for ch in json.loads(line[6:]).get("choices", []):
            parts.append(ch["delta"].get("content") or "")
            finish = ch.get("finish_reason") or finish
    c.close()
    return "".join(parts), finish


def run_all(port, jobs, concurrency):
    """jobs: (args, kwargs) of stream_raw; results in order, exceptions as values."""
    out, lock, nxt = [None] * len(jobs), threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(jobs):
                return
            try:
                out[i] = stream_raw(port, *jobs[i][0], **jobs[i][1])
            except Exception as e:  # noqa: BLE001 - reported by the caller
                out[i] = (e, None)
    ts = [threading.Thread(target=worker) for _ in range(concurrency)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return out


def test_batched():
    refs = [target_text("--prompt", p, "--chat", "--max-new", "24") for p in BATCH_PROMPTS]
    s = Server("--parallel", "8", "--decoder", "draft", "--drafter", "suffix", "--budget", "auto",
               "--prefill-chunk", "16", "--queue", "256")
    jobs = [((p, 24), {}) for p in BATCH_PROMPTS]
    out = run_all(s.port, jobs, 8)
    bad = [i for i, (t, _) in enumerate(out) if t != refs[i]]
    check("--parallel 8: 12 prompts of different lengths at once, each T=0 text equals its "
          "solo rootspec-target text", not bad, str([(out[i], refs[i]) for i in bad[:2]]))
    seeded = {"temperature": 1, "seed": 11, "rootspec": {"decoder": "ar"}}
    alone = stream_raw(s.port, BATCH_PROMPTS[2], 20, seeded)
    load = [((p, 24), {}) for p in BATCH_PROMPTS[:6]] + [((BATCH_PROMPTS[2], 20, seeded), {})]
    out = run_all(s.port, load, 7)
    check("--parallel 8: a seeded T=1 request samples the same text under load as alone",
          out[-1] == alone and alone[0], f"{out[-1]} vs {alone}")
    rng = __import__("random").Random(5)
    jobs = [((BATCH_PROMPTS[i % 12] + f" (request {i})", 8 + i % 5),
             {"drop_after": rng.randint(1, 4)} if rng.random() < 0.25 else {}) for i in range(200)]
    out = run_all(s.port, jobs, 16)
    lost = [i for i, (j, o) in enumerate(zip(jobs, out))
            if "drop_after" not in j[1] and not (isinstance(o[0], str) and o[1] in ("length", "stop"))]
    time.sleep(0.5)
    check("--parallel 8: 200 requests at concurrency 16 with random disconnects, none lost",
          not lost, str([out[i] for i in lost[:3]]))
    check("--parallel 8: afterwards every KV block is free and no sequence runs",
          s.metric("rootspec_kv_blocks_used") == 0 and s.metric("rootspec_sequences_running") == 0,
          f"{s.metric('rootspec_kv_blocks_used')} blocks used")
    check("--parallel 8: passes carried several rows",
          s.metric("rootspec_batch_rows_total") > 1.5 * s.metric("rootspec_batch_passes_total"))
    check("the batched server stops with status 0 on SIGTERM", s.stop() == 0)


def test_preempt():
    prompts = [f"Write a very long story about a {w}." for w in ("dragon", "ship", "robot", "garden")]
    refs = [target_text("--prompt", p, "--chat", "--max-new", "200", "--ctx", "256") for p in prompts]
    s = Server("--parallel", "4", "--ctx", "256", "--kv-entries", "256")
    out = run_all(s.port, [((p, 200), {}) for p in prompts], 4)
    bad = [i for i, (t, _) in enumerate(out) if t != refs[i]]
    check("--kv-entries below what 4 decodes need: decodes are preempted and recomputed",
          s.metric("rootspec_preemptions_total") > 0, str(s.metric("rootspec_preemptions_total")))
    check("after preemption every T=0 text still equals its solo text", not bad,
          str([(out[i], refs[i]) for i in bad[:1]]))
    check("after preemption every KV block is free", s.metric("rootspec_kv_blocks_used") == 0)
    s.stop()


def main():
    ref = target_text("--prompt", PROMPT, "--chat", "--max-new", "24")
    s = Server()
    for t in (lambda: test_chat(s, ref), lambda: test_conversation(s), lambda: test_completions(s),
              lambda: test_stop(s, ref),
              lambda: test_models_health(s), lambda: test_concurrent(s, ref), lambda: test_disconnect(s),
              lambda: test_errors(s)):
        t()
    check("the server stops with status 0 on SIGTERM", s.stop() == 0)
    test_queue_full()
    test_speculative(ref)
    test_drafter_failure()
    test_flood()
    test_batched()
    test_preempt()
    print(f"serve: {results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
