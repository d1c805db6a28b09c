/* Output text: stop strings and UTF-8 boundaries. Tokens are byte strings, so a character
 * may span two tokens and a stop string may span several: while streaming, the bytes that
 * could still be the start of a stop string or of a character wait for the next token. */
#include "serve.h"
#include <string.h>
#include <utf8proc.h>

void serve_text_init(ServeText *t, const char *const *stop, int n_stop) {
    memset(t, 0, sizeof *t);
    t->stop = stop;
    t->n_stop = n_stop;
}

void serve_text_free(ServeText *t) {
    free(t->buf);
    memset(t, 0, sizeof *t);
}

/* Length of the longest proper prefix of a stop string that buf[from..len) ends with. */
static size_t partial_stop_tail(const ServeText *t, size_t from) {
    size_t best = 0;
    for (int i = 0; i < t->n_stop; i++) {
        size_t sl = strlen(t->stop[i]);
        for (size_t k = sl - 1; k > best; k--)
            if (k <= t->len - from && !memcmp(t->buf + t->len - k, t->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Bytes at the end of buf[0..end) that start a UTF-8 character not yet complete. */
static size_t incomplete_utf8_tail(const char *buf, size_t end) {
    for (size_t back = 1; back <= 3 && back <= end; back++) {
        unsigned char c = (unsigned char)buf[end - back];
        if ((c & 0xc0) == 0x80) continue; /* a continuation byte: look further back */
        size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

/* The earliest stop string match starting at or after from; -1 if none. A match cannot
 * start before `ready`: a prefix of a stop string at the end was held back. */
static long first_stop(const ServeText *t, size_t from) {
    long best = -1;
    for (int i = 0; i < t->n_stop; i++) {
        const char *hit = memmem(t->buf + from, t->len - from, t->stop[i], strlen(t->stop[i]));
        if (hit && (best < 0 || hit - t->buf < best)) best = hit - t->buf;
    }
    return best;
}

void serve_text_push(ServeText *t, const char *b, size_t n) {
    if (t->matched || n == 0) return;
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->buf = realloc(t->buf, t->cap);
        RS_ASSERT(t->buf);
    }
    memcpy(t->buf + t->len, b, n);
    t->len += n;
    long hit = first_stop(t, t->ready);
    if (hit >= 0) {
        t->len = (size_t)hit;
        t->matched = 1;
        t->ready = t->len;
        return;
    }
    size_t ready = t->len - partial_stop_tail(t, t->ready);
    t->ready = ready - incomplete_utf8_tail(t->buf, ready);
    if (t->ready < t->sent) t->ready = t->sent;
}

void serve_text_prefix(ServeText *t, const char *b, size_t n) {
    RS_ASSERT(t->len == t->ready && !t->matched);
    t->cap = t->len + n + 1;
    t->buf = realloc(t->buf, t->cap);
    RS_ASSERT(t->buf);
    memcpy(t->buf + t->len, b, n);
    t->len += n;
    t->ready = t->len;
}

void serve_text_finish(ServeText *t) {
    t->ready = t->len;
}

char *serve_utf8_clean(const char *s, size_t n, size_t *out_n) {
    char *out = rs_xmalloc(n * 3 + 1), *p = out; /* each bad byte: 3-byte U+FFFD */
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        if (k > 0 && cp != 0) {
            memcpy(p, s + i, (size_t)k);
            p += k;
            i += (size_t)k;
        } else { /* invalid, or a NUL that would end the JSON string early */
            memcpy(p, "\xef\xbf\xbd", 3);
            p += 3;
            i++;
        }
    }
    *p = 0;
    *out_n = (size_t)(p - out);
    return out;
}

char *serve_text_take(ServeText *t, size_t *n) {
    if (t->ready <= t->sent) return NULL;
    char *s = serve_utf8_clean(t->buf + t->sent, t->ready - t->sent, n);
    t->sent = t->ready;
    return s;
}
