#!/usr/bin/env python3
"""Writes tests/fixtures/tok/chat_turns.json: conversations (system, user and assistant
turns) rendered by transformers' apply_chat_template(tokenize=False,
add_generation_prompt=True) with each family's published template, for the C builder
chat_build_conversation (common/chat.c) to be compared against (dev-time only).
Run from the repository root (needs transformers and gguf, and the default model):
    python3 tools/gen_chat_fixtures.py"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gen_tokenizer_fixtures as g  # noqa: E402  (the templates and the GGUF tokenizer)

CONVERSATIONS = [
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Name a prime number."},
     {"role": "assistant", "content": "7 is prime."},
     {"role": "user", "content": "  And one larger than 100?\n"}],
    [{"role": "system", "content": "  Be brief.  "},
     {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Explain speculative decoding: 数字 123 ✓"}],
]


def smollm2_template():
    """The default model's template, read from its GGUF (transformers' GGUF loader needs
    torch; the gguf package reads the metadata alone)."""
    from gguf import GGUFReader
    f = GGUFReader("models/SmolLM2-135M-Instruct.Q4_1.gguf").fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def main():
    from transformers import PreTrainedTokenizerFast
    # apply_chat_template(tokenize=False) renders the template alone: any tokenizer object
    # serves, so the committed small fixture tokenizer carries the call.
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(g.OUT, "small", "tokenizer.json"))
    chats = {
        "smollm2": (smollm2_template(), {}),
        "qwen2": (g.QWEN25_TEMPLATE, {}),
        "qwen3": (g.QWEN3_TEMPLATE, {"enable_thinking": False}),
        "llama3": (g.LLAMA31_TEMPLATE, {"bos_token": "<|begin_of_text|>"}),
    }
    out = {}
    for name, (tpl, kw) in chats.items():
        out[name] = [{"messages": c,
                      "prompt": hf.apply_chat_template(c, chat_template=tpl, tokenize=False,
                                                       add_generation_prompt=True, **kw)}
                     for c in CONVERSATIONS]
    path = os.path.join(g.OUT, "chat_turns.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"magic": g.MAGIC, "version": g.VERSION,
                   "source": "transformers apply_chat_template(tokenize=False, "
                             "add_generation_prompt=True)", "templates": out},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
