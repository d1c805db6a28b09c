#!/usr/bin/env python3
"""Concurrent-load benchmark for rootspec-serve --parallel (dev-time; standard library only).

Starts rootspec-serve (continuous batching, `--parallel`; the server's own options after
`--`), optionally a peer OpenAI-compatible server (llama-server: its whole command after
--peer-cmd, or --peer-port of one already running), and streams chat completions at each
concurrency with DISTINCT prompts at every level (the Spec-Bench question file, in file
order, never reused across levels, so no prompt cache helps anyone). For each decoder
(picked per request through rootspec's "rootspec" extension, so AR and speculation share
one server) and each level it prints
  agg tok/s   completion tokens of all requests over the wall time of the level
  TTFT        request sent to first content chunk, p50 and p90
  req tok/s   each request's tokens over its own time (first byte sent to last chunk), p50
the rows per batched pass, the wall ms per pass and the ms its forward took (rootspec's
/metrics, when batching; the difference is the decodes' host work between passes),
and the ratios: aggregate over the same decoder's concurrency-1 figure, speculation over
AR at the same level, rootspec over the peer. With --check every T=0 text under load is
compared with the same prompt decoded alone afterwards (the batch must not change it).

  python3 tools/serve_load.py [--workload short|mixed] [--concurrency 1,4,8,16]
      [--requests 16] [--max-tokens 64] [--decoders ar,draft] [--check]
      [--peer-cmd 'llama-server -m M -np 8 --port 8091' --peer-port 8091]
      -- --parallel 16 --decoder draft --drafter suffix --budget auto --threads 2
"""
import argparse
import http.client
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time

SHORT = ("translation", "qa", "math_reasoning")


def start_rootspec(binary, model, extra):
    cmd = [binary, "--model", model, "--port", "0", "--queue", "256", *extra]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    while True:
        line = p.stderr.readline()
        if not line:
            sys.exit("serve_load: rootspec-serve did not start: " + " ".join(cmd))
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))


def wait_port(port, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"serve_load: nothing answers on port {port}")


def one_request(port, prompt, decoder, max_tokens):
    """Streams one chat completion: (ttft s, total s, tokens, text)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if decoder:
        body["rootspec"] = {"decoder": decoder}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    first = last = None
    tokens, parts = 0, []
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])
        if ch.get("usage"):
            tokens = ch["usage"]["completion_tokens"]
        for choice in ch.get("choices", []):
            text = (choice.get("delta") or {}).get("content")
            if text:
                now = time.perf_counter()
                first = first or now
                last = now
                parts.append(text)
    c.close()
    end = last or time.perf_counter()
    return (first or end) - t0, end - t0, tokens, "".join(parts)


def run_level(port, prompts, decoder, conc, max_tokens):
    """All prompts at concurrency conc: (results in prompt order, wall seconds)."""
    out, lock, nxt = [None] * len(prompts), threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(prompts):
                return
            out[i] = one_request(port, prompts[i], decoder, max_tokens)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(conc)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return out, time.perf_counter() - t0


def metrics(port):
    """rootspec-serve's batch counters (passes, rows), or None for another server."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    except OSError:
        return None
    got = dict(re.findall(r"^(rootspec_batch_(?:passes|rows|pass_seconds)_total) (\S+)$", text, re.M))
    return (float(got["rootspec_batch_passes_total"]), float(got["rootspec_batch_rows_total"]),
            float(got["rootspec_batch_pass_seconds_total"])) if len(got) == 3 else None


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(res, wall):
    toks = sum(r[2] for r in res)
    return {"agg": toks / wall, "ttft50": pct([r[0] for r in res], .5),
            "ttft90": pct([r[0] for r in res], .9),
            "req": pct([r[2] / r[1] for r in res if r[1] > 0], .5), "tokens": toks}


def load_prompts(path, workload, need):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if workload == "short":
        rows = [r for r in rows if r["category"] in SHORT]
    else:  # round-robin over the categories, so every level mixes long and short inputs
        cats = {}
        for r in rows:
            cats.setdefault(r["category"], []).append(r)
        rows = [q for group in zip(*cats.values()) for q in group]
    prompts = [r["turns"][0] for r in rows]
    if len(prompts) < need:
        sys.exit(f"serve_load: {need} distinct prompts needed, {path} has {len(prompts)}")
    return prompts


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/rootspec-serve")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--prompts", default="../shared/data/spec_bench_question.jsonl")
    ap.add_argument("--workload", choices=("short", "mixed"), default="short")
    ap.add_argument("--decoders", default="ar,draft")
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--check", action="store_true", help="compare every text with its solo decode")
    ap.add_argument("--peer-cmd", help="start a peer server (llama-server ...), same prompts")
    ap.add_argument("--peer-port", type=int, help="the peer's port")
    args = ap.parse_args(argv)
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    levels = [int(c) for c in args.concurrency.split(",")]
    decoders = [d for d in args.decoders.split(",") if d]
    prompts = load_prompts(args.prompts, args.workload, args.requests * len(levels) + 1)
    server, port = start_rootspec(args.binary, args.model, extra)
    peer = subprocess.Popen(shlex.split(args.peer_cmd), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL) if args.peer_cmd else None
    sides = [(d, port, d) for d in decoders]
    if args.peer_port:
        wait_port(args.peer_port)
        sides.append(("peer", args.peer_port, None))
    figs, mismatches, checked = {}, 0, 0
    try:
        for name, p, dec in sides:
            one_request(p, prompts[-1], dec, 8)  # warm-up (a prompt no level uses)
        print(f"{'side':6} {'conc':>4} {'reqs':>4} {'agg tok/s':>9} {'x c=1':>6} {'TTFT p50':>9} "
              f"{'p90':>7} {'req tok/s':>9} {'spec/ar':>7} {'/peer':>6} {'rows':>5} {'ms/pass':>6} {'fwd ms':>6}")
        for li, conc in enumerate(levels):
            level = prompts[li * args.requests:(li + 1) * args.requests]
            for name, p, dec in sides:
                m0 = metrics(p)
                res, wall = run_level(p, level, dec, conc, args.max_tokens)
                m1 = metrics(p)
                f = figs[(name, conc)] = summary(res, wall)
                passes = m1[0] - m0[0] if m0 and m1 else 0
                f["texts"] = [r[3] for r in res]
                base = figs.get((name, levels[0]))
                ar = figs.get(("ar", conc))
                pr = figs.get(("peer", conc))
                print(f"{name:6} {conc:4d} {len(res):4d} {f['agg']:9.1f} {f['agg'] / base['agg']:6.2f} "
                      f"{f['ttft50'] * 1e3:7.0f}ms {f['ttft90'] * 1e3:5.0f}ms {f['req']:9.1f} "
                      f"{(f['agg'] / ar['agg']) if ar and name not in ('ar', 'peer') else float('nan'):7.2f} "
                      f"{'' if not pr or name == 'peer' else format(f['agg'] / pr['agg'], '6.2f'):6} "
                      f"{'' if not passes else format((m1[1] - m0[1]) / passes, '5.1f'):>5} "
                      f"{'' if not passes else format(wall * 1e3 / passes, '6.1f'):>6} "
                      f"{'' if not passes else format((m1[2] - m0[2]) * 1e3 / passes, '6.1f'):>6}",
                      flush=True)
        if args.check:
            for li, conc in enumerate(levels):
                level = prompts[li * args.requests:(li + 1) * args.requests]
                for dec in decoders:
                    for i, q in enumerate(level):
                        solo = one_request(port, q, dec, args.max_tokens)[3]
                        checked += 1
                        if solo != figs[(dec, conc)]["texts"][i]:
                            mismatches += 1
                            print(f"MISMATCH {dec} c={conc} prompt {i}: {solo[:60]!r} vs "
                                  f"{figs[(dec, conc)]['texts'][i][:60]!r}")
            print(f"check: {checked - mismatches} of {checked} texts under load equal their solo decode")
    finally:
        server.terminate()
        server.wait()
        if peer:
            peer.terminate()
            peer.wait()
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
