/* Printable text from untrusted bytes: what a peer process or an input file supplies (a
 * drafter's ERROR text, a CSV header, a tensor name) is escaped before it reaches a terminal
 * or a log, so it cannot move the cursor, clear the screen or forge a line of our output. */
#ifndef ROOTSPEC_TEXTSAFE_H
#define ROOTSPEC_TEXTSAFE_H
#include <stddef.h>

/* Writes src[0..n) into dst (capacity cap >= 1, always NUL-terminated): printable ASCII and
 * well-formed UTF-8 pass, every other byte (C0/C1 controls, DEL, invalid UTF-8) and the
 * backslash become \xHH, and '"' too when quote != 0. Output that does not fit ends in
 * "...". Returns dst. */
char *rs_escape(char *dst, size_t cap, const void *src, size_t n, int quote);
/* rs_escape of a NUL-terminated string (NULL reads as ""). */
char *rs_escape_str(char *dst, size_t cap, const char *s);

#endif
