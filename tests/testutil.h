/* Helpers shared by the Check suites: fixture paths, tolerant float comparison that
 * prints the first mismatches (llm.c style), and tiny random models built in memory. */
#ifndef ROOTSPEC_TESTUTIL_H
#define ROOTSPEC_TESTUTIL_H
#include <check.h>
#include "common/logits.h"
#include "common/model.h"
#include "draft_proc/drafter.h"
#include "kernels/backend.h"
#include <sys/types.h>

/* Path of the default model (models/...gguf); the test fails loudly if it is missing. */
const char *tu_default_model_path(void);
/* Path under tests/fixtures/. Returned pointer is static storage. */
const char *tu_fixture(const char *rel);

/* Counts elements where |a-b| > atol + rtol*|ref|; prints up to 5 mismatches with label.
 * Returns the number of mismatches; *max_abs gets the largest |a-b|. */
int tu_compare(const char *label, const float *got, const float *ref, size_t n, float atol,
               float rtol, float *max_abs);

/* The sampling law s (common/logits.h) over one row, computed the plain way as the
 * reference for the fused reductions and the decoders: a full sort, z = l / T in double,
 * top-k, then top-p over the survivors' softmax (summed in double, in sorted order), then
 * min-p; probs (n) gets softmax(z) over the kept tokens, 0 elsewhere. Greedy: the point mass
 * on the first argmax. */
void tu_sampling_probs(const float *row, int n, const Sampling *s, double *probs);

/* A random Llama-shaped model built in memory (no file), owned by the caller
 * (model_destroy). Weights ~ N(0, scale) from the given seed; norms = 1 + small noise. */
Model *tu_random_model(Arch arch, int dim, int hidden_dim, int n_layers, int n_heads,
                       int n_kv_heads, int vocab, uint64_t seed);
/* The same model with its matrices stored as `type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1:
 * quantized here as llama.cpp's reference quantizers do; dim and hidden_dim multiples of
 * 32 for the block types). */
Model *tu_random_model_typed(Arch arch, int dim, int hidden_dim, int n_layers, int n_heads,
                             int n_kv_heads, int vocab, uint64_t seed, uint32_t type);

/* A matrix expanded to f32 (rows, cols) in logical row order. The buffer stays valid for
 * the next 15 calls (a ring the test never frees). */
float *tu_f32(const QTensor *w);

/* Golden logits written by tools/gen_golden.py: "RSGL", version 1, n, vocab, token ids,
 * then f32 logits for every position. Read with every size checked; fails the test on a
 * malformed file. Free with tu_golden_free. */
typedef struct {
    int n, vocab;
    int *tokens;   // (n)
    float *logits; // (n, vocab)
} TuGolden;
void tu_golden_read(const char *path, TuGolden *g);
void tu_golden_free(TuGolden *g);

/* ---- Kernel activations (kernels/cpu/cpu_qmatmul.h) ---- */
#include "kernels/cpu/cpu_qmatmul.h"
/* x (n, in) with every quantized form a kernel may take (per 256 only when in % 256 ==
 * 0); the copies are the caller's: tu_acts_free. */
QkActs tu_acts(const float *x, int n, int in);
void tu_acts_free(QkActs *a);
/* Row t of a as a one-row QkActs (borrowing a's buffers). */
QkActs tu_acts_row(const QkActs *a, int t);
/* Element i of row t as a kernel taking form act (QK_ACT_*) sees it: x itself, or d * q
 * of its block of 32 or 256; *half_step (optional) = half that block's d, the most the
 * quantization moved it. */
double tu_act_seen(const QkActs *a, int act, int t, int i, double *half_step);

/* ---- rootspec-draft's server loop on a thread (protocol tests without a second process) */
typedef struct TuServer TuServer;
/* Serves drafter d (borrowed; insecure ipc://, tokenizer hash 42) on endpoint ep under
 * name until tu_serve_stop. */
TuServer *tu_serve(Drafter *d, const char *ep, const char *name);
/* Stops and joins the server; returns draft_server_run's status. Frees *s and clears it. */
int tu_serve_stop(TuServer **s);

/* ---- Child processes (the suites that run the real binaries) ----
 * Each takes the suite's scratch directory `dir`; TAG names a child's files there:
 * dir/TAG.out (stdout) and dir/TAG.err (stderr). */

/* mkdtemp("/tmp/<prefix>-XXXXXX") into dir (size n); fails the test on error. */
void tu_dir_make(char *dir, size_t n, const char *prefix);
/* rm -rf dir; fails the test on error. */
void tu_dir_remove(const char *dir);
/* fork/exec argv. stdout goes to out_path when given (appended, so several children can
 * share a log) or else dir/TAG.out; stderr to dir/TAG.err. group: the child leads a process
 * group of its own (so a script and its children can be killed together). nofile > 0 caps
 * its descriptors (soft and hard, like `ulimit -n`) before exec. Returns the pid. */
pid_t tu_spawn(const char *dir, char *const argv[], const char *tag, const char *out_path,
               int group, int nofile);
/* dir/TAG.EXT's contents, or "" when it cannot be read; the caller frees. */
char *tu_slurp(const char *dir, const char *tag, const char *ext);
/* The child's exit status (128 + signal when killed); fails the test, killing the child,
 * when it runs past timeout_ms. */
int tu_wait_exit(pid_t pid, int timeout_ms);

/* The backend settings the tests give a target or drafter: kv entries, threads. */
#define TU_BP(kv, nth) (&(BackendParams){.kv_capacity = (kv), .threads = (nth)})

#endif
