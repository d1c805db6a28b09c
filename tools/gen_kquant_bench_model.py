#!/usr/bin/env python3
"""Writes a random-weight llama GGUF whose matrices are all K-quants, for timing the
K-quant kernels against llama.cpp (dev-time only; needs numpy, gguf and llama-cpp-python).

    python3 tools/gen_kquant_bench_model.py OUT.gguf [--ftype Q4_K_M]

The default model's rows (576 columns) are not whole 256-element super-blocks, so its
Q4_K_M file is mostly Q5_0; this one has dim 1024, hidden 2816, 12 layers, 16 heads (4 KV)
and the default model's tokenizer (vocab 49152, tied embeddings): written as F16 through
gguf-py, then quantized by llama.cpp's own quantizer (llama_model_quantize), so the file
is what llama.cpp would publish. ~185M parameters, ~120 MB as Q4_K_M.
"""
import argparse
import ctypes
import os
import sys
import tempfile

import numpy as np

DIM, HIDDEN, LAYERS, HEADS, KV = 1024, 2816, 12, 16, 4
SRC = "models/SmolLM2-135M-Instruct.Q4_1.gguf"


def write_f16(path):
    import gguf
    r = gguf.GGUFReader(SRC)
    f = r.fields
    vocab = len(f["tokenizer.ggml.tokens"].data)
    hd = DIM // HEADS
    rng = np.random.default_rng(2026)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("rootspec K-quant bench model (random weights)")
    w.add_context_length(2048)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(f["tokenizer.ggml.tokens"].contents())
    w.add_token_types(f["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(f["tokenizer.ggml.merges"].contents())
    for k in ("bos_token_id", "eos_token_id"):
        key = "tokenizer.ggml." + k
        if key in f:
            getattr(w, "add_" + k)(int(f[key].contents()))

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    w.add_tensor("token_embd.weight", rng.standard_normal((vocab, DIM), dtype=np.float32).astype(np.float16))
    for i in range(LAYERS):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(DIM, np.float32))
        w.add_tensor(b + "attn_q.weight", mat(HEADS * hd, DIM))
        w.add_tensor(b + "attn_k.weight", mat(KV * hd, DIM))
        w.add_tensor(b + "attn_v.weight", mat(KV * hd, DIM))
        w.add_tensor(b + "attn_output.weight", mat(DIM, HEADS * hd))
        w.add_tensor(b + "ffn_norm.weight", np.ones(DIM, np.float32))
        w.add_tensor(b + "ffn_gate.weight", mat(HIDDEN, DIM))
        w.add_tensor(b + "ffn_up.weight", mat(HIDDEN, DIM))
        w.add_tensor(b + "ffn_down.weight", mat(DIM, HIDDEN))
    w.add_tensor("output_norm.weight", np.ones(DIM, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--ftype", default="Q4_K_M", help="llama.cpp file type (Q4_K_M, Q5_K_M, Q6_K)")
    a = ap.parse_args()
    if not os.path.isfile(SRC):
        sys.exit(f"run from the repository root with {SRC} in place (make models)")
    import llama_cpp
    with tempfile.TemporaryDirectory() as d:
        f16 = os.path.join(d, "f16.gguf")
        write_f16(f16)
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + a.ftype)
        p.nthread = os.cpu_count() or 1
        rc = llama_cpp.llama_model_quantize(f16.encode(), a.out.encode(), ctypes.byref(p))
        if rc != 0:
            sys.exit(f"llama_model_quantize failed: {rc}")
    print(f"{a.out}: {os.path.getsize(a.out) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
