#!/usr/bin/env python3
"""Writes the loader test fixtures under tests/fixtures/loader/ (dev-time only).

Independent references for tests/test_loader.c, produced with numpy, gguf-py and
safetensors (never with rootspec):
  tiny_llama3.gguf the same weights in F16 with Llama-3.1 rope scaling as rope_freqs.weight.
  tiny.gguf        llama, 2 layers, dim 32, F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors, q/k rows
                   permuted the way llama.cpp's converter does, alignment 64, vocab taken
                   from the token list (no llama.vocab_size), nested/typed metadata.
  hf_llama/        LlamaForCausalLM, BF16, untied lm_head, llama3 rope_scaling, eos list.
  hf_sharded/      same weights, tied, two shards (F16 + F32) with an index, plus an unused
                   I64 tensor that the loader must ignore.
  hf_qwen2/        Qwen2ForCausalLM, 1 layer, q/k/v biases, F32.
  hf_qwen3/        Qwen3ForCausalLM, 1 layer, head_dim 16 != dim/heads, q_norm/k_norm, F32.
  expected.json + expected.bin
                   index + raw little-endian f32 values: the original (HF layout) weights
                   and, for quantized GGUF tensors, gguf.quants.dequantize of the stored
                   blocks (un-permuted back to HF layout by numpy for q/k).
  default_model.json + default_model.bin
                   config and some dequantized rows of models/SmolLM2-135M-Instruct.Q4_1.gguf
                   read with gguf-py (skipped when the model is absent).
Original weights lie on a 1/32 grid with |w| <= 2, so F16/BF16/F32 hold them exactly.
Run from the repository root: python3 tools/gen_loader_fixtures.py
"""
import json
import os
import shutil

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from safetensors.numpy import save_file

OUT = "tests/fixtures/loader"
MAGIC = b"RSLDFX01"  # expected.bin / default_model.bin start: magic, u32 version, then f32s
VERSION = 1
DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB = 32, 64, 2, 4, 2, 64
HD = DIM // HEADS
rng = np.random.default_rng(1234)


def grid(*shape):
    return (np.clip(np.round(rng.normal(0, 0.5, shape) * 32), -64, 64) / 32).astype(np.float32)


def norm_w(n):
    return (1 + np.round(rng.normal(0, 0.1, n) * 32) / 32).astype(np.float32)


def permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF rotate-half -> interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Blob:
    """Collects named f32 arrays into one binary file plus a JSON index."""

    def __init__(self):
        self.parts, self.index, self.n = [], {}, 0

    def add(self, name, arr):
        a = np.ascontiguousarray(arr, dtype="<f4")
        self.index[name] = {"offset": self.n, "shape": list(a.shape)}
        self.parts.append(a.reshape(-1))
        self.n += a.size

    def write(self, stem, extra):
        with open(f"{OUT}/{stem}.bin", "wb") as f:
            f.write(MAGIC + np.uint32(VERSION).tobytes())
            for p in self.parts:
                f.write(p.tobytes())
        doc = {"magic": MAGIC.decode(), "version": VERSION, "bin": f"{stem}.bin",
               "floats": self.n, "tensors": self.index}
        doc.update(extra)
        with open(f"{OUT}/{stem}.json", "w") as f:
            json.dump(doc, f, indent=1)


def hf_weights():
    w = {"model.embed_tokens.weight": grid(VOCAB, DIM), "model.norm.weight": norm_w(DIM),
         "lm_head.weight": grid(VOCAB, DIM)}
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm_w(DIM)
        w[p + "self_attn.q_proj.weight"] = grid(HEADS * HD, DIM)
        w[p + "self_attn.k_proj.weight"] = grid(KV_HEADS * HD, DIM)
        w[p + "self_attn.v_proj.weight"] = grid(KV_HEADS * HD, DIM)
        w[p + "self_attn.o_proj.weight"] = grid(DIM, HEADS * HD)
        w[p + "post_attention_layernorm.weight"] = norm_w(DIM)
        w[p + "mlp.gate_proj.weight"] = grid(HIDDEN, DIM)
        w[p + "mlp.up_proj.weight"] = grid(HIDDEN, DIM)
        w[p + "mlp.down_proj.weight"] = grid(DIM, HIDDEN)
    return w


GGUF_NAMES = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
              "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
              "self_attn.o_proj.weight": "attn_output.weight",
              "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
              "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
TYPES = {  # GGUF tensor types: every supported type appears, quantized q and k included
    "token_embd.weight": QT.Q8_0, "output.weight": QT.Q4_0, "output_norm.weight": QT.F32,
    "blk.0.attn_q.weight": QT.F32, "blk.0.attn_k.weight": QT.F16, "blk.0.attn_v.weight": QT.BF16,
    "blk.0.attn_output.weight": QT.Q8_0, "blk.0.ffn_gate.weight": QT.Q4_0,
    "blk.0.ffn_up.weight": QT.Q4_1, "blk.0.ffn_down.weight": QT.F16,
    "blk.1.attn_q.weight": QT.Q4_1, "blk.1.attn_k.weight": QT.Q8_0, "blk.1.attn_v.weight": QT.Q4_0,
    "blk.1.attn_output.weight": QT.F16, "blk.1.ffn_gate.weight": QT.Q8_0,
    "blk.1.ffn_up.weight": QT.BF16, "blk.1.ffn_down.weight": QT.Q4_1,
}


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, l, rest = hf.split(".", 3)
    return f"blk.{l}.{GGUF_NAMES[rest]}"


def write_tiny_gguf(w, blob):
    wr = gguf.GGUFWriter(f"{OUT}/tiny.gguf", arch="llama")
    wr.add_name("tiny-test")
    wr.add_custom_alignment(64)
    wr.add_context_length(2048)
    wr.add_embedding_length(DIM)
    wr.add_feed_forward_length(HIDDEN)
    wr.add_block_count(LAYERS)
    wr.add_head_count(HEADS)
    wr.add_head_count_kv(KV_HEADS)
    wr.add_rope_freq_base(500000.0)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_tokenizer_model("gpt2")
    wr.add_token_list([f"tok{i}" for i in range(VOCAB)])
    wr.add_token_types([1] * (VOCAB - 1) + [3])
    wr.add_token_scores([float(-i) for i in range(VOCAB)])
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    wr.add_chat_template("{{'<|start_header_id|>' + role}}")
    # value types the accessors must read: nested array, i8/i16/u64/i64/f64/bool scalars
    wr.add_array("test.nested", [[1, 2, 3], [4, 5]])
    wr.add_key_value("test.i8", -5, gguf.GGUFValueType.INT8)
    wr.add_key_value("test.i16", -300, gguf.GGUFValueType.INT16)
    wr.add_key_value("test.u64", 1 << 40, gguf.GGUFValueType.UINT64)
    wr.add_key_value("test.i64", -(1 << 40), gguf.GGUFValueType.INT64)
    wr.add_key_value("test.f64", 0.25, gguf.GGUFValueType.FLOAT64)
    wr.add_key_value("test.bool", True, gguf.GGUFValueType.BOOL)
    for hf, arr in w.items():
        name = gguf_name(hf)
        qt = TYPES.get(name, QT.F32)
        if ".attn_q." in name:
            arr = permute(arr, HEADS)
        elif ".attn_k." in name:
            arr = permute(arr, KV_HEADS)
        if qt == QT.F32:
            wr.add_tensor(name, arr)
            continue
        q = gguf.quants.quantize(arr, qt)
        wr.add_tensor(name, q, raw_dtype=qt)
        if qt in (QT.Q8_0, QT.Q4_0, QT.Q4_1):
            deq = gguf.quants.dequantize(q, qt).reshape(arr.shape)
            if ".attn_q." in name:
                deq = unpermute(deq, HEADS)
            elif ".attn_k." in name:
                deq = unpermute(deq, KV_HEADS)
            blob.add("gguf:" + name, deq)
        else:  # F16/BF16 hold grid values exactly
            assert np.array_equal(gguf.quants.dequantize(q, qt).reshape(arr.shape), arr), name
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def llama3_rope_factors(theta, head_dim, factor=8.0, low=1.0, high=4.0, orig=8192):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (Llama-3.1 rope_freqs)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < orig / high:
            out.append(1)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_llama3_gguf(w):
    """Llama-3.1-style GGUF: rope scaling only as a rope_freqs.weight tensor (written first,
    so its data starts the data section); F16 matrices; no token list, llama.vocab_size."""
    wr = gguf.GGUFWriter(f"{OUT}/tiny_llama3.gguf", arch="llama")
    wr.add_name("Llama 3.2 Tiny")
    wr.add_vocab_size(VOCAB)
    wr.add_context_length(131072)
    wr.add_embedding_length(DIM)
    wr.add_feed_forward_length(HIDDEN)
    wr.add_block_count(LAYERS)
    wr.add_head_count(HEADS)
    wr.add_head_count_kv(KV_HEADS)
    wr.add_key_length(HD)
    wr.add_value_length(HD)
    wr.add_rope_freq_base(500000.0)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_bos_token_id(60)
    wr.add_eos_token_id(63)
    f = llama3_rope_factors(500000.0, HD)
    assert f[0] == 1 and f[-1] == 8 and 1 < f[2] < 8, f  # every branch of the formula
    wr.add_tensor("rope_freqs.weight", f)
    for hf, arr in w.items():
        name = gguf_name(hf)
        if ".attn_q." in name:
            arr = permute(arr, HEADS)
        elif ".attn_k." in name:
            arr = permute(arr, KV_HEADS)
        wr.add_tensor(name, arr if arr.ndim == 1 else arr.astype(np.float16))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def write_hf(sub, cfg, tensors, shards=None):
    d = f"{OUT}/{sub}"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(f"{d}/config.json", "w") as f:
        json.dump(cfg, f, indent=1)
    if shards is None:
        save_file(tensors, f"{d}/model.safetensors", metadata={"format": "pt"})
        return
    wm = {}
    for i, names in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, f"{d}/{fn}", metadata={"format": "pt"})
        wm.update({n: fn for n in names})
    with open(f"{d}/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f, indent=1)


def bf16(a):
    """BF16 bit patterns as uint16 (exact for grid values); safetensors.numpy has no bf16."""
    return (a.view(np.uint32) >> 16).astype(np.uint16)


def save_bf16(path, tensors):
    """safetensors by hand for BF16: 8-byte length, JSON header, raw data."""
    hdr, data, off = {"__metadata__": {"format": "pt"}}, [], 0
    for n, a in tensors.items():
        b = bf16(a).tobytes()
        hdr[n] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        data.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(np.uint64(len(h)).tobytes() + h + b"".join(data))


def llama_cfg(**kw):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": DIM,
         "intermediate_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
         "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 2048,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "bos_token_id": 1,
         "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    c.update(kw)
    return c


def main():
    os.makedirs(OUT, exist_ok=True)
    # the un-permute used for references must invert the converter's permute
    x = rng.normal(size=(HEADS * HD, 3)).astype(np.float32)
    assert np.array_equal(unpermute(permute(x, HEADS), HEADS), x)
    w = hf_weights()
    blob = Blob()
    for n, a in w.items():
        blob.add(n, a)
    write_tiny_gguf(w, blob)
    write_llama3_gguf(w)

    # hf_llama: BF16, untied, llama3 rope scaling, eos as a list
    write_hf("hf_llama", llama_cfg(eos_token_id=[2, 3], rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024}), {})
    save_bf16(f"{OUT}/hf_llama/model.safetensors", w)

    # hf_sharded: tied, F16 shard + F32 shard, plus an unused I64 tensor
    t = {n: (a.astype(np.float16) if ".layers.0." in n else a) for n, a in w.items() if n != "lm_head.weight"}
    t["model.unused_positions"] = np.arange(4, dtype=np.int64)
    names = sorted(t)
    write_hf("hf_sharded", llama_cfg(tie_word_embeddings=True), t,
             shards=[[n for n in names if ".layers.0." in n], [n for n in names if ".layers.0." not in n]])

    # hf_qwen2: one layer of the llama weights + biases
    q2 = {n: a for n, a in w.items() if ".layers.1." not in n and n != "lm_head.weight"}
    for p, rows in (("q", HEADS * HD), ("k", KV_HEADS * HD), ("v", KV_HEADS * HD)):
        q2[f"model.layers.0.self_attn.{p}_proj.bias"] = grid(rows)
        blob.add(f"qwen2:model.layers.0.self_attn.{p}_proj.bias", q2[f"model.layers.0.self_attn.{p}_proj.bias"])
    write_hf("hf_qwen2", {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": DIM,
                          "intermediate_size": HIDDEN, "num_hidden_layers": 1, "num_attention_heads": HEADS,
                          "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
                          "rope_theta": 1000000.0, "hidden_act": "silu", "tie_word_embeddings": True,
                          "bos_token_id": None, "eos_token_id": 5, "max_position_embeddings": 4096}, q2)

    # hf_qwen3: head_dim 16 (dim/heads would be 8), q_norm/k_norm
    Q3HD = 16
    q3 = {n: a for n, a in q2.items() if "bias" not in n}
    q3["model.layers.0.self_attn.q_proj.weight"] = grid(HEADS * Q3HD, DIM)
    q3["model.layers.0.self_attn.k_proj.weight"] = grid(KV_HEADS * Q3HD, DIM)
    q3["model.layers.0.self_attn.v_proj.weight"] = grid(KV_HEADS * Q3HD, DIM)
    q3["model.layers.0.self_attn.o_proj.weight"] = grid(DIM, HEADS * Q3HD)
    q3["model.layers.0.self_attn.q_norm.weight"] = norm_w(Q3HD)
    q3["model.layers.0.self_attn.k_norm.weight"] = norm_w(Q3HD)
    for n in q3:
        if "self_attn" in n:
            blob.add("qwen3:" + n, q3[n])
    write_hf("hf_qwen3", {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": DIM,
                          "intermediate_size": HIDDEN, "num_hidden_layers": 1, "num_attention_heads": HEADS,
                          "num_key_value_heads": KV_HEADS, "head_dim": Q3HD, "vocab_size": VOCAB,
                          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
                          "tie_word_embeddings": True, "attention_bias": False, "bos_token_id": 3,
                          "eos_token_id": 4, "max_position_embeddings": 40960}, q3)
    blob.write("expected", {"note": "originals (HF layout) by HF name; gguf:NAME = gguf.quants.dequantize "
                                    "of the stored blocks, q/k un-permuted to HF layout by numpy"})
    write_default_model()


def write_default_model(path="models/SmolLM2-135M-Instruct.Q4_1.gguf"):
    if not os.path.exists(path):
        print(f"{path} missing: default_model fixture not regenerated")
        return
    r = gguf.GGUFReader(path)
    f = {k: v for k, v in r.fields.items()}

    def val(k):
        return f[k].contents()

    heads, kv = val("llama.attention.head_count"), val("llama.attention.head_count_kv")
    t = {x.name: x for x in r.tensors}

    def deq(name):
        x = t[name]
        return gguf.quants.dequantize(x.data, x.tensor_type).reshape([int(d) for d in reversed(x.shape)])

    blob = Blob()
    rows = {"token_embd.weight": [0, 1, 2, 1000, 49151], "blk.0.attn_q.weight": [0, 1, 31, 32, 63, 64, 575],
            "blk.0.attn_k.weight": [0, 1, 33, 191], "blk.29.ffn_down.weight": [7, 575],
            "blk.15.ffn_up.weight": [100], "blk.3.attn_v.weight": [5]}
    for name, rs in rows.items():
        a = deq(name)
        if name.endswith("attn_q.weight"):
            a = unpermute(a, heads)
        elif name.endswith("attn_k.weight"):
            a = unpermute(a, kv)
        blob.add(name, a[rs])
    blob.add("blk.0.attn_norm.weight", deq("blk.0.attn_norm.weight"))
    blob.add("output_norm.weight", deq("output_norm.weight"))
    cfg = {"dim": val("llama.embedding_length"), "hidden_dim": val("llama.feed_forward_length"),
           "n_layers": val("llama.block_count"), "n_heads": heads, "n_kv_heads": kv,
           "vocab_size": val("llama.vocab_size"), "max_seq_len": val("llama.context_length"),
           "norm_eps": val("llama.attention.layer_norm_rms_epsilon"), "rope_theta": val("llama.rope.freq_base"),
           "bos_id": val("tokenizer.ggml.bos_token_id"), "eos_id": val("tokenizer.ggml.eos_token_id"),
           "tied": "output.weight" not in t,
           "types": {n: t[n].tensor_type.name for n in ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight"]}}
    blob.write("default_model", {"rows": rows, "config": cfg, "model": os.path.basename(path)})


if __name__ == "__main__":
    main()
