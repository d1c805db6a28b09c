#!/usr/bin/env python3
"""Writes GGUF versions of the tiny Qwen2 / Qwen3 golden models (dev-time only; needs numpy
and gguf; with torch + transformers installed it also checks each GGUF through
transformers' own GGUF loader). Run from the repository root after tools/gen_golden.py:

    python3 tools/gen_gguf_arch_fixtures.py

tests/fixtures/golden/qwen2/qwen2.gguf  architecture qwen2: F16 matrices (as the
    safetensors hold them), F32 norms and q/k/v biases, untied output.weight.
tests/fixtures/golden/qwen3/qwen3.gguf  architecture qwen3: F32, head_dim 24 != dim/heads
    (qwen3.attention.key_length), attn_q_norm / attn_k_norm, tied embeddings.

Tensor names and metadata keys follow llama.cpp's convert_hf_to_gguf.py (Qwen2Model,
Qwen3Model): q/k rows are NOT permuted (these architectures use NeoX RoPE in llama.cpp),
tokenizer.ggml.* is the byte-level vocabulary of the golden llama.gguf. The reference logits
stay the transformers logits.bin next to each model: rootspec loading the GGUF must match
them like the safetensors directory does; transformers reloading the GGUF must too (checked
here when transformers is installed).
"""
import json
import os
import struct
import sys

import numpy as np
import gguf

GOLDEN = "tests/fixtures/golden"
ST_DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    """{name: array} from a safetensors file (F32/F16 only; enough for these fixtures)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=ST_DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def copy_tokenizer(w):
    """The byte-level tokenizer metadata of the golden llama.gguf (same 258-token vocab)."""
    r = gguf.GGUFReader(f"{GOLDEN}/llama/llama.gguf")
    f = r.fields
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(f["tokenizer.ggml.tokens"].contents())
    w.add_token_types(f["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(f["tokenizer.ggml.merges"].contents())


TENSOR_NAMES = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
                "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_proj.bias": "attn_q.bias",
                "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
                "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
                "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{TENSOR_NAMES[rest]}"


def write(name):
    d = f"{GOLDEN}/{name}"
    cfg = json.load(open(f"{d}/config.json"))
    st = read_safetensors(f"{d}/model.safetensors")
    path = f"{d}/{name}.gguf"
    w = gguf.GGUFWriter(path, name)
    w.add_name(f"rootspec golden {name}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if "head_dim" in cfg:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if name == "qwen2" else gguf.LlamaFileType.ALL_F32)
    copy_tokenizer(w)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    for hf, a in st.items():
        if a.ndim == 1:  # norms and biases in F32 (exact: the F16 values widen)
            a = a.astype(np.float32)
        w.add_tensor(gguf_name(hf), np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {os.path.getsize(path)} bytes, {len(st)} tensors")
    return path


def read_rsgl(path):
    with open(path, "rb") as f:
        magic, ver, n, v = struct.unpack("<4sIII", f.read(16))
        assert magic == b"RSGL" and ver == 1
        toks = np.frombuffer(f.read(4 * n), "<i4")
        logits = np.frombuffer(f.read(4 * n * v), "<f4").reshape(n, v)
    return toks, logits


def check_with_transformers(name):
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        print(f"{name}: transformers not installed, GGUF not cross-checked")
        return
    d = f"{GOLDEN}/{name}"
    toks, ref = read_rsgl(f"{d}/logits.bin")
    # transformers' GGUF config mapping ignores qwen3.attention.key_length (it assumes the
    # default head_dim 128), so the tiny Qwen3 takes its config from config.json; the
    # tensors still come from the GGUF through transformers' own name mapping.
    kw = {"config": AutoConfig.from_pretrained(d)} if name == "qwen3" else {}
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f"{name}.gguf", dtype=torch.float32, **kw).eval()
    with torch.no_grad():
        got = m(torch.tensor(toks.astype(np.int64))[None]).logits[0].float().numpy()
    err = np.abs(got - ref).max()
    assert err < 1e-4, f"{name}: transformers on the GGUF differs from logits.bin by {err}"
    print(f"{name}: transformers on {name}.gguf reproduces logits.bin, max |d| {err:.2e}")


def main():
    if not os.path.isdir("tests/fixtures"):
        sys.exit("run from the repository root")
    for name in ("qwen2", "qwen3"):
        write(name)
        check_with_transformers(name)


if __name__ == "__main__":
    main()
