/* Read access to a Hugging Face directory (config.json + model.safetensors or a sharded
 * index), shared by the model loader (hf.c) and the EAGLE-3 head loader (eagle3.c), so
 * that both validate safetensors headers and config fields the same way. */
#ifndef ROOTSPEC_HF_H
#define ROOTSPEC_HF_H
#include "loader.h"
#include <cjson/cJSON.h>

typedef struct HfTensors HfTensors;

typedef struct {
    const char *dtype;  /* safetensors dtype string ("F32", "I64", "BOOL", ...) */
    int nd;
    int64_t shape[8];
    const void *data;   /* raw little-endian bytes inside the mapping (valid until close) */
    size_t bytes;
    const char *file;   /* the shard's path, for messages */
} HfTensorInfo;

/* Parses <dir>/config.json; *out is a cJSON object the caller deletes. */
int hf_read_config_json(const char *dir, cJSON **out, RsErr *e);
/* The Llama-family fields of a config.json (sizes, heads, head_dim, vocabulary, eps, rope,
 * tied embeddings, bos/eos) into c, whose arch the caller has set; `arch` names it in
 * messages. Does not run loader_check_config. */
int hf_config_fields(const char *path, const cJSON *j, const char *arch, Config *c, RsErr *e);

/* Maps every safetensors file of dir (headers validated). Close with hf_tensors_destroy. */
int hf_tensors_create(const char *dir, HfTensors **out, RsErr *e);
void hf_tensors_destroy(HfTensors **t);
/* 1 with *info filled when the directory holds tensor `name`, else 0. */
int hf_tensor_find(const HfTensors *t, const char *name, HfTensorInfo *info);
/* Reads w->hf_name (F32/F16/BF16 stored): a matrix with w->qt gets its stored type and a
 * pointer into the file's mapping (keep the mapping: hf_tensors_take_maps), anything else
 * is read as f32 into *w->slot. Hashes name, dtype and shape into *fp. Refuses a missing
 * tensor, another shape or another dtype, naming both. */
int hf_tensors_load(const HfTensors *t, const WeightReq *w, uint64_t *fp, RsErr *e);
/* Hands the file mappings to the caller, so the QTensors hf_tensors_load pointed into them
 * outlive hf_tensors_destroy: *maps and *sizes (n entries each) are malloc'd; the caller
 * munmaps every map and frees both arrays. */
void hf_tensors_take_maps(HfTensors *t, void ***maps, size_t **sizes, int *n);

#endif
