#!/usr/bin/env python3
"""rootspec-serve's logprobs against llama.cpp's llama-server on the same GGUF (dev-time only).

    python3 tools/logprobs_peer.py --model M.gguf --llama-server PATH/llama-server \
        [--serve build/rootspec-serve] [--tokens 24] [--top 5] [--tol 0.05] [--min-overlap 0.8]

Starts both servers on free loopback ports (or uses running ones: --rs-port, --llama-port),
tokenizes each prompt once (rootspec-serve's /tokenize) and sends the same token ids to
both at temperature 0: rootspec-serve's /v1/completions with logprobs N, llama-server's
/completion with n_probs N (the model's distribution before sampling, as rootspec-serve
reports at T=0). Positions are compared while the greedy tokens agree (a near-tie may
flip one side's argmax: the first such position ends that prompt's comparison, and is
reported). Prints per prompt and overall: the largest |difference| of the chosen tokens'
log-probabilities, the largest over the top-N alternatives both list, and the mean top-N
overlap (shared ids / N). Exits 1 when the largest chosen-token difference exceeds --tol or
the mean overlap is below --min-overlap. Only the standard library is needed.
"""
import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea, there lived",
    "1, 1, 2, 3, 5, 8, 13,",
    "The mitochondria is the powerhouse of the cell. It produces",
]


def post(port, path, body, timeout=300):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(port, proc, what):
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"logprobs_peer: {what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"logprobs_peer: {what} did not become healthy")


def rootspec_rows(port, ids, n, top):
    """[(chosen token, its logprob, {token: logprob} of the top alternatives)] per output
    token; tokens by their text, as both servers name them."""
    r = post(port, "/v1/completions", {"prompt": ids, "max_tokens": n, "temperature": 0, "logprobs": top})
    lp = r["choices"][0]["logprobs"]
    return [(t, l, m) for t, l, m in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])]


def llama_rows(port, ids, n, top):
    """rootspec_rows' shape from llama-server's native /completion (greedy: top_k 1)."""
    r = post(port, "/completion", {"prompt": ids, "n_predict": n, "temperature": 0, "n_probs": top,
                                   "cache_prompt": False, "samplers": ["top_k"], "top_k": 1})
    rows = []
    for e in r["completion_probabilities"]:
        if "logprob" in e:  # newer servers: logprobs of the distribution before sampling
            alts = {a["token"]: a["logprob"] for a in e["top_logprobs"]}
            rows.append((e["token"], e["logprob"], alts))
        else:  # older: probabilities
            alts = {a["tok_str"]: math.log(max(a["prob"], 1e-300)) for a in e["probs"]}
            rows.append((e["content"], alts.get(e["content"], float("nan")), alts))
    return rows


def compare(rs, ll, top):
    """Largest chosen-token and alternative differences, overlaps, positions compared and
    the first position where the greedy tokens differ (None)."""
    worst = worst_alt = 0.0
    overlaps, diverged = [], None
    for k, ((ta, la, ma), (tb, lb, mb)) in enumerate(zip(rs, ll)):
        if ta != tb:
            diverged = k
            break
        worst = max(worst, abs(la - lb))
        shared = set(ma) & set(mb)
        overlaps.append(len(shared) / top)
        for t in shared:
            worst_alt = max(worst_alt, abs(ma[t] - mb[t]))
    return worst, worst_alt, overlaps, diverged


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-server", help="llama-server binary (unless --llama-port)")
    ap.add_argument("--serve", default="build/rootspec-serve")
    ap.add_argument("--rs-port", type=int)
    ap.add_argument("--llama-port", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--min-overlap", type=float, default=0.8)
    a = ap.parse_args()
    procs = []
    try:
        if not a.rs_port:
            a.rs_port = free_port()
            procs.append(subprocess.Popen([a.serve, "--model", a.model, "--port", str(a.rs_port), "--parallel", "1",
                                           "--threads", str(a.threads)], stderr=subprocess.DEVNULL))
            wait_health(a.rs_port, procs[-1], "rootspec-serve")
        if not a.llama_port:
            if not a.llama_server:
                sys.exit("logprobs_peer: give --llama-server or --llama-port")
            a.llama_port = free_port()
            procs.append(subprocess.Popen([a.llama_server, "-m", a.model, "--host", "127.0.0.1", "--port",
                                           str(a.llama_port), "-t", str(a.threads), "-c", "2048", "-np", "1"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_health(a.llama_port, procs[-1], "llama-server")
        worst = worst_alt = 0.0
        overlaps, n_pos = [], 0
        for p in PROMPTS:
            ids = post(a.rs_port, "/tokenize", {"content": p})["tokens"]
            rs = rootspec_rows(a.rs_port, ids, a.tokens, a.top)
            ll = llama_rows(a.llama_port, ids, a.tokens, a.top)
            w, wa, ov, div = compare(rs, ll, a.top)
            worst, worst_alt = max(worst, w), max(worst_alt, wa)
            overlaps += ov
            n_pos += len(ov)
            print(f"{p[:40]!r:44} {len(ov):3d} positions  max|dlogp| {w:.5f}  alternatives {wa:.5f}  "
                  f"top-{a.top} overlap {sum(ov) / max(len(ov), 1):.3f}"
                  + (f"  (greedy tokens differ at {div}: {rs[div][0]!r} vs {ll[div][0]!r})" if div is not None else ""))
        mean_ov = sum(overlaps) / max(len(overlaps), 1)
        print(f"all: {n_pos} positions, max |chosen logprob difference| {worst:.5f} (tolerance {a.tol}), "
              f"max over shared top-{a.top} {worst_alt:.5f}, mean top-{a.top} overlap {mean_ov:.3f} "
              f"(at least {a.min_overlap})")
        return 0 if n_pos and worst <= a.tol and mean_ov >= a.min_overlap else 1
    finally:
        for pr in procs:
            pr.terminate()
            pr.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
