#!/usr/bin/env python3
"""Writes the tokenizer and chat-template fixtures under tests/fixtures/tok/ (dev-time only).

The expected ids and prompt strings come from Hugging Face `tokenizers`/`transformers`, an
implementation independent of common/tokenizer.c and common/chat.c, so the C tests can fail.
Run from the repository root:  python3 tools/gen_tokenizer_fixtures.py
Needs models/SmolLM2-135M-Instruct.Q4_1.gguf (make setup).
With --long-only it rewrites just tests/fixtures/tok/long_ids.json (long, repetitive inputs)
from the committed tokenizer.json files, without retraining the small tokenizer."""
import json
import os
import sys

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers, decoders, Regex
from transformers import AutoTokenizer

MAGIC = "rootspec-tok-fixture"
VERSION = 1
OUT = "tests/fixtures/tok"

# Varied corpus: prose, accents, emoji (incl. ZWJ), CJK, Arabic, code, whitespace, digits,
# contractions and special tokens written literally.
CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space and trailing space ",
    "Speculative decoding verifies a tree of draft tokens in one target pass.",
    "I'm sure you'll see they've done it, we'd've known. DON'T SHOUT, It's FINE",
    "naïve café résumé façade Ångström coöperate",
    "e\u0301 vs \u00e9 (decomposed vs precomposed)",
    "Zürich, Kraków, São Paulo, Reykjavík",
    "emoji: 😀 😂 👍🏽 ❤️",
    "family: 👨\u200d👩\u200d👧\u200d👦 and flag: 🇫🇷 and 🏳️\u200d🌈",
    "中文分词测试：今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "مرحبا بالعالم، هذا اختبار.",
    "Привет, мир! Ёлка и щука.",
    "Ελληνικά γράμματα: αβγδ",
    "def f(x):\n    return x * 2\n\nif __name__ == \"__main__\":\n    print(f(21))\n",
    "int main(void) {\n\tint a[3] = {1, 2, 3};\n\treturn a[0];\n}",
    "    four spaces, then\ttab\t\tand two tabs",
    "many     spaces      here",
    "line one\nline two\r\nline three\n\n\nafter blank lines",
    "   \n  \t \n",
    "1234567890 and 3.14159 and 1,000,000 and 2024-07-26",
    "000 007 9999999999999",
    "phone: +1 (555) 012-3456",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|endoftext|>",
    "<|im_start|><|im_start|>",
    "almost special <|im_start and <|im_end |> and < |endoftext|>",
    "URL: https://example.com/path?q=1&b=two#frag",
    "email@example.org; user_name-42",
    "Math: ∑_{i=1}^{n} x_i² ≤ ∞, α→β",
    "Punctuation!!! ??? ... --- *** ### @@@",
    "CamelCaseIdentifierWithNumbers123AndMore",
    "snake_case_identifier = another_one + third_one",
    "'quoted' \"double\" `backtick` «guillemets» „low“",
    "tab\tseparated\tvalues\n1\t2\t3",
    "a",
    " ",
    "\n",
    "ÿ\u00ad\u200b\ufeff zero-width and soft hyphen",
    "The year 1999 had 365 days; 2000 had 366.",
]

CHAT_USERS = [
    "What is the capital of France?",
    "  Write a haiku about rain.\n",
    "Explain speculative decoding in one sentence: 数字 123 ✓",
    "\u00a0\u3000 Unicode-padded question?\u2028\t",  # Jinja `trim` strips Unicode spaces too
]

# Long single pieces and long repetitive runs: many equal-rank candidate merges (ties broken
# leftmost first), merges that make earlier candidates stale, more symbols than any stack
# buffer. Odd lengths, so that merging from the right would give other ids. (name, unit,
# repeat): the text is unit * repeat. The ids are stored as runs (see id_runs).
def _lcg_letters(n, alphabet="etaoinshrdlu", seed=12345):
    """Deterministic pseudo-random letters (one long piece with varied merges)."""
    out, x = [], seed
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(alphabet[(x >> 33) % len(alphabet)])
    return "".join(out)


LONG_CASES = [
    ("x", "x", 2999),
    ("ab", "ab", 1999),
    ("aba", "aba", 701),
    ("aaaa_bbbb", "aaaa bbbb ", 301),
    ("digits", "31415926535897932384", 31),
    ("zeros", "0", 1001),
    ("e_acute", "\u00e9", 1501),
    ("cjk", "\u4e2d", 1001),
    ("emoji", "\U0001F600", 501),
    ("spaces", " ", 2999),
    ("newlines", "\n", 777),
    ("fox", "thequickbrownfox", 151),
    ("random_letters", _lcg_letters(1500), 1),
]


def id_runs(ids, max_period=24):
    """ids as [[times, id, id, ...], ...]: each run is its ids repeated `times` times (a
    literal stretch has times 1). Greedy: at each position the period covering most."""
    out, lit, i = [], [], 0
    while i < len(ids):
        best = (0, 1, 1)
        for p in range(1, max_period + 1):
            if i + 2 * p > len(ids):
                break
            k = 1
            while ids[i + k * p:i + (k + 1) * p] == ids[i:i + p]:
                k += 1
            if k >= 2 and p * k > best[0]:
                best = (p * k, p, k)
        if best[0] == 0:
            lit.append(ids[i])
            i += 1
            continue
        if lit:
            out.append([1] + lit)
            lit = []
        _, p, k = best
        out.append([k] + ids[i:i + p])
        i += p * k
    if lit:
        out.append([1] + lit)
    assert [t for r in out for t in r[1:] * r[0]] == ids
    return out


def write_long(encoders):
    """encoders: name -> (vocab size, encode function). The texts are stored once, each
    tokenizer's ids by case name."""
    out = {}
    for name, (vocab, enc) in encoders.items():
        ids = {cname: id_runs(enc(unit * rep)) for cname, unit, rep in LONG_CASES}
        out[name] = {"vocab_size": vocab, "ids": ids}
    write_json("long_ids.json", {
        "magic": MAGIC, "version": VERSION,
        "source": "smollm2: transformers AutoTokenizer(GGUF); small, small_split: tokenizers "
                  "Tokenizer.from_file; encode(add_special_tokens=False)",
        "cases": [{"name": c, "unit": u, "repeat": r} for c, u, r in LONG_CASES],
        "tokenizers": out})


def load_smollm2():
    return AutoTokenizer.from_pretrained("models", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def long_encoders(hf, small, split):
    return {"smollm2": (len(hf), lambda s: hf.encode(s, add_special_tokens=False)),
            "small": (small.get_vocab_size(), lambda s: small.encode(s, add_special_tokens=False).ids),
            "small_split": (split.get_vocab_size(), lambda s: split.encode(s, add_special_tokens=False).ids)}


SMOLLM2_TEMPLATE = None  # read from the GGUF (tokenizer.chat_template)

QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

QWEN3_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

# Llama-3.1-Instruct's template (tool branches trimmed: they are inactive without tools).
# Chosen over Llama-3.2's because 3.1 uses the fixed date "26 Jul 2024" when date_string is
# undefined, whereas 3.2 calls strftime_now() and so depends on the day it runs.
LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""


def write_json(name, obj):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def encode_cases(enc, dec):
    """Expected ids, and HF's decode of them (differs from the text only where a
    normalizer such as NFC rewrote it)."""
    out = []
    for s in CORPUS:
        ids = enc(s)
        out.append({"text": s, "ids": ids, "decoded": dec(ids)})
    return out


def train_small():
    """A ~800-entry byte-level BPE trained here: NFC normalizer, Digits + ByteLevel."""
    import textwrap, json as _json, string
    texts = list(CORPUS)
    for mod in (textwrap, _json.decoder, string):
        with open(mod.__file__, encoding="utf-8") as f:
            texts.append(f.read())
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, min_frequency=2,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B",
        special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))])
    return tok


def main():
    os.makedirs(OUT, exist_ok=True)
    # (1) the default model's tokenizer as transformers converts it from the GGUF.
    hf = load_smollm2()
    smol_tpl = hf.chat_template
    assert smol_tpl and "SmolLM" in smol_tpl, "GGUF has no SmolLM2 chat template"
    cases = encode_cases(lambda s: hf.encode(s, add_special_tokens=False), hf.decode)
    for c in cases:  # the round trip the C test also checks must hold for the reference
        assert hf.decode(c["ids"]) == c["text"], c["text"]
    chats = {
        "smollm2": (smol_tpl, {}),
        "qwen2": (QWEN25_TEMPLATE, {}),
        "qwen3": (QWEN3_TEMPLATE, {"enable_thinking": False}),
        "llama3": (LLAMA31_TEMPLATE, {"bos_token": "<|begin_of_text|>"}),
    }
    chat_out = {}
    for name, (tpl, kw) in chats.items():
        rows = []
        for u in CHAT_USERS:
            p = hf.apply_chat_template([{"role": "user", "content": u}], chat_template=tpl,
                                       tokenize=False, add_generation_prompt=True, **kw)
            rows.append({"user": u, "prompt": p})
        chat_out[name] = rows
    smol_chat_ids = []
    for r in chat_out["smollm2"]:
        ids = hf.encode(r["prompt"], add_special_tokens=False)
        smol_chat_ids.append({"prompt": r["prompt"], "ids": ids, "decoded": hf.decode(ids)})
    write_json("smollm2_ids.json", {
        "magic": MAGIC, "version": VERSION,
        "source": "transformers AutoTokenizer(models/SmolLM2-135M-Instruct.Q4_1.gguf), encode(add_special_tokens=False)",
        "vocab_size": len(hf), "cases": cases, "chat": smol_chat_ids})
    write_json("chat.json", {"magic": MAGIC, "version": VERSION,
                             "source": "transformers apply_chat_template(tokenize=False, add_generation_prompt=True)",
                             "templates": chat_out})

    # (2) a small trained tokenizer.json, and a variant with a Split regex + ignore_merges.
    small = train_small()
    os.makedirs(os.path.join(OUT, "small"), exist_ok=True)
    small.save(os.path.join(OUT, "small", "tokenizer.json"))
    with open(os.path.join(OUT, "small", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                   "add_bos_token": True}, f, indent=1)
    small_cases = encode_cases(lambda s: small.encode(s, add_special_tokens=False).ids,
                               lambda ids: small.decode(ids, skip_special_tokens=False))
    write_json("small_ids.json", {"magic": MAGIC, "version": VERSION,
                                  "source": "tokenizers (small/tokenizer.json), add_special_tokens=False",
                                  "vocab_size": small.get_vocab_size(), "cases": small_cases})

    j = json.loads(small.to_str())
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    j["normalizer"] = None
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    j["model"]["ignore_merges"] = True
    # Whole words the merges cannot build: only ignore_merges (a whole-piece vocab look-up,
    # as in Llama-3's tokenizer.json) produces these ids.
    vocab = j["model"]["vocab"]
    next_id = max(max(vocab.values()), max(a["id"] for a in j["added_tokens"])) + 1
    for w in ["\u0120quick", "\u0120spaces", "\u0120tokens", "Hello"]:
        if w not in vocab:
            vocab[w] = next_id
            next_id += 1
    # tokenizers saves merges as [a, b] pairs; this variant uses the older "a b" spelling
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    os.makedirs(os.path.join(OUT, "small_split"), exist_ok=True)
    sp_path = os.path.join(OUT, "small_split", "tokenizer.json")
    with open(sp_path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    split = Tokenizer.from_file(sp_path)
    split_cases = encode_cases(lambda s: split.encode(s, add_special_tokens=False).ids,
                               lambda ids: split.decode(ids, skip_special_tokens=False))
    write_json("small_split_ids.json", {"magic": MAGIC, "version": VERSION,
                                        "source": "tokenizers (small_split/tokenizer.json), add_special_tokens=False",
                                        "vocab_size": split.get_vocab_size(), "cases": split_cases})
    write_long(long_encoders(hf, small, split))


def main_long_only():
    small = Tokenizer.from_file(os.path.join(OUT, "small", "tokenizer.json"))
    split = Tokenizer.from_file(os.path.join(OUT, "small_split", "tokenizer.json"))
    write_long(long_encoders(load_smollm2(), small, split))


if __name__ == "__main__":
    sys.exit(main_long_only() if sys.argv[1:] == ["--long-only"] else main())
