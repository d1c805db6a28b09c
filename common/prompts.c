/* Prompt-file reader (Spec-Bench and HumanEval-style JSON lines), shared by rootspec-target
 * --prompts and rootspec-bench. The whole file is refused on the first bad line, because a
 * benchmark that silently drops prompts would compare runs over different prompt sets. */
#include "common/prompts.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

const char *prompts_help(void) {
    return "Prompt files are JSON lines (UTF-8), one prompt per line, format detected per line:\n"
           "  Spec-Bench: {\"question_id\": 81, \"category\": \"writing\", \"turns\": [\"...\", ...]}\n"
           "    (the first turn is the prompt; question_id is its id)\n"
           "  HumanEval:  {\"task_id\": \"HumanEval/0\", \"prompt\": \"...\"}\n"
           "    (the prompt is used verbatim; the id is task_id, or \"lineN\" when absent)\n"
           "Blank lines are skipped. Ids must be unique, at most 63 characters of\n"
           "[A-Za-z0-9_./:+-]. A file with any malformed line (bad JSON or UTF-8, missing or\n"
           "empty prompt, bad id) is refused as a whole, with the file name and line number.\n";
}

long prompts_utf8_invalid_at(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) { i++; continue; }
        int len;
        unsigned cp, min;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return (long)i;
        if (i + (size_t)len > n) return (long)i;
        for (int k = 1; k < len; k++) {
            unsigned cc = p[i + k];
            if ((cc & 0xC0) != 0x80) return (long)i;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return (long)i;
        i += (size_t)len;
    }
    return -1;
}

static int id_valid(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= PROMPT_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '/' || c == ':' || c == '+' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s);
    char *d = rs_xmalloc(n + 1);
    memcpy(d, s, n + 1);
    return d;
}

/* 1 if the JSON text holds a \u0000 escape (outside an escaped backslash): cJSON would cut
 * the decoded string there, silently dropping the rest of the prompt. */
static int has_nul_escape(const char *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return 1;
        i++; /* skip the escaped character */
    }
    return 0;
}

/* Parses one line as exactly one JSON object (valid UTF-8, no NUL, nothing after it). */
static int line_object(const char *path, int lineno, const char *line, size_t len, cJSON **out,
                       RsErr *e) {
    long bad = prompts_utf8_invalid_at(line, len);
    if (bad >= 0)
        return rs_err(e, RS_EFORMAT, "%s:%d: invalid UTF-8 at byte %ld of the line", path,
                      lineno, bad + 1);
    if (memchr(line, 0, len))
        return rs_err(e, RS_EFORMAT, "%s:%d: NUL byte in line", path, lineno);
    if (has_nul_escape(line, len))
        return rs_err(e, RS_EFORMAT, "%s:%d: NUL character (\\u0000) in line", path, lineno);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (!j) {
        long at = end ? (long)(end - line) + 1 : 0;
        if (cJSON_GetErrorPtr()) at = (long)(cJSON_GetErrorPtr() - line) + 1;
        return rs_err(e, RS_EFORMAT, "%s:%d: not valid JSON (near byte %ld)", path, lineno, at);
    }
    /* Anything after the object other than whitespace is malformed. */
    for (const char *q = end; q < line + len; q++)
        if (*q != ' ' && *q != '\t' && *q != '\r') {
            cJSON_Delete(j);
            return rs_err(e, RS_EFORMAT, "%s:%d: trailing data after the JSON object", path,
                          lineno);
        }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rs_err(e, RS_EFORMAT, "%s:%d: line is not a JSON object", path, lineno);
    }
    *out = j;
    return RS_OK;
}

/* The prompt text and id of either format (*id is NULL for a HumanEval line without one). */
static int prompt_fields(const char *path, int lineno, const cJSON *j, const cJSON **text,
                         const cJSON **id, RsErr *e) {
    const cJSON *turns = cJSON_GetObjectItemCaseSensitive(j, "turns");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (turns) {
        if (!cJSON_IsArray(turns) || cJSON_GetArraySize(turns) < 1 ||
            !cJSON_IsString(cJSON_GetArrayItem(turns, 0)))
            return rs_err(e, RS_EFORMAT, "%s:%d: \"turns\" must be an array whose first element "
                          "is a string", path, lineno);
        *text = cJSON_GetArrayItem(turns, 0);
        *id = cJSON_GetObjectItemCaseSensitive(j, "question_id");
        if (!*id)
            return rs_err(e, RS_EFORMAT, "%s:%d: Spec-Bench line without \"question_id\"", path,
                          lineno);
    } else if (prompt) {
        if (!cJSON_IsString(prompt))
            return rs_err(e, RS_EFORMAT, "%s:%d: \"prompt\" must be a string", path, lineno);
        *text = prompt;
        *id = cJSON_GetObjectItemCaseSensitive(j, "task_id");
    } else {
        return rs_err(e, RS_EFORMAT, "%s:%d: neither \"turns\" (Spec-Bench) nor \"prompt\" "
                      "(HumanEval) present", path, lineno);
    }
    if ((*text)->valuestring[0] == 0)
        return rs_err(e, RS_EFORMAT, "%s:%d: empty prompt", path, lineno);
    /* cJSON decodes \u escapes itself; a lone surrogate escape must not slip through. */
    if (prompts_utf8_invalid_at((*text)->valuestring, strlen((*text)->valuestring)) >= 0)
        return rs_err(e, RS_EFORMAT, "%s:%d: prompt decodes to invalid UTF-8", path, lineno);
    return RS_OK;
}

/* The id as text: an integer, a string of the allowed characters, or "lineN" when absent. */
static int prompt_id(const char *path, int lineno, const cJSON *id, char out[PROMPT_ID_MAX],
                     RsErr *e) {
    if (!id) {
        snprintf(out, PROMPT_ID_MAX, "line%d", lineno);
    } else if (cJSON_IsNumber(id)) {
        double v = id->valuedouble;
        if (v != floor(v) || fabs(v) > 9007199254740992.0)
            return rs_err(e, RS_EFORMAT, "%s:%d: id %g is not an integer", path, lineno, v);
        snprintf(out, PROMPT_ID_MAX, "%.0f", v);
    } else if (cJSON_IsString(id)) {
        if (!id_valid(id->valuestring))
            return rs_err(e, RS_EFORMAT, "%s:%d: id \"%.80s\" must be 1-63 characters of "
                          "[A-Za-z0-9_./:+-]", path, lineno, id->valuestring);
        snprintf(out, PROMPT_ID_MAX, "%s", id->valuestring);
    } else {
        return rs_err(e, RS_EFORMAT, "%s:%d: id must be a number or a string", path, lineno);
    }
    return RS_OK;
}

/* Parses one non-blank line into *bp. Returns RS_OK or RS_EFORMAT with the reason. */
static int parse_line(const char *path, int lineno, const char *line, size_t len,
                      Prompt *bp, RsErr *e) {
    cJSON *j = NULL;
    int rc = line_object(path, lineno, line, len, &j, e);
    if (rc) return rc;
    const cJSON *text = NULL, *id = NULL;
    memset(bp, 0, sizeof *bp);
    bp->line = lineno;
    if (!(rc = prompt_fields(path, lineno, j, &text, &id, e)) &&
        !(rc = prompt_id(path, lineno, id, bp->id, e))) {
        const cJSON *cat = cJSON_GetObjectItemCaseSensitive(j, "category");
        bp->category = xstrdup(cJSON_IsString(cat) ? cat->valuestring : "");
        bp->text = xstrdup(text->valuestring);
    }
    cJSON_Delete(j);
    return rc;
}

int prompts_load(const char *path, PromptSet **out, RsErr *e) {
    *out = NULL;
    char *buf;
    size_t len;
    int rc = rs_read_file(path, &buf, &len, e);
    if (rc) return rc;
    PromptSet *set = rs_xcalloc(1, sizeof *set);
    int cap = 0;
    int lineno = 0;
    size_t pos = 0;
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) pos = 3; /* UTF-8 byte order mark */
    while (pos < len) {
        lineno++;
        const char *line = buf + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos;
        pos += n + (nl ? 1 : 0);
        size_t k = 0;
        while (k < n && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
        if (k == n) continue; /* blank */
        if (set->n == cap) {
            cap = cap ? 2 * cap : 64;
            set->items = realloc(set->items, (size_t)cap * sizeof *set->items);
            RS_ASSERT(set->items);
        }
        Prompt *bp = &set->items[set->n];
        rc = parse_line(path, lineno, line, n, bp, e);
        if (rc) goto fail;
        set->n++;
        for (int i = 0; i < set->n - 1; i++)
            if (strcmp(set->items[i].id, bp->id) == 0) {
                rc = rs_err(e, RS_EFORMAT, "%s:%d: duplicate id \"%s\" (first on line %d)", path,
                            lineno, bp->id, set->items[i].line);
                goto fail;
            }
    }
    if (set->n == 0) {
        rc = rs_err(e, RS_EFORMAT, "%s: no prompts in file", path);
        goto fail;
    }
    free(buf);
    *out = set;
    return RS_OK;
fail:
    free(buf);
    prompts_destroy(&set);
    return rc;
}

void prompts_destroy(PromptSet **p) {
    if (!p || !*p) return;
    for (int i = 0; i < (*p)->n; i++) {
        free((*p)->items[i].category);
        free((*p)->items[i].text);
    }
    free((*p)->items);
    free(*p);
    *p = NULL;
}
