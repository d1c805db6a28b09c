/* Chat templates, written out in C so that the engine needs no Jinja. Each builder
 * reproduces what transformers' apply_chat_template(messages, tokenize=False,
 * add_generation_prompt=True) renders, for one user turn or a conversation, for
 * the family's published template (the Jinja sources are in tools/gen_tokenizer_fixtures.py,
 * which also writes the strings the tests compare against):
 *   SmolLM2  - the GGUF's tokenizer.chat_template (ChatML + default system prompt)
 *   Qwen2.5  - ChatML + "You are Qwen, created by Alibaba Cloud..." system prompt
 *   Qwen3    - ChatML, no system prompt, enable_thinking=False (empty think block)
 *   Llama-3  - Llama-3.1-Instruct's template: BOS, a system header with
 *              "Cutting Knowledge Date: December 2023" and the template's fixed fallback
 *              date "26 Jul 2024" (3.2's template calls strftime_now() instead, which would
 *              make prompts depend on the day), contents passed through Jinja `trim`. */
#include "tokenizer.h"
#include "model.h"
#include "model_internal.h"
#include <cjson/cJSON.h>
#include <string.h>
#include <utf8proc.h>

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

/* ---- conversations ------------------------------------------------------------------ */

/* A growing string, and which of its bytes are content (the caller's words). */
typedef struct {
    char *s;
    uint8_t *plain; /* NULL: not tracked */
    size_t n, cap;
    int track;
} Buf;

static void buf_add(Buf *b, const char *t, uint8_t content) {
    size_t k = strlen(t);
    if (b->n + k + 1 > b->cap) {
        b->cap = 2 * (b->n + k + 1);
        b->s = realloc(b->s, b->cap);
        RS_ASSERT(b->s && "out of memory");
        if (b->track) {
            b->plain = realloc(b->plain, b->cap);
            RS_ASSERT(b->plain && "out of memory");
        }
    }
    memcpy(b->s + b->n, t, k + 1);
    if (b->track) memset(b->plain + b->n, content, k + 1);
    b->n += k;
}

/* The template's own text. */
static void buf_put(Buf *b, const char *t) { buf_add(b, t, 0); }
/* A turn's content. */
static void buf_content(Buf *b, const char *t) { buf_add(b, t, 1); }

/* ChatML (SmolLM2, Qwen2.5, Qwen3): an optional system turn (the family's default when the
 * conversation has none and dflt is not NULL), every turn as <|im_start|>role ... <|im_end|>,
 * then the assistant's opening (and Qwen3's empty think block, enable_thinking=False). */
static void chatml(Buf *b, const ChatMsg *m, int n, const char *dflt, const char *gen_tail) {
    buf_put(b, "");
    if (dflt && strcmp(m[0].role, "system")) {
        buf_put(b, "<|im_start|>system\n");
        buf_put(b, dflt);
        buf_put(b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        buf_put(b, "<|im_start|>");
        buf_put(b, m[i].role);
        buf_put(b, "\n");
        buf_content(b, m[i].content);
        buf_put(b, "<|im_end|>\n");
    }
    buf_put(b, "<|im_start|>assistant\n");
    buf_put(b, gen_tail);
}

/* Llama-3.1: BOS, the system header (dated, with the system turn's text when there is
 * one), then every other turn between header and <|eot_id|>, contents through `trim`. */
static void llama3(Buf *b, const ChatMsg *m, int n) {
    buf_put(b, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
               "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    int first = 0;
    if (!strcmp(m[0].role, "system")) {
        char *sys = py_strip(m[0].content);
        buf_content(b, sys);
        free(sys);
        first = 1;
    }
    buf_put(b, "<|eot_id|>");
    for (int i = first; i < n; i++) {
        char *c = py_strip(m[i].content);
        buf_put(b, "<|start_header_id|>");
        buf_put(b, m[i].role);
        buf_put(b, "<|end_header_id|>\n\n");
        buf_content(b, c);
        buf_put(b, "<|eot_id|>");
        free(c);
    }
    buf_put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

int chat_conversation_check(const ChatMsg *m, int n, RsErr *e) {
    if (n < 1) return rs_err(e, RS_EINVAL, "a conversation needs at least one message");
    for (int i = 0; i < n; i++) {
        const char *r = m[i].role;
        if (!m[i].content) return rs_err(e, RS_EINVAL, "message %d has no content", i);
        if (!strcmp(r, "system") ? i != 0 : strcmp(r, "user") && strcmp(r, "assistant"))
            return rs_err(e, RS_EINVAL, "message %d: role '%s' (system, first only; user; "
                          "assistant)", i, r);
    }
    if (strcmp(m[n - 1].role, "user"))
        return rs_err(e, RS_EINVAL, "the last message must be the user's, not '%s'",
                      m[n - 1].role);
    return RS_OK;
}

char *chat_render(ChatTemplate tpl, const ChatMsg *m, int n, uint8_t **plain, RsErr *e) {
    if (plain) *plain = NULL;
    if (chat_conversation_check(m, n, e)) return NULL;
    Buf b = {.track = plain != NULL};
    switch (tpl) {
    case CHAT_SMOLLM2:
        chatml(&b, m, n, "You are a helpful AI assistant named SmolLM, trained by Hugging Face", "");
        break;
    case CHAT_QWEN2:
        chatml(&b, m, n, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", "");
        break;
    case CHAT_QWEN3: chatml(&b, m, n, NULL, "<think>\n\n</think>\n\n"); break;
    case CHAT_LLAMA3: llama3(&b, m, n); break;
    case CHAT_NONE:
    default:
        if (n != 1) {
            rs_err(e, RS_EUNSUPPORTED, "no chat template to render a conversation of %d messages", n);
            return NULL;
        }
        buf_put(&b, "");
        buf_content(&b, m[0].content);
    }
    if (plain) *plain = b.plain;
    return b.s;
}

char *chat_build_conversation(ChatTemplate tpl, const ChatMsg *m, int n, RsErr *e) {
    return chat_render(tpl, m, n, NULL, e);
}

char *chat_build_prompt(ChatTemplate tpl, const char *user) {
    ChatMsg m = {"user", user};
    char *out = chat_build_conversation(tpl, &m, 1, NULL);
    RS_ASSERT(out);
    return out;
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
