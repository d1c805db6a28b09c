"""Reference log-probabilities for rootspec-serve's logprobs (dev-time only): a Llama
forward in numpy from a GGUF's dequantized weights (the gguf package), independent of the
engine's kernels.

    python3 tools/logprobs_ref.py --model M.gguf --port P [--prompt TEXT] [--max-tokens N]

asks a running rootspec-serve (AR or speculative) for a T=0 completion with logprobs (the
prompt sent as the token ids /tokenize gives), recomputes each output token's row from the
prompt and the tokens before it, and prints the largest differences of the token's
log-probability and of its top-5 alternatives (the raw T=1 distribution, which the server
reports at temperature 0). Needs numpy and gguf (pip install numpy gguf).
"""
import argparse
import json
import math
import sys
import urllib.request

import gguf
import numpy as np


def field(r, name):
    f = r.fields[name]
    return f.parts[f.data[0]][0]


def load(path):
    r = gguf.GGUFReader(path)
    w = {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
         .reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
    cfg = {k: field(r, "llama." + k) for k in ("block_count", "attention.head_count", "attention.head_count_kv",
                                                "rope.freq_base", "attention.layer_norm_rms_epsilon")}
    return w, cfg


def rmsnorm(x, g, eps):
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps).astype(np.float32) * g


def rope(x, base):  # llama.cpp's LLAMA rope (adjacent pairs) on the GGUF's permuted weights
    n, h, d = x.shape
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(n)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
    out = np.empty_like(x, dtype=np.float64)
    out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out.astype(np.float32)


def forward(w, cfg, ids):
    nh, nkv, eps = int(cfg["attention.head_count"]), int(cfg["attention.head_count_kv"]), float(cfg["attention.layer_norm_rms_epsilon"])
    emb = w["token_embd.weight"]
    x = emb[ids].copy()
    n = len(ids)
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    for l in range(int(cfg["block_count"])):
        p = f"blk.{l}."
        h = rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(n, nh, -1)
        k = (h @ w[p + "attn_k.weight"].T).reshape(n, nkv, -1)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, nkv, -1)
        d = q.shape[-1]
        q, k = rope(q, float(cfg["rope.freq_base"])), rope(k, float(cfg["rope.freq_base"]))
        o = np.empty_like(q)
        for hh in range(nh):
            kv = hh // (nh // nkv)
            a = q[:, hh] @ k[:, kv].T / math.sqrt(d) + mask
            a = np.exp(a - a.max(-1, keepdims=True))
            o[:, hh] = (a / a.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + o.reshape(n, -1) @ w[p + "attn_output.weight"].T
        h = rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    x = rmsnorm(x, w["output_norm.weight"], eps)
    return x @ w.get("output.weight", emb).T


def post(port, path, obj):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(obj).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--max-tokens", type=int, default=16)
    a = ap.parse_args()
    prompt = post(a.port, "/tokenize", {"content": a.prompt, "add_special": True})["tokens"]
    out = post(a.port, "/v1/completions", {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
                                           "logprobs": 5})["choices"][0]["logprobs"]
    toks = post(a.port, "/tokenize", {"content": "".join(out["tokens"])})["tokens"]
    w, cfg = load(a.model)
    ids = prompt + toks
    logits = forward(w, cfg, np.array(ids[:-1])).astype(np.float64)
    lsm = logits - logits.max(-1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(-1, keepdims=True))
    worst_tok = worst_top = 0.0
    for i, tok in enumerate(toks[:len(out["token_logprobs"])]):
        row = lsm[len(prompt) - 1 + i]
        worst_tok = max(worst_tok, abs(row[tok] - out["token_logprobs"][i]))
        ref_top = np.sort(row)[::-1][:5]
        got_top = sorted(out["top_logprobs"][i].values(), reverse=True)
        worst_top = max(worst_top, max(abs(x - y) for x, y in zip(ref_top, got_top)))
    print(f"{len(toks)} tokens: max |logprob - reference| {worst_tok:.2e}, top-5 {worst_top:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
