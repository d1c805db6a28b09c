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
overlap (shared tokens / N); --reference also measures each side against
tools/logprobs_ref.py's float forward (numpy and gguf needed then; the rest needs only the
standard library). Exits 1 when the largest or the mean chosen-token difference exceeds
--tol or --mean-tol, or the mean overlap is below --min-overlap. Both engines quantize
activations to 8 bits for 4-bit weights, each its own way, so they differ from the float
forward, and from each other, by a few hundredths of a nat on average and a few tenths at
worst (docs/PERF.md).
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
    """The chosen tokens' |differences|, the largest over shared alternatives, the overlaps
    (one per position compared) and the first position where the greedy tokens differ (None)."""
    diffs, worst_alt = [], 0.0
    overlaps, diverged = [], None
    for k, ((ta, la, ma), (tb, lb, mb)) in enumerate(zip(rs, ll)):
        if ta != tb:
            diverged = k
            break
        diffs.append(abs(la - lb))
        shared = set(ma) & set(mb)
        overlaps.append(len(shared) / top)
        for t in shared:
            worst_alt = max(worst_alt, abs(ma[t] - mb[t]))
    return diffs, worst_alt, overlaps, diverged


def reference_diffs(model, ids, rs, ll):
    """|logprob - float reference| of each side's chosen tokens (tools/logprobs_ref.py's
    numpy forward of the dequantized weights, activations unquantized), while they agree."""
    import numpy as np
    import logprobs_ref as ref
    if not hasattr(reference_diffs, "w"):
        reference_diffs.w = ref.load(model)
    w, cfg = reference_diffs.w
    n = 0
    while n < min(len(rs), len(ll)) and rs[n][0] == ll[n][0]:
        n += 1
    out = post(reference_diffs.port, "/tokenize", {"content": "".join(t for t, _, _ in rs[:n])})["tokens"]
    if len(out) != n:  # the text does not tokenize back to the same tokens: skip
        return [], []
    lg = ref.forward(w, cfg, np.array((ids + out)[:-1])).astype(np.float64)
    lsm = lg - lg.max(-1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(-1, keepdims=True))
    rows = [lsm[len(ids) - 1 + i][t] for i, t in enumerate(out)]
    return [abs(r - rs[i][1]) for i, r in enumerate(rows)], [abs(r - ll[i][1]) for i, r in enumerate(rows)]


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
    ap.add_argument("--tol", type=float, default=0.35, help="largest chosen-token |difference| allowed")
    ap.add_argument("--mean-tol", type=float, default=0.05, help="mean chosen-token |difference| allowed")
    ap.add_argument("--min-overlap", type=float, default=0.9)
    ap.add_argument("--reference", action="store_true",
                    help="also each side against tools/logprobs_ref.py's float forward (numpy, gguf)")
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
        diffs, worst_alt, overlaps, ref_rs, ref_ll = [], 0.0, [], [], []
        reference_diffs.port = a.rs_port
        for p in PROMPTS:
            ids = post(a.rs_port, "/tokenize", {"content": p})["tokens"]
            rs = rootspec_rows(a.rs_port, ids, a.tokens, a.top)
            ll = llama_rows(a.llama_port, ids, a.tokens, a.top)
            d, wa, ov, div = compare(rs, ll, a.top)
            diffs += d
            worst_alt = max(worst_alt, wa)
            overlaps += ov
            line = (f"{p[:40]!r:44} {len(d):3d} positions  max|dlogp| {max(d, default=0):.4f}  mean "
                    f"{sum(d) / max(len(d), 1):.4f}  alternatives {wa:.4f}  top-{a.top} overlap "
                    f"{sum(ov) / max(len(ov), 1):.3f}")
            if a.reference:
                r1, r2 = reference_diffs(a.model, ids, rs, ll)
                ref_rs, ref_ll = ref_rs + r1, ref_ll + r2
                line += f"  vs float: rootspec {max(r1, default=0):.4f}, llama.cpp {max(r2, default=0):.4f}"
            if div is not None:
                line += f"  (greedy tokens differ at {div}: {rs[div][0]!r} vs {ll[div][0]!r})"
            print(line)
        n = len(diffs)
        worst, mean = max(diffs, default=0), sum(diffs) / max(n, 1)
        mean_ov = sum(overlaps) / max(len(overlaps), 1)
        print(f"all: {n} positions; chosen tokens' |logprob difference| max {worst:.4f} (tolerance {a.tol}), "
              f"mean {mean:.4f} (tolerance {a.mean_tol}); max over shared top-{a.top} {worst_alt:.4f}; "
              f"mean top-{a.top} overlap {mean_ov:.3f} (at least {a.min_overlap})")
        if a.reference and ref_rs:
            print(f"against the float reference ({len(ref_rs)} positions): rootspec max {max(ref_rs):.4f} mean "
                  f"{sum(ref_rs) / len(ref_rs):.4f}; llama.cpp max {max(ref_ll):.4f} mean {sum(ref_ll) / len(ref_ll):.4f}")
        return 0 if n and worst <= a.tol and mean <= a.mean_tol and mean_ov >= a.min_overlap else 1
    finally:
        for pr in procs:
            pr.terminate()
            pr.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
