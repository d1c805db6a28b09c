/* Prompt files (JSON lines), read by rootspec-target --prompts and rootspec-bench.
 * Two formats, detected per line:
 *   Spec-Bench question.jsonl: {"question_id": 81, "category": "writing", "turns": [first, ...]}
 *     -> the first turn is the prompt, question_id its id;
 *   HumanEval-style: {"task_id": "HumanEval/0", "prompt": "..."} -> prompt used verbatim,
 *     task_id its id ("lineN" when absent).
 * A file with any malformed line is refused as a whole (see prompts_help()). */
#ifndef ROOTSPEC_PROMPTS_H
#define ROOTSPEC_PROMPTS_H
#include "common/util.h"

#define PROMPT_ID_MAX 64 /* prompt ids are at most 63 bytes of [A-Za-z0-9_./:+-] */

typedef struct {
    char id[PROMPT_ID_MAX]; /* question_id / task_id as text, unique within the file */
    char *category;        /* "" when absent */
    char *text;            /* NUL-terminated, valid UTF-8, non-empty */
    int line;              /* 1-based line number in the file */
} Prompt;

typedef struct {
    int n;
    Prompt *items; // (n)
} PromptSet;

/* Loads a prompt file. On any malformed line (bad JSON, invalid UTF-8, NUL byte, missing or
 * non-string first turn / prompt, bad or duplicate id) refuses the whole file with an error
 * naming the file and the 1-based line. Blank lines are skipped. An empty file is an error. */
int prompts_load(const char *path, PromptSet **out, RsErr *e);
void prompts_destroy(PromptSet **p);

/* Strict UTF-8 check (no overlongs, no surrogates, <= U+10FFFF). Returns the byte offset of
 * the first invalid sequence, or -1 when s[0..n) is valid. */
long prompts_utf8_invalid_at(const char *s, size_t n);

/* The --help paragraph describing accepted prompt files (static string). */
const char *prompts_help(void);

#endif
