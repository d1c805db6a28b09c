#!/usr/bin/env python3
"""Load benchmark for rootspec-serve (dev-time; standard library only).

Starts the server with a drafter process (deploy/launch.sh --serve: drafter on core 1,
server on core 0), then for each decoder (picked per request through the "rootspec"
extension object, so AR and speculative share one process and one warm-up) and each
concurrency sends streamed chat completions from a prompt file and reports:
  TTFT  time from sending the request to the first content chunk (p50, p90, mean)
  ITL   inter-token latency, per request (last chunk - first chunk) / (tokens - 1), mean
        and p50; a speculative round's tokens arrive together, so this is the mean
  tok/s completion tokens of all requests over the wall time of the batch
At concurrency 4 the server decodes one request at a time, so TTFT includes queueing.

  python3 tools/serve_bench.py [--model M] [--prompts deploy/prompts.jsonl]
      [--decoders ar,rootdraw] [--concurrency 1,4] [--requests 8] [--max-tokens 64]
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time


def start_server(args):
    cmd = ["deploy/launch.sh", "--serve", "--draft-model", args.model, "--draft-layers", args.draft_layers,
           "--", "--model", args.model, "--decoder", "rootdraw", "--budget", str(args.budget),
           "--port", "0", "--queue", "64", "--draft-timeout-ms", "60000"]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    while True:
        line = p.stderr.readline()
        if not line:
            sys.exit("serve_bench: the server did not start")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))


def one_request(port, prompt, decoder, max_tokens):
    """Streams one chat completion; returns (ttft, itl, tokens)."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                       "rootspec": {"decoder": decoder}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    first = last = None
    tokens = 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])
        if ch.get("usage"):
            tokens = ch["usage"]["completion_tokens"]
        for choice in ch.get("choices", []):
            if choice["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    c.close()
    itl = (last - first) / (tokens - 1) if tokens > 1 and first else float("nan")
    return (first - t0) if first else float("nan"), itl, tokens


def run_batch(port, prompts, decoder, conc, n, max_tokens):
    results, lock, next_i = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= n:
                return
            res = one_request(port, prompts[i % len(prompts)], decoder, max_tokens)
            with lock:
                results.append(res)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(conc)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return results, time.perf_counter() - t0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--prompts", default="deploy/prompts.jsonl")
    ap.add_argument("--decoders", default="ar,rootdraw")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--budget", type=int, default=59)
    ap.add_argument("--draft-layers", default="0-14")
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    prompts = [json.loads(line)["turns"][0] for line in open(args.prompts) if line.strip()]
    server, port = start_server(args)
    try:
        for dec in args.decoders.split(","):
            one_request(port, prompts[0], dec, 8)  # warm-up
        print(f"{'decoder':9} {'conc':>4} {'reqs':>4} {'TTFT p50':>9} {'p90':>7} {'mean':>7} "
              f"{'ITL mean':>9} {'p50':>7} {'tok/s':>7}")
        for conc in (int(c) for c in args.concurrency.split(",")):
            for dec in args.decoders.split(","):
                res, wall = run_batch(port, prompts, dec, conc, args.requests, args.max_tokens)
                ttft = [r[0] for r in res]
                itl = [r[1] for r in res]
                toks = sum(r[2] for r in res)
                print(f"{dec:9} {conc:4d} {len(res):4d} {pct(ttft, .5) * 1e3:7.0f}ms {pct(ttft, .9) * 1e3:5.0f}ms "
                      f"{statistics.mean(ttft) * 1e3:5.0f}ms {statistics.mean(itl) * 1e3:7.1f}ms "
                      f"{pct(itl, .5) * 1e3:5.1f}ms {toks / wall:7.1f}", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
