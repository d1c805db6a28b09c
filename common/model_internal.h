/* Loader entry points and GGUF access used inside common/ (model.c, tokenizer.c). */
#ifndef ROOTSPEC_MODEL_INTERNAL_H
#define ROOTSPEC_MODEL_INTERNAL_H
#include "model.h"

int gguf_load_model(const char *path, Model **out, RsErr *e);
int hf_load_model(const char *dir, Model **out, RsErr *e);
void gguf_destroy(GGUFFile **g);

/* Metadata look-ups on an open GGUF file (for the tokenizer). Return 0 if found. */
int gguf_get_str(const GGUFFile *g, const char *key, const char **s, size_t *len);
int gguf_get_int(const GGUFFile *g, const char *key, long long *v);
/* String array: *n entries; gguf_arr_str(g, key, i, &s, &len) fetches entry i. */
int gguf_get_arr_n(const GGUFFile *g, const char *key, size_t *n);
int gguf_arr_str(const GGUFFile *g, const char *key, size_t i, const char **s, size_t *len);
/* Numeric array element (int32/float32 arrays such as token_type, scores). */
int gguf_arr_num(const GGUFFile *g, const char *key, size_t i, double *v);

#endif
