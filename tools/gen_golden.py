#!/usr/bin/env python3
"""Writes the golden-forward fixtures for tests/test_golden.c (dev-time only; needs torch,
transformers, tokenizers, gguf, numpy, and accelerate, which transformers requires to
load GGUF files). Run from the repo root:

    python3 tools/gen_golden.py            # tiny random models + default-model top-10
    python3 tools/gen_golden.py --tiny     # only the tiny models (no default model needed)

Tiny models (tests/fixtures/golden/<name>/): random Llama / Llama-3-rope-scaled / Qwen2 /
Qwen3 configs saved with save_pretrained (safetensors) plus a minimal byte-level
tokenizer.json, and logits.bin = transformers' logits for a fixed token sequence:

    "RSGL" u32 version=1 u32 n_tokens u32 vocab i32 tokens[n_tokens] f32 logits[n_tokens*vocab]

The llama model is also written as GGUF (llama.gguf, F32 tensors, q/k rows permuted the way
llama.cpp's convert_hf_to_gguf.py does, minimal tokenizer.ggml.* metadata); transformers
reloads that GGUF and must reproduce the same logits, which checks the permutation here.

Default model (tests/fixtures/golden/smollm2_top10.bin): transformers dequantizes the Q4_1
GGUF to f32; for 3 prompts we store the top-10 ids and logits at 4 positions each:

    "RSTK" u32 version=1 u32 n_prompts
    per prompt: u32 n_tokens i32 tokens[n] u32 n_pos u32 k
                per position: u32 pos i32 ids[k] f32 logits[k]
"""
import argparse
import copy
import json
import os
import struct
import sys

import numpy as np
import torch

OUT = "tests/fixtures/golden"
VOCAB = 258  # 256 byte tokens + "he" + "<|endoftext|>"
SEED = 1234


def byte_alphabet():
    """GPT-2 bytes_to_unicode: the printable stand-in character of each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(
        range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [chr(m[b]) for b in range(256)]


def vocab_tokens():
    return byte_alphabet() + ["he", "<|endoftext|>"]


def write_tokenizer_json(d):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    toks = vocab_tokens()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(toks[:-1])}, merges=[("h", "e")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    assert tok.token_to_id("<|endoftext|>") == VOCAB - 1
    tok.save(os.path.join(d, "tokenizer.json"))


def randomize(model, seed):
    """HF's init (std 0.02) gives near-uniform logits that would hide errors; use unit-scale
    weights so every layer matters, norms around 1, and visible biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / (p.shape[1] ** 0.5))


def write_rsgl(path, tokens, logits):
    logits = np.ascontiguousarray(logits, dtype="<f4")
    n, v = logits.shape
    with open(path, "wb") as f:
        f.write(b"RSGL" + struct.pack("<III", 1, n, v))
        f.write(np.asarray(tokens, dtype="<i4").tobytes())
        f.write(logits.tobytes())


def classic_config(d, cfg):
    """transformers 5 writes rope settings as "rope_parameters"; real checkpoints (and our
    loader) use the classic top-level rope_theta / rope_scaling keys: write both."""
    p = os.path.join(d, "config.json")
    j = json.load(open(p))
    rp = j.get("rope_parameters") or {}
    j["rope_theta"] = rp.get("rope_theta", 10000.0)
    if rp.get("rope_type", "default") != "default":
        j["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    else:
        j["rope_scaling"] = None
    json.dump(j, open(p, "w"), indent=2, sort_keys=True)


def permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF rotate-half -> GGUF interleaved)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def write_gguf(path, model, cfg):
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("rootspec golden llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab_tokens())
    w.add_token_types([gguf.TokenType.NORMAL] * (VOCAB - 1) + [gguf.TokenType.CONTROL])
    w.add_token_merges(["h e"])
    w.add_bos_token_id(VOCAB - 1)
    w.add_eos_token_id(VOCAB - 1)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(b + "attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], nh))
        w.add_tensor(b + "attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], nkv))
        w.add_tensor(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_models():
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                              Qwen3Config, Qwen3ForCausalLM)
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                  max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=VOCAB - 1,
                  eos_token_id=VOCAB - 1)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    # name, model class, config, dtype saved, n_tokens
    return [
        ("llama", LlamaForCausalLM,
         LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=True), torch.float32, 24),
        # orig context 32 with head_dim 16: wavelengths 6.3 (kept), 19.9 (smoothed) and
        # >= 62.8 (divided by 8), so every position past 0 sees the scaling; 40 tokens.
        ("llama3_rope", LlamaForCausalLM,
         LlamaConfig(**common, rope_theta=10000.0, rope_scaling=llama3,
                     tie_word_embeddings=False), torch.float32, 40),
        ("qwen2", Qwen2ForCausalLM,
         Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=False), torch.float16,
         24),
        ("qwen3", Qwen3ForCausalLM,
         Qwen3Config(**common, head_dim=24, rope_theta=1000000.0, tie_word_embeddings=True),
         torch.float32, 24),
    ]


@torch.no_grad()
def gen_tiny():
    for k, (name, cls, cfg, dtype, n_tok) in enumerate(tiny_models()):
        torch.manual_seed(SEED + k)
        model = cls(cfg).float().eval()
        randomize(model, SEED + k)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
        # Round to the saved dtype first so the reference sees exactly the stored weights.
        # (parameters only: a module-wide .to(float16) would also round the RoPE buffers).
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
        copy.deepcopy(model).to(dtype).save_pretrained(d, safe_serialization=True)
        classic_config(d, cfg)
        write_tokenizer_json(d)
        reloaded = cls.from_pretrained(d, dtype=torch.float32).eval()
        g = torch.Generator().manual_seed(SEED + 100 + k)
        tokens = torch.randint(0, VOCAB, (n_tok,), generator=g)
        logits = reloaded(tokens[None]).logits[0].float().numpy()
        direct = model(tokens[None]).logits[0].float().numpy()
        assert np.allclose(logits, direct, atol=1e-5), f"{name}: reload changed logits by {np.abs(logits - direct).max()}"
        write_rsgl(os.path.join(d, "logits.bin"), tokens.tolist(), logits)
        info = f"{name}: {cls.__name__}, saved as {dtype}, {n_tok} tokens, |logits| max " \
               f"{np.abs(logits).max():.2f}"
        if name == "llama":
            from transformers import AutoModelForCausalLM
            write_gguf(os.path.join(d, "llama.gguf"), model, reloaded.config)
            gm = AutoModelForCausalLM.from_pretrained(d, gguf_file="llama.gguf",
                                                      dtype=torch.float32).eval()
            gl = gm(tokens[None]).logits[0].float().numpy()
            err = np.abs(gl - logits).max()
            assert err < 1e-4, f"GGUF round trip through transformers differs by {err}"
            info += f"; GGUF reloaded by transformers: max |d| {err:.2e}"
        print(info)


@torch.no_grad()
def gen_default():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gg = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained("models", gguf_file=gg)
    model = AutoModelForCausalLM.from_pretrained("models", gguf_file=gg,
                                                 dtype=torch.float32).eval()
    prompts = [
        "The capital of France is Paris, and the capital of Germany is",
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    ]
    k = 10
    with open(os.path.join(OUT, "smollm2_top10.bin"), "wb") as f:
        f.write(b"RSTK" + struct.pack("<II", 1, len(prompts)))
        for text in prompts:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            n = len(ids)
            assert 10 <= n <= 24, (text, n)
            logits = model(torch.tensor([ids])).logits[0].float()
            positions = sorted({n // 4, n // 2, (3 * n) // 4, n - 1})
            f.write(struct.pack("<I", n) + np.asarray(ids, dtype="<i4").tobytes())
            f.write(struct.pack("<II", len(positions), k))
            for p in positions:
                v, i = torch.topk(logits[p], k)
                f.write(struct.pack("<I", p) + i.numpy().astype("<i4").tobytes() +
                        v.numpy().astype("<f4").tobytes())
            print(f"prompt of {n} tokens, positions {positions}, top-1 at end: "
                  f"{tok.decode([int(logits[-1].argmax())])!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="only the tiny random models")
    a = ap.parse_args()
    if not os.path.isdir("tests/fixtures"):
        sys.exit("run from the repository root")
    os.makedirs(OUT, exist_ok=True)
    gen_tiny()
    if not a.tiny:
        gen_default()


if __name__ == "__main__":
    main()
