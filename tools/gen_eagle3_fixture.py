#!/usr/bin/env python3
"""Writes the EAGLE-3 head fixtures under tests/fixtures/eagle3/ (dev-time only; needs
torch, numpy, safetensors: python3 -m venv /work/venv-eagle && pip install torch numpy
safetensors). Run from the repository root: python3 tools/gen_eagle3_fixture.py

An independent reference for tests/test_eagle3.c: a minimal torch re-implementation of
the published EAGLE-3 head, written from the public model code (never from rootspec):
  - SafeAILab/EAGLE eagle/model/cnets.py (EAGLE-3):
      LlamaDecoderLayeremb.forward: residual = hidden_states;
        hidden_states = hidden_norm(hidden_states); input_emb = input_layernorm(input_emb);
        hidden_states = cat((input_emb, hidden_states), -1); self_attn;
        residual + attn; post_attention_layernorm; mlp; residual + mlp
      LlamaAttention: q/k/v_proj = Linear(hidden_size * 2, ...), rotate_half RoPE,
        repeat_kv (GQA), softmax(q k^T / sqrt(head_dim) + mask) in fp32, o_proj
      Model.forward: `if hidden_states.shape[-1] != inputs_embeds.shape[-1]:
        hidden_states = self.fc(hidden_states)` (fc: Linear(3 * target_hidden, hidden))
      Model.topK_genrate: rows pair the state of token p with input_ids[:, 1:] (the next
        token) at position p; `last_headout = self.lm_head(self.norm(last_hidden))`; the
        drafted node's state is the midlayer output of its parent (`input_hidden =
        out_hidden[:, out_ids]`); draft ids map to target ids as `topk_index +
        self.d2t[topk_index]`; tree nodes at one depth share position len_posi + i and see
        their ancestors through tree_mask.
  - SGLang python/sglang/srt/models/llama_eagle3.py (same layer; d2t as offsets:
    "hot_token_id = loaded_weight + torch.arange(...)"); vLLM
    vllm/model_executor/models/llama_eagle3.py (checkpoint names without the "model."
    prefix, "midlayer." for the layer, d2t/t2d buffers).
Everything runs in float64 so the fixture is the exact math, not another f32 rounding.

Files:
  target/       LlamaForCausalLM, 2 layers, dim 32, vocab 96 (F32): supplies the token
                embeddings of head/ and the config eagle3_head_check compares against.
  head/         LlamaForCausalLMEagle3, hidden 32, draft_vocab 40, no embed_tokens (uses the
                target's), F16 weights, d2t (I64 offsets) + t2d (BOOL), no rope_theta (the
                LlamaConfig default 10000, as the published Llama-3.1-8B head), feature
                layers in eagle_config.
  head_embed/   hidden 48, target_hidden_size 32, its own embed_tokens, draft vocabulary =
                the target's (no d2t/t2d: identity), rope_theta 500000 with llama3 scaling,
                feature layers at the top level, BF16 weights.
  bad_missing/  head/ without midlayer.mlp.up_proj.weight.
  bad_draft_vocab/  head/ whose config says draft_vocab_size 48 (lm_head has 40 rows).
  bad_d2t/      head/ with d2t[7] mapping outside the vocabulary.
  expected.json the drafting script per head (commit rows with target features, expansions
                of tree nodes under ancestor masks, a second commit, another expansion) with
                the reference's logits, output states and top-10 target ids per row.
Weights lie on a 1/32 grid with |w| <= 2 (F16/BF16 hold them exactly).
"""
import json
import math
import os
import shutil

import numpy as np
import torch
from safetensors.numpy import save_file

OUT = "tests/fixtures/eagle3"
MAGIC, VERSION = "RSE3FX01", 1
TOPK = 10
torch.set_default_dtype(torch.float64)
rng = np.random.default_rng(int(os.environ.get("EAGLE3_FIXTURE_SEED", "1")))

TARGET = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=96, rms_norm_eps=1e-5, rope_theta=10000.0)
FEATURE_LAYERS = [0, 1, 2]  # entering layers 0, 1, 2 of the 2-layer target (see eagle3.h)


def grid(*shape, sd=0.5):
    return (np.clip(np.round(rng.normal(0, sd, shape) * 32), -64, 64) / 32).astype(np.float32)


def norm_w(n):
    return (1 + np.round(rng.normal(0, 0.1, n) * 32) / 32).astype(np.float32)


def write_target():
    c = TARGET
    d, h, v, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    w = {"model.embed_tokens.weight": grid(v, d), "model.norm.weight": norm_w(d),
         "lm_head.weight": grid(v, d, sd=0.2)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w.update({p + "input_layernorm.weight": norm_w(d), p + "post_attention_layernorm.weight": norm_w(d),
                  p + "self_attn.q_proj.weight": grid(q, d, sd=0.2), p + "self_attn.k_proj.weight": grid(kv, d, sd=0.2),
                  p + "self_attn.v_proj.weight": grid(kv, d, sd=0.2), p + "self_attn.o_proj.weight": grid(d, q, sd=0.2),
                  p + "mlp.gate_proj.weight": grid(h, d, sd=0.2), p + "mlp.up_proj.weight": grid(h, d, sd=0.2),
                  p + "mlp.down_proj.weight": grid(d, h, sd=0.2)})
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               tie_word_embeddings=False, **c)
    save_dir("target", cfg, w)
    return w["model.embed_tokens.weight"]


def save_dir(name, cfg, tensors, dtype=None):
    path = os.path.join(OUT, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    out = {}
    for k, a in tensors.items():
        if dtype == "f16" and a.dtype == np.float32:
            a = a.astype(np.float16)
        out[k] = a
    if dtype == "bf16":  # safetensors.numpy has no bfloat16: write via torch
        from safetensors.torch import save_file as save_torch
        tt = {k: (torch.from_numpy(a).to(torch.bfloat16) if a.dtype == np.float32 else torch.from_numpy(a))
              for k, a in out.items()}
        save_torch(tt, os.path.join(path, "model.safetensors"))
    else:
        save_file(out, os.path.join(path, "model.safetensors"))


def head_weights(hidden, inter, heads, kv_heads, head_dim, target_hidden, draft_vocab, vocab, own_embed):
    q, kv = heads * head_dim, kv_heads * head_dim
    w = {"fc.weight": grid(hidden, 3 * target_hidden, sd=0.15),
         "midlayer.input_layernorm.weight": norm_w(hidden),
         "midlayer.hidden_norm.weight": norm_w(hidden),
         "midlayer.self_attn.q_proj.weight": grid(q, 2 * hidden, sd=0.2),
         "midlayer.self_attn.k_proj.weight": grid(kv, 2 * hidden, sd=0.2),
         "midlayer.self_attn.v_proj.weight": grid(kv, 2 * hidden, sd=0.2),
         "midlayer.self_attn.o_proj.weight": grid(hidden, q, sd=0.2),
         "midlayer.post_attention_layernorm.weight": norm_w(hidden),
         "midlayer.mlp.gate_proj.weight": grid(inter, hidden, sd=0.2),
         "midlayer.mlp.up_proj.weight": grid(inter, hidden, sd=0.2),
         "midlayer.mlp.down_proj.weight": grid(hidden, inter, sd=0.2),
         "norm.weight": norm_w(hidden),
         "lm_head.weight": grid(draft_vocab, hidden, sd=0.4)}
    if own_embed:
        w["embed_tokens.weight"] = grid(vocab, hidden)
    return w


def hot_map(draft_vocab, vocab):
    """A published-style map: draft ids are a sorted subset of target ids; d2t = offsets."""
    hot = np.sort(rng.choice(vocab, draft_vocab, replace=False))
    d2t = (hot - np.arange(draft_vocab)).astype(np.int64)
    t2d = np.zeros(vocab, dtype=bool)
    t2d[hot] = True
    return d2t, t2d


def rms(x, w, eps):
    """cnets.py LlamaRMSNorm.forward."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def inv_freq(cfg, head_dim):
    """LlamaRotaryEmbedding's inv_freq; llama3 scaling as transformers'
    _compute_llama3_parameters."""
    base = cfg.get("rope_theta", 10000.0)
    f = 1.0 / (base ** (torch.arange(0, head_dim, 2) / head_dim))
    rs = cfg.get("rope_scaling")
    if not rs:
        return f
    factor, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    scaled = torch.where(wavelen > old / lo, f / factor, f)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


class Eagle3Ref:
    """The head with an explicit KV cache: slots in insertion order, each row attends to
    the slots it is given (committed rows + its tree ancestors + itself), which is what
    cnets.py's causal mask + tree_mask select."""

    def __init__(self, cfg, w, embed):
        self.c, self.w = cfg, {k: torch.from_numpy(v.astype(np.float64)) for k, v in w.items()}
        self.embed = torch.from_numpy(embed.astype(np.float64))
        self.hd = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        self.inv = inv_freq(cfg, self.hd)
        self.k, self.v = [], []
        self.n_committed = 0

    def drop_pending(self):
        del self.k[self.n_committed:], self.v[self.n_committed:]

    def rope(self, x, pos):  # x (heads, hd)
        ang = pos * self.inv
        emb = torch.cat((ang, ang))
        return x * emb.cos() + rotate_half(x) * emb.sin()

    def row(self, token, h, pos, visible):
        """One row: returns the midlayer output (the next state). visible: earlier slots."""
        w, c, hd, eps = self.w, self.c, self.hd, self.c["rms_norm_eps"]
        nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
        x = torch.cat((rms(self.embed[token], w["midlayer.input_layernorm.weight"], eps),
                       rms(h, w["midlayer.hidden_norm.weight"], eps)))
        q = (w["midlayer.self_attn.q_proj.weight"] @ x).view(nh, hd)
        k = (w["midlayer.self_attn.k_proj.weight"] @ x).view(nkv, hd)
        v = (w["midlayer.self_attn.v_proj.weight"] @ x).view(nkv, hd)
        q, k = self.rope(q, pos), self.rope(k, pos)
        self.k.append(k)
        self.v.append(v)
        slots = list(visible) + [len(self.k) - 1]
        K = torch.stack([self.k[s] for s in slots]).repeat_interleave(nh // nkv, dim=1)  # repeat_kv
        V = torch.stack([self.v[s] for s in slots]).repeat_interleave(nh // nkv, dim=1)
        att = torch.einsum("hd,shd->hs", q, K) / math.sqrt(hd)
        o = torch.einsum("hs,shd->hd", torch.softmax(att, dim=-1), V).reshape(-1)
        h = h + w["midlayer.self_attn.o_proj.weight"] @ o
        m = rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
        g = w["midlayer.mlp.gate_proj.weight"] @ m
        up = w["midlayer.mlp.up_proj.weight"] @ m
        return h + w["midlayer.mlp.down_proj.weight"] @ (torch.nn.functional.silu(g) * up)

    def logits(self, h):
        return self.w["lm_head.weight"] @ rms(h, self.w["norm.weight"], self.c["rms_norm_eps"])

    def commit(self, tokens, feats):
        self.drop_pending()
        for i, t in enumerate(tokens):
            h = self.w["fc.weight"] @ torch.from_numpy(feats[i].astype(np.float64))
            out = self.row(t, h, self.n_committed, range(self.n_committed))
            self.n_committed += 1
        return out


def topk_target(logits, d2t):
    lp = torch.log_softmax(logits, dim=-1)
    order = sorted(range(len(logits)), key=lambda i: (-float(logits[i]), i))
    gap = float(logits[order[TOPK - 1]] - logits[order[TOPK]])
    assert gap > 1e-3, f"top-{TOPK} boundary too close to a tie ({gap}); change the seed"
    ids = [int(i + d2t[i]) for i in order[:TOPK]]
    return ids, [float(lp[i]) for i in order[:TOPK]]


def run_script(ref, d2t, target_hidden, vocab):
    """commit 5 rows; expand depths 1-3 of a small tree; commit 3 more; expand depth 1."""
    steps, rows = [], []  # rows[step] = list of (state tensor, slot)

    def rec_rows(outs):
        return [[float(x) for x in o] for o in outs]

    def commit(tokens):
        feats = grid(len(tokens), 3 * target_hidden, sd=1.0)
        out = ref.commit(tokens, feats)
        lg = ref.logits(out)
        ids, lq = topk_target(lg, d2t)
        steps.append(dict(op="commit", tokens=tokens, features=[[float(x) for x in f] for f in feats],
                          logits=[rec_rows([lg])[0]], state=rec_rows([out]), top10=[ids], top10_logq=[lq]))
        rows.append([(out, None, ids, [])])

    def expand(picks, depth):
        """picks: (parent step, parent row, k-th child of it)."""
        n_pend = len(ref.k) - ref.n_committed
        toks, st_in, pos, mask, outs, new_rows, parents = [], [], [], [], [], [], []
        for (ps, pr, kth) in picks:
            pstate, pslot, pids, panc = rows[ps][pr]
            toks.append(pids[kth])
            st_in.append(pstate)
            pos.append(ref.n_committed - 1 + depth)
            anc = panc + ([pslot] if pslot is not None else [])
            parents.append([ps, pr])
            mask.append(anc)
        for i, t in enumerate(toks):
            out = ref.row(t, st_in[i], pos[i], list(range(ref.n_committed)) + mask[i])
            outs.append(out)
        lgs = [ref.logits(o) for o in outs]
        top = [topk_target(l, d2t) for l in lgs]
        cols = n_pend + len(toks)
        m01 = []
        for i, anc in enumerate(mask):
            r = [0] * cols
            for s in anc:
                r[s - ref.n_committed] = 1
            r[n_pend + i] = 1
            m01.append(r)
        for i, o in enumerate(outs):
            new_rows.append((o, ref.n_committed + n_pend + i, top[i][0], mask[i]))
        steps.append(dict(op="expand", tokens=toks, parents=parents, pos=pos, mask=m01,
                          logits=rec_rows(lgs), state=rec_rows(outs), top10=[t[0] for t in top],
                          top10_logq=[t[1] for t in top]))
        rows.append(new_rows)

    commit([5, 17, 42, 8, 63])
    expand([(0, 0, 0), (0, 0, 1), (0, 0, 2)], 1)
    expand([(1, 0, 0), (1, 0, 1), (1, 2, 0)], 2)
    expand([(2, 0, 0), (2, 1, 3), (2, 2, 0)], 3)
    commit([rows[1][0][2][0], 30, 77])
    expand([(4, 0, 0), (4, 0, 5)], 1)
    assert all(t < vocab for s in steps for t in s["tokens"])
    return steps


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    embed = write_target()
    V, TH = TARGET["vocab_size"], TARGET["hidden_size"]
    heads = []
    # head/: the published Llama-3.1-8B layout in miniature
    cfg = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_act="silu",
               hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
               num_hidden_layers=1, rms_norm_eps=1e-5, vocab_size=V, draft_vocab_size=40,
               max_position_embeddings=2048, tie_word_embeddings=False, torch_dtype="float16",
               eagle_config=dict(eagle_aux_hidden_state_layer_ids=FEATURE_LAYERS, use_aux_hidden_state=True))
    w = head_weights(32, 64, 4, 2, 8, TH, 40, V, own_embed=False)
    d2t, t2d = hot_map(40, V)
    save_dir("head", cfg, {**w, "d2t": d2t, "t2d": t2d}, dtype="f16")
    heads.append(dict(dir="head", target="target", steps=run_script(Eagle3Ref(cfg, w, embed), d2t, TH, V)))
    bad = dict(w)
    del bad["midlayer.mlp.up_proj.weight"]
    save_dir("bad_missing", cfg, {**bad, "d2t": d2t, "t2d": t2d}, dtype="f16")
    save_dir("bad_draft_vocab", {**cfg, "draft_vocab_size": 48}, {**w, "d2t": d2t, "t2d": t2d}, dtype="f16")
    bd = d2t.copy()
    bd[7] = V - 7  # draft id 7 -> target id V, one past the end
    save_dir("bad_d2t", cfg, {**w, "d2t": bd, "t2d": t2d}, dtype="f16")
    # head_embed/: own embeddings, wider than the target, llama3 rope, full draft vocabulary
    cfg2 = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_act="silu",
                hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                num_hidden_layers=1, rms_norm_eps=1e-6, vocab_size=V, draft_vocab_size=V,
                target_hidden_size=TH, rope_theta=500000.0,
                rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=8192),
                eagle_aux_hidden_state_layer_ids=FEATURE_LAYERS, tie_word_embeddings=False)
    w2 = head_weights(48, 96, 4, 2, 12, TH, V, V, own_embed=True)
    save_dir("head_embed", cfg2, w2, dtype="bf16")
    heads.append(dict(dir="head_embed", target="target",
                      steps=run_script(Eagle3Ref(cfg2, w2, w2["embed_tokens.weight"]), np.zeros(V, np.int64), TH, V)))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(dict(magic=MAGIC, version=VERSION, topk=TOPK, heads=heads), f)
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(OUT) for fn in fns)
    print(f"wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
