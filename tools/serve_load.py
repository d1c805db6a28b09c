#!/usr/bin/env python3
"""Concurrent-load benchmark for rootspec-serve --parallel (dev-time; standard library only).

Starts one rootspec-serve per decoder (continuous batching, `--parallel`; the server's own
options after `--`; each request names its decoder through rootspec's "rootspec"
extension), optionally a peer OpenAI-compatible server (llama-server: its whole command
after --peer-cmd, or --peer-port of one already running), and streams chat completions at
each concurrency with DISTINCT prompts at every level (the Spec-Bench question file, never
reused across levels). Every side gets the same prompts at a level, and each side is a
server of its own, so no side finds a prompt in its cache that another side computed; the
sides take turns level by level, so a change in the machine's load hits them alike. For
each side and level it prints
  agg tok/s   completion tokens of all requests over the wall time of the level
  TTFT        request sent to first content chunk, p50 and p90
  req tok/s   each request's tokens over its own time (first byte sent to last chunk), p50
the rows per batched pass, the wall ms per pass and the ms its forward took (rootspec's
/metrics, when batching; the difference is the decodes' host work between passes), and of
a pass's rows those that kept logits (they pay the output head) and prompts' rows,
and the ratios: aggregate over the same decoder's concurrency-1 figure, speculation over
AR at the same level, and against the peer at the same level: aggregate over the peer's
and TTFT p50 over the peer's (a summary table at the end). With --check every T=0 text under load is
compared with the same prompt decoded alone afterwards (the batch must not change it).

  python3 tools/serve_load.py [--workload short|mixed] [--concurrency 1,4,8,16]
      [--requests 16] [--per-conc K] [--max-tokens 64] [--decoders ar,draft] [--check]
      [--llama-server PATH [--peer-np 8] | --peer-cmd 'llama-server ...' --peer-port 8091]
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
# Spec-Bench's six categories: its MT-bench questions (eight small categories) count as one
SPEC_BENCH = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def start_rootspec(binary, model, extra):
    # every client shares one address, and a closed connection may linger a moment
    cmd = [binary, "--model", model, "--port", "0", "--queue", "256",
           "--max-connections-per-client", "256", *extra]
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
    got = dict(re.findall(r"^rootspec_batch_(\w+)_total (\S+)$", text, re.M))
    if not all(k in got for k in ("passes", "rows", "pass_seconds")):
        return None
    # kept and prompt rows: NaN from a server that does not count them
    return tuple(float(got.get(k, "nan")) for k in ("passes", "rows", "pass_seconds", "kept_rows",
                                                    "prompt_rows"))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(res, wall):
    toks = sum(r[2] for r in res)
    return {"agg": toks / wall, "wall": wall, "ttft50": pct([r[0] for r in res], .5),
            "ttft90": pct([r[0] for r in res], .9),
            "req": pct([r[2] / r[1] for r in res if r[1] > 0], .5), "tokens": toks}


def load_prompts(path, workload):
    """The workload's prompts, round-robin over its categories, so every level holds each
    category alike."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    cats = {c: [] for c in (SHORT if workload == "short" else SPEC_BENCH)}
    for r in rows:
        c = r["category"] if r["category"] in SPEC_BENCH else "mt_bench"
        if c in cats:
            cats[c].append(r)
    rows = [q for group in zip(*cats.values()) for q in group]
    prompts = [r["turns"][0] for r in rows]
    return prompts


def level_prompts(prompts, levels, args):
    """Each level's own prompts, max(--requests, --per-conc x concurrency) of them, for each
    of --repeat passes over the levels: [repeat][level]."""
    out, k = [], 0
    for _ in range(args.repeat):
        out.append([])
        for conc in levels:
            n = max(args.requests, args.per_conc * conc)
            out[-1].append(prompts[k:k + n])
            k += n
    return out, k


def row(name, conc, f, figs, levels, passes, m0, m1, wall):
    base, ar, pr = figs.get((name, levels[0])), figs.get(("ar", conc)), figs.get(("peer", conc))
    vs_peer = pr and name != "peer"
    spec = f["agg"] / ar["agg"] if ar and name not in ("ar", "peer") else float("nan")
    return (f"{name:6} {conc:4d} {f['n']:4d} {f['agg']:9.1f} {f['agg'] / base['agg']:6.2f} "
            f"{f['ttft50'] * 1e3:7.0f}ms {f['ttft90'] * 1e3:5.0f}ms {f['req']:9.1f} {spec:7.2f} "
            f"{format(f['agg'] / pr['agg'], '6.2f') if vs_peer else '':>6} "
            f"{format(f['ttft50'] / pr['ttft50'], '6.2f') if vs_peer else '':>6} "
            f"{'' if not passes else format((m1[1] - m0[1]) / passes, '5.1f'):>5} "
            f"{'' if not passes else format(wall * 1e3 / passes, '6.1f'):>6} "
            f"{'' if not passes else format((m1[2] - m0[2]) * 1e3 / passes, '6.1f'):>6} "
            f"{'' if not passes else format((m1[3] - m0[3]) / passes, '5.1f'):>5} "
            f"{'' if not passes else format((m1[4] - m0[4]) / passes, '6.1f'):>6}")


def peer_summary(figs, levels, names):
    print("\nagainst the peer (ratios at each level: aggregate tok/s, TTFT p50, request tok/s)")
    for name in names:
        for conc in levels:
            f, pr = figs.get((name, conc)), figs.get(("peer", conc))
            if f and pr:
                print(f"  {name:6} c={conc:<3d} agg {f['agg'] / pr['agg']:5.2f}x  "
                      f"TTFT p50 {f['ttft50'] / pr['ttft50']:5.2f}x  "
                      f"req tok/s {f['req'] / pr['req']:5.2f}x")


def check_solo(sides, levels, plevels, figs, max_tokens):
    """Every T=0 text under load against the same prompt decoded alone on the same server."""
    checked = mismatches = 0
    for li, conc in enumerate(levels):
        for name, p, dec in sides:
            if name == "peer":
                continue
            for i, q in enumerate(q for rep in plevels for q in rep[li]):
                solo = one_request(p, q, dec, max_tokens)[3]
                checked += 1
                if solo != figs[(name, conc)]["texts"][i]:
                    mismatches += 1
                    print(f"MISMATCH {name} c={conc} prompt {i}: {solo[:60]!r} vs "
                          f"{figs[(name, conc)]['texts'][i][:60]!r}")
    print(f"check: {checked - mismatches} of {checked} texts under load equal their solo decode")
    return mismatches


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/rootspec-serve")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--prompts", default="../shared/data/spec_bench_question.jsonl")
    ap.add_argument("--workload", choices=("short", "mixed"), default="short")
    ap.add_argument("--decoders", default="ar,draft",
                    help="a server each; NAME#K: another server of the same decoder (noise floor)")
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=16, help="requests a level (at least)")
    ap.add_argument("--per-conc", type=int, default=0,
                    help="a level has at least this many requests per concurrent client")
    ap.add_argument("--repeat", type=int, default=1,
                    help="passes over the levels (fresh prompts each); figures pool them")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--check", action="store_true", help="compare every text with its solo decode")
    ap.add_argument("--llama-server", metavar="PATH",
                    help="start this llama-server as the peer: the same model, --peer-np slots "
                         "(continuous batching), the threads rootspec's --threads names, a "
                         "context of 2048 a slot")
    ap.add_argument("--peer-np", type=int, default=8)
    ap.add_argument("--peer-cmd", help="start a peer server (llama-server ...), same prompts")
    ap.add_argument("--peer-port", type=int, help="the peer's port")
    args = ap.parse_args(argv)
    if args.llama_server:
        threads = extra[extra.index("--threads") + 1] if "--threads" in extra else "2"
        args.peer_port = args.peer_port or 8091
        args.peer_cmd = (f"{args.llama_server} -m {args.model} -np {args.peer_np} -t {threads} "
                         f"-tb {threads} -c {2048 * args.peer_np} --port {args.peer_port} "
                         "--host 127.0.0.1")
        print("peer:", args.peer_cmd, flush=True)
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    levels = [int(c) for c in args.concurrency.split(",")]
    decoders = [d for d in args.decoders.split(",") if d]
    prompts = load_prompts(args.prompts, args.workload)
    plevels, need = level_prompts(prompts, levels, args)
    if need + 1 > len(prompts):
        sys.exit(f"serve_load: {need + 1} distinct prompts needed, the {args.workload} set has {len(prompts)}")
    servers, sides = [], []
    peer = subprocess.Popen(shlex.split(args.peer_cmd), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL) if args.peer_cmd else None
    figs, mismatches = {}, 0
    try:
        for d in decoders:
            server, port = start_rootspec(args.binary, args.model, extra)
            servers.append(server)
            sides.append((d, port, d.split("#")[0]))  # "ar#2": a second AR server
        if args.peer_port:
            wait_port(args.peer_port)
            sides.append(("peer", args.peer_port, None))
        for name, p, dec in sides:
            one_request(p, prompts[-1], dec, 8)  # warm-up (a prompt no level uses)
        print(f"{'side':6} {'conc':>4} {'reqs':>4} {'agg tok/s':>9} {'x c=1':>6} {'TTFT p50':>9} "
              f"{'p90':>7} {'req tok/s':>9} {'spec/ar':>7} {'/peer':>6} {'ttft/p':>6} {'rows':>5} "
              f"{'ms/pass':>6} {'fwd ms':>6} {'kept':>5} {'prompt':>6}")
        runs = {}
        for rep in range(args.repeat):
            for li, conc in enumerate(levels):
                for name, p, dec in sides:
                    m0 = metrics(p)
                    res, wall = run_level(p, plevels[rep][li], dec, conc, args.max_tokens)
                    m1 = metrics(p)
                    r = runs.setdefault((name, conc), {"res": [], "wall": 0.0, "m": [0] * 5})
                    r["res"] += res
                    r["wall"] += wall
                    if m0 and m1:
                        r["m"] = [a + b1 - b0 for a, b0, b1 in zip(r["m"], m0, m1)]
                    if rep + 1 < args.repeat:
                        continue
                    f = figs[(name, conc)] = summary(r["res"], r["wall"])
                    f["n"], f["texts"] = len(r["res"]), [x[3] for x in r["res"]]
                    print(row(name, conc, f, figs, levels, r["m"][0], [0] * 5, r["m"], r["wall"]),
                          flush=True)
        if args.peer_port:
            peer_summary(figs, levels, [d for d in decoders])
        if args.check:
            mismatches = check_solo(sides, levels, plevels, figs, args.max_tokens)
    finally:
        for server in servers:
            server.terminate()
            server.wait()
        if peer:
            peer.terminate()
            peer.wait()
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
