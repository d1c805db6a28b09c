#!/usr/bin/env python3
"""Writes the K-quant fixtures (dev-time only; needs numpy and gguf, plus torch and
transformers for --model). Run from the repository root:

    python3 tools/gen_kquant_fixtures.py            # blocks + tiny Q4_K_M-style model
    python3 tools/gen_kquant_fixtures.py --blocks   # only tests/fixtures/kquant/blocks.bin

gguf-py (gguf.quants) dequantizes Q4_K/Q5_K/Q6_K but cannot quantize them, so this file
carries a small numpy quantizer with the block packing of ggml's quantize_row_q*_K_ref
(simple min/max scale choice, not ggml's search: only valid, realistic blocks matter).
The independent reference is always gguf.quants.dequantize of the stored bytes; the
quantizer is cross-checked against it (round-trip error of a few percent of a block's
range, asserted below).

tests/fixtures/kquant/blocks.bin ("RSKQ"), read by tests/test_kquant.c:

    "RSKQ" u32 version=1 u32 n_cases
    per case: u32 ggml_type u32 n_elems u32 n_bytes u8 bytes[n_bytes] f32 deq[n_elems]

with, per K-quant type, 8 super-blocks quantized from normal data (one of them all zeros,
one a constant row) and 8 super-blocks of random bytes whose f16 scales are set to finite
values (every scale/nibble/high-bit pattern occurs), deq = gguf.quants.dequantize; then
the same for Q5_0 and Q5_1 (8 blocks of 32 quantized by gguf-py, 16 random blocks).

tests/fixtures/golden/llama_q4km/ (not with --blocks): model.gguf, a random 2-layer llama
with dim 256 and a Q4_K_M-like type mix (Q4_K matrices, Q6_K output and layer 0's attn_v /
ffn_down, one Q5_K, F32 norms; q/k rows permuted as llama.cpp's converter does), and
logits.bin ("RSGL", the format of tools/gen_golden.py) = transformers' logits after it
loads (and, through gguf-py, dequantizes) that GGUF.
"""
import argparse
import os
import struct
import sys

import numpy as np

QK_K = 256
OUT = "tests/fixtures/kquant"
rng = np.random.default_rng(20261201)


def f16(x):
    return np.float32(np.float16(x))


def pack_k4_scales(ls, lm):
    """ggml quantize_row_q4_K_ref: 8 6-bit scales and 8 6-bit mins into 12 bytes."""
    s = np.zeros(12, np.uint8)
    for j in range(8):
        if j < 4:
            s[j] = ls[j]
            s[j + 4] = lm[j]
        else:
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4)
            s[j - 4] |= (ls[j] >> 4) << 6
            s[j] |= (lm[j] >> 4) << 6
    return s


def quant_q45_K_block(x, five):
    """One super-block of Q4_K (five=False) or Q5_K as bytes."""
    nmax = 31 if five else 15
    sub = x.reshape(8, 32)
    mn = np.minimum(sub.min(axis=1), 0)
    mx = sub.max(axis=1)
    scale = (mx - mn) / nmax
    mins = -mn
    d = f16(scale.max() / 63) if scale.max() > 0 else np.float32(0)
    dmin = f16(mins.max() / 63) if mins.max() > 0 else np.float32(0)
    ls = np.clip(np.round(scale / d), 0, 63).astype(np.uint8) if d > 0 else np.zeros(8, np.uint8)
    lm = np.clip(np.round(mins / dmin), 0, 63).astype(np.uint8) if dmin > 0 else np.zeros(8, np.uint8)
    L = np.zeros((8, 32), np.int32)
    for j in range(8):
        dl, ml = d * np.float32(ls[j]), dmin * np.float32(lm[j])
        if dl > 0:
            L[j] = np.clip(np.round((sub[j] + ml) / dl), 0, nmax)
    L = L.reshape(QK_K)
    qs = np.zeros(128, np.uint8)
    qh = np.zeros(32, np.uint8)
    for n in range(0, QK_K, 64):
        lo, hi = L[n:n + 32], L[n + 32:n + 64]
        s = n // 32  # sub-block index of the low half
        if five:
            qh |= ((lo >> 4) << s).astype(np.uint8) | ((hi >> 4) << (s + 1)).astype(np.uint8)
        qs[n // 2:n // 2 + 32] = (lo & 0xF) | ((hi & 0xF) << 4)
    head = np.array([d, dmin], np.float16).view(np.uint8)
    parts = [head, pack_k4_scales(ls, lm)] + ([qh] if five else []) + [qs]
    return np.concatenate(parts)


def quant_q6_K_block(x):
    """One super-block of Q6_K as bytes: ql[128] qh[64] scales[16] d."""
    sub = x.reshape(16, 16)
    idx = np.abs(sub).argmax(axis=1)
    vmax = sub[np.arange(16), idx]
    scale = vmax / -32.0  # signed, as ggml's make_qx_quants: q in [-32, 31]
    im = np.abs(scale).argmax()
    if scale[im] == 0:
        d, sc = np.float32(0), np.zeros(16, np.int8)
    else:
        iscale = -128.0 / scale[im]
        d = f16(1 / iscale)
        sc = np.clip(np.round(iscale * scale), -128, 127).astype(np.int8)
    L = np.zeros((16, 16), np.int32)
    for j in range(16):
        dl = d * np.float32(sc[j])
        if dl != 0:
            L[j] = np.clip(np.round(sub[j] / dl), -32, 31)
    L = (L + 32).reshape(QK_K)
    ql = np.zeros(128, np.uint8)
    qh = np.zeros(64, np.uint8)
    for h in range(2):
        a = L[h * 128:(h + 1) * 128].reshape(4, 32)
        ql[h * 64:h * 64 + 32] = (a[0] & 0xF) | ((a[2] & 0xF) << 4)
        ql[h * 64 + 32:h * 64 + 64] = (a[1] & 0xF) | ((a[3] & 0xF) << 4)
        qh[h * 32:(h + 1) * 32] = (a[0] >> 4) | ((a[1] >> 4) << 2) | ((a[2] >> 4) << 4) | ((a[3] >> 4) << 6)
    return np.concatenate([ql, qh, sc.view(np.uint8), np.array([d], np.float16).view(np.uint8)])


def quantize(x, qt):
    """Rows of x (ne0 a multiple of 256; of 32 for Q5_0/Q5_1) to the raw bytes of ggml type qt, shape (rows, bytes)."""
    from gguf import GGMLQuantizationType as QT
    x = np.asarray(x, np.float32)
    if qt in (QT.Q5_0, QT.Q5_1):  # gguf-py quantizes these itself
        import gguf
        return gguf.quants.quantize(x.reshape(x.shape[0] if x.ndim == 2 else 1, -1), qt)
    fn = {QT.Q4_K: lambda b: quant_q45_K_block(b, False), QT.Q5_K: lambda b: quant_q45_K_block(b, True),
          QT.Q6_K: quant_q6_K_block}[qt]
    blocks = x.reshape(-1, QK_K)
    out = np.stack([fn(b) for b in blocks])
    return out.reshape(x.shape[0] if x.ndim == 2 else 1, -1)


def random_blocks(qt, n):
    """Random bytes with finite f16 super-scales (every bit pattern of the rest occurs)."""
    import gguf
    bb = gguf.GGML_QUANT_SIZES[qt][1]
    b = rng.integers(0, 256, size=(n, bb), dtype=np.uint8)
    if qt.name == "Q6_K":  # d is the last field
        b[:, bb - 2:] = rng.normal(0, 0.02, size=(n, 1)).astype(np.float16).view(np.uint8)
    elif qt.name == "Q5_0":  # d first, then the high bits
        b[:, :2] = rng.normal(0, 0.02, size=(n, 1)).astype(np.float16).view(np.uint8)
    else:  # d, dmin (Q5_1: d, m) first
        b[:, :4] = rng.normal(0, 0.02, size=(n, 2)).astype(np.float16).view(np.uint8)
    return b


def check_round_trip(x, q, qt):
    import gguf
    deq = gguf.quants.dequantize(q, qt).reshape(x.shape)
    rng_blk = np.ptp(x.reshape(-1, 32), axis=1).max() if x.size else 1
    err = np.abs(deq - x).max()
    # 4 bits over a range: half a step is range/30; 6-bit scale rounding adds a few percent
    limit = {"Q4_K": 0.08, "Q5_K": 0.05, "Q6_K": 0.03, "Q5_0": 0.04, "Q5_1": 0.03}[qt.name] * max(rng_blk, 1e-6)
    assert err <= limit, f"{qt.name}: round trip error {err} > {limit}"
    return deq


def gen_blocks():
    import gguf
    from gguf import GGMLQuantizationType as QT
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        x = rng.normal(0, 1, size=(8, QK_K)).astype(np.float32)
        x[1] *= 0.001
        x[2] = x[2] + 3.0  # all-positive: Q4_K/Q5_K min 0
        x[3] = 0.0
        x[4] = 0.5  # constant
        x[5] = np.round(x[5] * 4) / 4
        q = quantize(x, qt)
        check_round_trip(x, q, qt)
        cases.append((qt, q.reshape(-1)))
        r = random_blocks(qt, 8)
        deq = gguf.quants.dequantize(r.reshape(-1), qt)
        assert np.isfinite(deq).all()
        cases.append((qt, r.reshape(-1)))
    # Q5_0 / Q5_1 (blocks of 32, the fallback of Q4_K_M files whose rows are not whole
    # super-blocks): gguf-py quantizes these itself, as ggml's reference quantizers do
    for qt in (QT.Q5_0, QT.Q5_1):
        x = rng.normal(0, 1, size=(8, 32)).astype(np.float32)
        x[1] *= 0.001
        x[2] = x[2] + 3.0
        x[3] = 0.0
        x[4] = 0.5
        q = gguf.quants.quantize(x, qt)
        check_round_trip(x, q, qt)
        cases.append((qt, q.reshape(-1)))
        r = random_blocks(qt, 16)
        assert np.isfinite(gguf.quants.dequantize(r.reshape(-1), qt)).all()
        cases.append((qt, r.reshape(-1)))
    with open(f"{OUT}/blocks.bin", "wb") as f:
        f.write(b"RSKQ" + struct.pack("<II", 1, len(cases)))
        for qt, raw in cases:
            deq = gguf.quants.dequantize(raw, qt).astype("<f4").reshape(-1)
            f.write(struct.pack("<III", int(qt), deq.size, raw.size))
            f.write(raw.tobytes() + deq.tobytes())
    print(f"{OUT}/blocks.bin: {len(cases)} cases, {os.path.getsize(OUT + '/blocks.bin')} bytes")


MODEL_DIR = "tests/fixtures/golden/llama_q4km"
# Q4_K_M-like: Q4_K by default; Q6_K for output, layer 0's attn_v / ffn_down (llama.cpp
# gives "more bits" to some of those); one Q5_K tensor so every K-quant is on the path; and
# the blocks-of-32 fallbacks llama.cpp's quantizer writes for rows that are not whole
# super-blocks (SmolLM2-135M's 576 columns: Q5_0 for most matrices of its Q4_K_M file;
# Q5_1 in Q5_K_M ones).
Q4KM_TYPES = {"output.weight": "Q6_K", "blk.0.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K",
              "blk.1.ffn_up.weight": "Q5_K", "blk.0.attn_q.weight": "Q5_0",
              "blk.0.attn_output.weight": "Q5_0", "blk.1.ffn_gate.weight": "Q5_1"}


def gen_model():
    """tests/fixtures/golden/llama_q4km/: model.gguf + transformers' logits of it."""
    import gguf
    import torch
    from gguf import GGMLQuantizationType as QT
    from transformers import AutoModelForCausalLM
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gen_golden import permute, write_rsgl

    D, H, L, NH, NKV, V = 256, 256, 2, 4, 2, 258
    hd = D // NH
    mrng = np.random.default_rng(77)

    def mat(rows, cols):
        return (mrng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * mrng.standard_normal(n)).astype(np.float32)

    os.makedirs(MODEL_DIR, exist_ok=True)
    path = f"{MODEL_DIR}/model.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("rootspec golden llama Q4_K_M-style")
    for f, v in (("context_length", 256), ("embedding_length", D), ("block_count", L),
                 ("feed_forward_length", H), ("head_count", NH), ("head_count_kv", NKV),
                 ("rope_dimension_count", hd), ("vocab_size", V)):
        getattr(w, "add_" + f)(v)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    r = gguf.GGUFReader("tests/fixtures/golden/llama/llama.gguf")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(r.fields["tokenizer.ggml.tokens"].contents())
    w.add_token_types(r.fields["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(r.fields["tokenizer.ggml.merges"].contents())
    w.add_bos_token_id(V - 1)
    w.add_eos_token_id(V - 1)

    def add(name, a):
        if a.ndim == 1:
            w.add_tensor(name, a)
            return
        qt = QT[Q4KM_TYPES.get(name, "Q4_K")]
        q = quantize(a, qt)
        check_round_trip(a, q, qt)
        w.add_tensor(name, q, raw_dtype=qt)

    add("token_embd.weight", mrng.standard_normal((V, D)).astype(np.float32))
    for i in range(L):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", norm(D))
        add(b + "attn_q.weight", permute(mat(NH * hd, D), NH))
        add(b + "attn_k.weight", permute(mat(NKV * hd, D), NKV))
        add(b + "attn_v.weight", mat(NKV * hd, D))
        add(b + "attn_output.weight", mat(D, NH * hd))
        add(b + "ffn_norm.weight", norm(D))
        add(b + "ffn_gate.weight", mat(H, D))
        add(b + "ffn_up.weight", mat(H, D))
        add(b + "ffn_down.weight", mat(D, H))
    add("output_norm.weight", norm(D))
    add("output.weight", mat(V, D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file="model.gguf", dtype=torch.float32).eval()
    # transformers must hold exactly gguf-py's dequantization (the independent reference)
    sd = model.state_dict()
    for t in gguf.GGUFReader(path).tensors:
        if t.name in ("blk.1.ffn_up.weight", "blk.1.ffn_gate.weight"):
            deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(H, D)
            hf = "up_proj" if "up" in t.name else "gate_proj"
            assert np.array_equal(sd[f"model.layers.1.mlp.{hf}.weight"].numpy(), deq), t.name
    g = torch.Generator().manual_seed(4321)
    tokens = torch.randint(0, V, (24,), generator=g)
    with torch.no_grad():
        logits = model(tokens[None]).logits[0].float().numpy()
    write_rsgl(f"{MODEL_DIR}/logits.bin", tokens.tolist(), logits)
    print(f"{path}: {os.path.getsize(path)} bytes; logits |max| {np.abs(logits).max():.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", action="store_true", help="only the block fixture")
    a = ap.parse_args()
    if not os.path.isdir("tests/fixtures"):
        sys.exit("run from the repository root")
    gen_blocks()
    if not a.blocks:
        gen_model()


if __name__ == "__main__":
    main()
