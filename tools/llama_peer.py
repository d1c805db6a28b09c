#!/usr/bin/env python3
"""llama.cpp's figures on a GGUF, for comparison with rootspec-micro (dev-time only).

Needs llama-cpp-python built from source with explicit ISA flags (GGML_NATIVE=ON built a
library that died with an illegal instruction on one of this project's machines), in a venv:

    python3 -m venv /work/venv-peer
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_BLAS=OFF" /work/venv-peer/bin/pip install --no-binary llama-cpp-python llama-cpp-python

On a CPU without AVX-512 (e.g. the 2-core AMD EPYC dev machine: no avx512f in
/proc/cpuinfo) turn the three AVX512 flags OFF: with them on the compiler may emit
AVX-512 instructions anywhere in ggml-cpu. Version measured: 0.3.36.

    /work/venv-peer/bin/python tools/llama_peer.py models/SmolLM2-135M-Instruct.Q4_1.gguf

Prints key=value lines (tools/peer-compare.sh pairs them with rootspec-micro's):
  ar_tok_s_t{1,2}         greedy autoregressive decode, tokens/s at 1 and 2 threads: a
                          --prompt-tokens prompt (default: --context, the entries
                          rootspec-micro's AR decode follows) is prefilled (untimed), then --ar-tokens
                          tokens are decoded one at a time (decode + argmax each)
  ar_cpu_tok_s_t{1,2}     the same per second of process CPU time (less distorted by a
                          loaded machine at 1 thread; at 2, spinning threads count)
  pass_ms_n{1,9,65}_t{1,2} one forward of n tokens after a --context (128) token context
                          (rootspec-micro --ctx gives the same on its side), logits for
                          every row (as a tree verification pass needs; rootspec-micro
                          computes every row too), mean over --iters after 2 warm-ups
  pass_best_ms_...        the fastest of those passes
  rss_mb                  resident memory after the runs (the model is mmapped)
  system_info, llama_cpp_version, model, cpu
Timing goes through the raw llama_decode (no Python-side logits copies).
"""
import argparse
import ctypes
import os
import platform
import statistics
import sys
import time

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes "
        "Gutenberg combined a screw press, oil-based ink and movable metal type. Within a few "
        "decades presses spread across Europe, books became cheaper, and literacy rose. ")


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def rss_mb():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Peer:
    """A llama.cpp context with the raw decode loop (llama_cpp's low-level API)."""

    def __init__(self, model, n_ctx):
        import llama_cpp
        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                                   n_threads=1, n_threads_batch=1, logits_all=True, verbose=False)
        self.ctx = self.llm._ctx.ctx
        self.n_vocab = self.llm.n_vocab()
        toks = self.llm.tokenize(TEXT.encode(), add_bos=False)
        self.stream = (toks * (1 + n_ctx // len(toks)))[:n_ctx]  # every position a pass reaches

    def threads(self, t):
        self.lc.llama_set_n_threads(self.ctx, t, t)

    def decode(self, tokens, n_past, all_logits):
        """Evaluates tokens at positions n_past.. after dropping the cache from n_past on."""
        self.llm._ctx.kv_cache_seq_rm(-1, n_past, -1)
        self.llm._batch.set_batch(batch=tokens, n_past=n_past, logits_all=all_logits)
        if not tokens:
            raise ValueError("llama_peer: an empty batch (the text stream is too short)")
        self.llm._ctx.decode(self.llm._batch)
        self.lc.llama_synchronize(self.ctx)

    def argmax_last(self):
        import numpy as np
        p = self.lc.llama_get_logits_ith(self.ctx, -1)
        row = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return int(row.argmax())

    def ar_tok_s(self, prompt_tokens, n_new):
        """(tok/s of wall clock, tok/s of process CPU time)."""
        self.decode(self.stream[:prompt_tokens], 0, False)
        tok, n_past = self.argmax_last(), prompt_tokens
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n_new):
            self.decode([tok], n_past, False)
            n_past += 1
            tok = self.argmax_last()
        return n_new / (time.perf_counter() - t0), n_new / (time.process_time() - c0)

    def pass_ms(self, n, context, iters):
        self.decode(self.stream[:context], 0, False)
        batch = self.stream[context:context + n]
        times = []
        for i in range(iters + 2):
            t0 = time.perf_counter()
            self.decode(batch, context, True)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.mean(times), min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="GGUF file")
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--ns", default="1,9,65", help="pass sizes (default 1,9,65)")
    ap.add_argument("--context", type=int, default=128, help="tokens before a timed pass (128)")
    ap.add_argument("--iters", type=int, default=10, help="timed passes per size (10)")
    ap.add_argument("--prompt-tokens", type=int, default=None,
                    help="AR decode prompt (default: --context, as rootspec-micro's --ctx)")
    ap.add_argument("--ar-tokens", type=int, default=128, help="AR decode length (128)")
    a = ap.parse_args()
    if not os.path.isfile(a.model):
        print(f"llama_peer: no such file '{a.model}'", file=sys.stderr)
        return 2
    try:
        import llama_cpp
    except ImportError:
        print("llama_peer: llama_cpp is not importable; build it as this file's docstring says",
              file=sys.stderr)
        return 2
    ns = [int(x) for x in a.ns.split(",")]
    if a.prompt_tokens is None:
        a.prompt_tokens = a.context
    peer = Peer(a.model, max(512, a.context + max(ns), a.prompt_tokens + a.ar_tokens + 1))
    print("peer=llama.cpp")
    print(f"llama_cpp_version={llama_cpp.__version__}")
    print(f"model={a.model}")
    print(f"cpu={cpu_name()}")
    print("system_info=" + llama_cpp.llama_print_system_info().decode().strip().replace("\n", " "))
    for t in [int(x) for x in a.threads.split(",")]:
        peer.threads(t)
        peer.ar_tok_s(a.prompt_tokens, 8)  # warm-up: pages in the mapping, spins up threads
        wall, cpu = peer.ar_tok_s(a.prompt_tokens, a.ar_tokens)
        print(f"ar_tok_s_t{t}={wall:.2f}")
        print(f"ar_cpu_tok_s_t{t}={cpu:.2f}", flush=True)
        for n in ns:
            mean, best = peer.pass_ms(n, a.context, a.iters)
            print(f"pass_ms_n{n}_t{t}={mean:.2f}")
            print(f"pass_best_ms_n{n}_t{t}={best:.2f}", flush=True)
    print(f"rss_mb={rss_mb():.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
