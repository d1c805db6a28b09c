/* Escaping of untrusted text for terminals and logs; see textsafe.h. */
#include "textsafe.h"
#include <stdio.h>
#include <string.h>

/* Length of the well-formed UTF-8 sequence at s (n bytes left) that is not a C1 control
 * (U+0080..U+009F: some terminals act on them), else 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    if (cp >= 0x80 && cp <= 0x9f) return 0;
    return len;
}

/* One unit of s[0..n): *step input bytes (a UTF-8 sequence or one byte), written as they
 * are (*plain) or as \xHH; returns the output bytes it takes. */
static size_t esc_unit(const unsigned char *s, size_t n, int quote, size_t *step, int *plain) {
    unsigned c = s[0];
    size_t u = c >= 0x80 ? utf8_len(s, n) : 0;
    *plain = (c >= 0x20 && c < 0x7f && c != '\\' && !(quote && c == '"')) || u;
    *step = u ? u : 1;
    return *plain ? *step : 4;
}

char *rs_escape(char *dst, size_t cap, const void *src, size_t n, int quote) {
    const unsigned char *s = src;
    size_t o = 0, rest = 0, step;
    int plain;
    if (!cap) return dst;
    for (size_t i = 0; i < n; i += step) rest += esc_unit(s + i, n - i, quote, &step, &plain);
    int cut = o + rest + 1 > cap; /* then keep room for "..." */
    for (size_t i = 0; i < n; i += step) {
        size_t need = esc_unit(s + i, n - i, quote, &step, &plain);
        if (o + need + (cut ? 4 : 1) > cap) break;
        if (plain) memcpy(dst + o, s + i, need);
        else snprintf(dst + o, cap - o, "\\x%02x", s[i]);
        o += need;
    }
    if (cut && o + 4 <= cap) memcpy(dst + o, "...", 3), o += 3;
    dst[o] = 0;
    return dst;
}

char *rs_escape_str(char *dst, size_t cap, const char *s) {
    return rs_escape(dst, cap, s ? s : "", s ? strlen(s) : 0, 0);
}
