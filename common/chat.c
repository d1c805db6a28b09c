/* Chat templates for one user turn, written out in C so that the engine needs no Jinja.
 * Each builder reproduces what transformers' apply_chat_template(
 * [{"role":"user","content":U}], tokenize=False, add_generation_prompt=True) renders for
 * the family's published template (the Jinja sources are in tools/gen_tokenizer_fixtures.py,
 * which also writes the strings the tests compare against):
 *   SmolLM2  - the GGUF's tokenizer.chat_template (ChatML + default system prompt)
 *   Qwen2.5  - ChatML + "You are Qwen, created by Alibaba Cloud..." system prompt
 *   Qwen3    - ChatML, no system prompt, enable_thinking=False (empty think block)
 *   Llama-3  - Llama-3.1-Instruct's template: BOS, a system header with
 *              "Cutting Knowledge Date: December 2023" and the template's fixed fallback
 *              date "26 Jul 2024" (3.2's template calls strftime_now() instead, which would
 *              make prompts depend on the day), user content passed through Jinja `trim`. */
#include "tokenizer.h"
#include "model.h"
#include "model_internal.h"
#include <cjson/cJSON.h>
#include <string.h>
#include <utf8proc.h>

static char *concat(const char *const *parts, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += strlen(parts[i]);
    char *out = rs_xmalloc(total + 1), *p = out;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(parts[i]);
        memcpy(p, parts[i], l);
        p += l;
    }
    *p = 0;
    return out;
}

/* Python's str.isspace(), which Jinja's `trim` (str.strip()) uses. */
static int py_isspace(int32_t c) {
    if ((c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
        c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
        c == 0x202f || c == 0x205f || c == 0x3000)
        return 1;
    return 0;
}

/* Returns a malloc'd copy of s without leading/trailing Python whitespace. */
static char *py_strip(const char *s) {
    size_t len = strlen(s), start = 0, end = 0, i = 0;
    int seen = 0;
    while (i < len) {
        int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0) { /* invalid byte: not whitespace, keep it */
            k = 1;
            cp = -1;
        }
        if (cp < 0 || !py_isspace(cp)) {
            if (!seen) start = i;
            seen = 1;
            end = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (!seen) start = end = 0;
    char *out = rs_xmalloc(end - start + 1);
    memcpy(out, s + start, end - start);
    out[end - start] = 0;
    return out;
}

char *chat_build_prompt(ChatTemplate tpl, const char *user) {
    switch (tpl) {
    case CHAT_SMOLLM2: {
        const char *p[] = {"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                           "Hugging Face<|im_end|>\n<|im_start|>user\n",
                           user, "<|im_end|>\n<|im_start|>assistant\n"};
        return concat(p, 3);
    }
    case CHAT_QWEN2: {
        const char *p[] = {"<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                           "assistant.<|im_end|>\n<|im_start|>user\n",
                           user, "<|im_end|>\n<|im_start|>assistant\n"};
        return concat(p, 3);
    }
    case CHAT_QWEN3: {
        const char *p[] = {"<|im_start|>user\n", user,
                           "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"};
        return concat(p, 3);
    }
    case CHAT_LLAMA3: {
        char *u = py_strip(user);
        const char *p[] = {"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                           "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                           "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n",
                           u, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"};
        char *out = concat(p, 3);
        free(u);
        return out;
    }
    case CHAT_NONE:
    default: {
        const char *p[] = {user};
        return concat(p, 1);
    }
    }
}

/* Recognises a family from its Jinja template text. */
static ChatTemplate template_from_text(const char *s, size_t len) {
    char *txt = rs_xmalloc(len + 1);
    memcpy(txt, s, len);
    txt[len] = 0;
    ChatTemplate r = CHAT_NONE;
    if (strstr(txt, "<|start_header_id|>")) r = CHAT_LLAMA3;
    else if (strstr(txt, "<|im_start|>")) {
        if (strstr(txt, "SmolLM")) r = CHAT_SMOLLM2;
        else if (strstr(txt, "You are Qwen")) r = CHAT_QWEN2;
        else if (strstr(txt, "enable_thinking") || strstr(txt, "<think>")) r = CHAT_QWEN3;
    }
    free(txt);
    return r;
}

ChatTemplate chat_template_for_model(const struct Model *m) {
    static const struct { const char *hint; ChatTemplate t; } hints[] = {
        {"smollm2", CHAT_SMOLLM2}, {"qwen2", CHAT_QWEN2}, {"qwen3", CHAT_QWEN3}, {"llama3", CHAT_LLAMA3}};
    for (size_t i = 0; i < sizeof hints / sizeof hints[0]; i++)
        if (!strcmp(m->chat_hint, hints[i].hint)) return hints[i].t;
    /* No hint from the loader: look at the template text itself. */
    if (m->tok_source == TOKSRC_GGUF && m->gguf) {
        const char *s;
        size_t len;
        if (gguf_get_str(m->gguf, "tokenizer.chat_template", &s, &len) == 0) return template_from_text(s, len);
    } else if (m->tok_source == TOKSRC_HF_JSON && m->tokenizer_json[0]) {
        char path[1100];
        const char *slash = strrchr(m->tokenizer_json, '/');
        int dirlen = slash ? (int)(slash - m->tokenizer_json) : 0;
        snprintf(path, sizeof path, "%.*s%stokenizer_config.json", dirlen, m->tokenizer_json, slash ? "/" : "");
        char *txt;
        size_t len;
        if (rs_read_file(path, &txt, &len, NULL) != 0) return CHAT_NONE;
        cJSON *cfg = cJSON_ParseWithLength(txt, len);
        free(txt);
        ChatTemplate r = CHAT_NONE;
        const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
        if (cJSON_IsString(ct)) r = template_from_text(ct->valuestring, strlen(ct->valuestring));
        cJSON_Delete(cfg);
        return r;
    }
    return CHAT_NONE;
}
