/* Sequences of the CPU backend's paged KV cache (kernels/backend.h: Sequences): rows of
 * several sequences of different lengths, joining and leaving, with prefill chunks and
 * tree commits, in one forward_batch per round; every kept row's logits must be the bits a
 * fresh single-sequence causal run of that row's path gives. Blocks follow lengths and
 * come back; a batch that does not fit changes nothing. */
#include "testutil.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define VOCAB 96
#define CAP 128
#define NSEQ 3

static Model *seq_model(int ci) {
    static const Arch arch[] = {ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3};
    return tu_random_model(arch[ci], 32, 48, 2, 4, 2, VOCAB, 2000 + ci);
}

static Backend *seq_backend(const Model *m, int cap, int seqs, int batch) {
    BackendParams bp = {.kv_capacity = cap, .max_batch = batch, .max_pending = batch > 16 ? batch : 16,
                        .threads = 2, .max_seqs = seqs};
    Backend *b = NULL;
    RsErr e = {0};
    ck_assert_msg(backend_create(&cpu_backend_ops, m, &bp, &b, &e) == RS_OK, "%s", e.msg);
    return b;
}

/* The last row of a fresh causal run of seq[0..len) on sequence 0 of ref. */
static void solo_logits(Backend *ref, const int *seq, int len, float *out) {
    int pos[CAP], last = len - 1;
    for (int i = 0; i < len; i++) pos[i] = i;
    RsErr e = {0};
    backend_kv_reset(ref);
    ck_assert_msg(backend_forward(ref, seq, pos, len, NULL, &last, 1, out, &e) == RS_OK, "%s",
                  e.msg);
}

typedef struct {
    int id, len, want; /* backend sequence, committed tokens, tokens it ends with */
    int hist[CAP];     /* its committed tokens */
    int tok[8], pos[8], n, tree;
    uint8_t mask[8 * 8];
    int path_end[8];   /* per row: tokens of the path it ends (hist + ...) */
} Seq;

/* This round's rows of s: a chunk of 1..5 tokens, or a tree of two siblings at the next
 * position and a child of the second (commit keeps the second and its child). */
static void seq_plan(Seq *s, Rng *r) {
    s->tree = s->len > 0 && rng_next(r) % 3 == 0 && s->len + 2 <= s->want;
    memset(s->mask, 0, sizeof s->mask);
    if (s->tree) {
        s->n = 3;
        for (int i = 0; i < 3; i++) s->tok[i] = (int)(rng_next(r) % VOCAB);
        s->pos[0] = s->pos[1] = s->len;
        s->pos[2] = s->len + 1;
        s->mask[0] = 1;
        s->mask[3 + 1] = 1;
        s->mask[6 + 1] = s->mask[6 + 2] = 1;
        return;
    }
    int room = s->want - s->len;
    s->n = 1 + (int)(rng_next(r) % 5);
    s->n = s->n < room ? s->n : room;
    for (int i = 0; i < s->n; i++) {
        s->tok[i] = (int)(rng_next(r) % VOCAB);
        s->pos[i] = s->len + i;
    }
}

/* Checks kept row `row` of the batch, the logits after s's row i, against a solo run. */
static int seq_check(Backend *ref, const Seq *s, int i, const float *got) {
    int path[CAP + 8], n = s->len;
    memcpy(path, s->hist, sizeof(int) * (size_t)n);
    if (!s->tree) {
        for (int k = 0; k <= i; k++) path[n++] = s->tok[k];
    } else {
        if (i == 2) path[n++] = s->tok[1];
        path[n++] = s->tok[i];
    }
    float want[VOCAB], mx;
    solo_logits(ref, path, n, want);
    char label[64];
    snprintf(label, sizeof label, "seq %d row %d (len %d)", s->id, i, n);
    return tu_compare(label, got, want, VOCAB, 0.0f, 0.0f, &mx);
}

static void seq_commit(Backend *b, Seq *s) {
    RsErr e = {0};
    int keep[8];
    if (s->tree) {
        keep[0] = 1, keep[1] = 2;
        s->hist[s->len++] = s->tok[1];
        s->hist[s->len++] = s->tok[2];
        ck_assert_msg(backend_seq_commit(b, s->id, keep, 2, &e) == RS_OK, "%s", e.msg);
    } else {
        for (int i = 0; i < s->n; i++) keep[i] = i, s->hist[s->len++] = s->tok[i];
        ck_assert_msg(backend_seq_commit(b, s->id, keep, s->n, &e) == RS_OK, "%s", e.msg);
    }
    ck_assert_int_eq(backend_seq_n_committed(b, s->id), s->len);
}

/* One round: every live sequence's rows in one pass, each row's logits kept. */
static int seq_round(Backend *b, Backend *ref, Seq *seqs, int *live, int n_live, Rng *r) {
    BackendSeg g[NSEQ];
    int rows[NSEQ * 8], owner[NSEQ * 8], idx[NSEQ * 8], nr = 0;
    for (int k = 0; k < n_live; k++) {
        Seq *s = &seqs[live[k]];
        seq_plan(s, r);
        g[k] = (BackendSeg){s->id, s->tok, s->pos, s->n, s->tree ? s->mask : NULL};
        for (int i = 0; i < s->n; i++, nr++) rows[nr] = nr, owner[nr] = live[k], idx[nr] = i;
    }
    static float logits[NSEQ * 8 * VOCAB];
    RsErr e = {0};
    ck_assert_msg(backend_forward_batch(b, g, n_live, rows, nr, logits, &e) == RS_OK, "%s",
                  e.msg);
    int bad = 0;
    for (int j = 0; j < nr; j++)
        bad += seq_check(ref, &seqs[owner[j]], idx[j], logits + (size_t)j * VOCAB);
    for (int k = 0; k < n_live; k++) seq_commit(b, &seqs[live[k]]);
    return bad;
}

START_TEST(test_seq_batch) {
    Model *m = seq_model(_i);
    Backend *b = seq_backend(m, CAP, NSEQ + 1, 24), *ref = seq_backend(m, CAP, 1, CAP);
    Rng r;
    rng_seed(&r, 500 + _i);
    Seq seqs[NSEQ] = {{.want = 30}, {.want = 17}, {.want = 41}};
    int opened[NSEQ] = {0}, bad = 0, rounds = 0;
    RsErr e = {0};
    for (;; rounds++) {
        int live[NSEQ], n_live = 0;
        for (int k = 0; k < NSEQ; k++) {
            if (!opened[k] && rounds >= 3 * k) { /* joins mid-decode */
                ck_assert_msg(backend_seq_open(b, &seqs[k].id, &e) == RS_OK, "%s", e.msg);
                opened[k] = 1;
            }
            if (opened[k] == 1 && seqs[k].len == seqs[k].want) { /* leaves */
                backend_seq_close(b, seqs[k].id);
                opened[k] = 2;
            }
            if (opened[k] == 1) live[n_live++] = k;
        }
        if (n_live == 0) break;
        bad += seq_round(b, ref, seqs, live, n_live, &r);
        int held = 0;
        for (int k = 0; k < n_live; k++) held += backend_kv_blocks_for(seqs[live[k]].len);
        ck_assert_int_eq(backend_kv_usage(b).blocks_used, held); /* memory follows lengths */
    }
    ck_assert_msg(bad == 0, "%d logits rows differ from solo runs", bad);
    ck_assert_int_ge(rounds, 10);
    BackendKvUsage u = backend_kv_usage(b);
    ck_assert_int_eq(u.blocks_used, 0);
    ck_assert_int_eq(u.seqs_open, 1);
    ck_assert_int_eq(u.blocks_total, CAP / BACKEND_KV_BLOCK);
    backend_destroy(&b);
    backend_destroy(&ref);
    model_destroy(&m);
}
END_TEST

/* A batch whose blocks are not free fails with RS_EFULL and changes nothing; opens beyond
 * max_seqs fail; a closed sequence's blocks serve the next. */
START_TEST(test_seq_blocks) {
    Model *m = seq_model(0);
    Backend *b = seq_backend(m, 3 * BACKEND_KV_BLOCK, 3, 32);
    int tok[48] = {0}, pos[48], all[16], s1, s2, s3;
    for (int i = 0; i < 48; i++) pos[i] = i;
    for (int i = 0; i < 16; i++) all[i] = i;
    RsErr e = {0};
    ck_assert_int_eq(backend_seq_open(b, &s1, &e), RS_OK);
    ck_assert_int_eq(backend_seq_open(b, &s2, &e), RS_OK);
    ck_assert_int_eq(backend_seq_open(b, &s3, &e), RS_EFULL);
    ck_assert_msg(strstr(e.msg, "all 3 sequences are open"), "%s", e.msg);
    BackendSeg g[2] = {{s1, tok, pos, 16, NULL}, {s2, tok, pos, 16, NULL}};
    ck_assert_int_eq(backend_forward_batch(b, g, 2, NULL, 0, NULL, &e), RS_OK);
    ck_assert_int_eq(backend_seq_commit(b, s1, all, 16, &e), RS_OK);
    ck_assert_int_eq(backend_seq_commit(b, s2, all, 16, &e), RS_OK);
    /* 2 of 3 blocks held: s1 and s2 each want one more */
    BackendSeg h[2] = {{s1, tok, pos + 16, 1, NULL}, {s2, tok, pos + 16, 1, NULL}};
    ck_assert_int_eq(backend_forward_batch(b, h, 2, NULL, 0, NULL, &e), RS_EFULL);
    ck_assert_msg(strstr(e.msg, "needs 2 more KV blocks; 1 of 3 are free"), "%s", e.msg);
    ck_assert_int_eq(backend_seq_n_pending(b, s1), 0);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 2);
    BackendSeg twice[2] = {{s1, tok, pos + 16, 1, NULL}, {s1, tok, pos + 17, 1, NULL}};
    ck_assert_int_eq(backend_forward_batch(b, twice, 2, NULL, 0, NULL, &e), RS_EINVAL);
    ck_assert_int_eq(backend_forward_batch(b, h, 1, NULL, 0, NULL, &e), RS_OK);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 3);
    /* dropping the pending entry gives its block back */
    ck_assert_int_eq(backend_seq_commit(b, s1, all, 0, &e), RS_OK);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 2);
    backend_seq_close(b, s1);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 1);
    BackendSeg closed = {s1, tok, pos, 1, NULL};
    ck_assert_int_eq(backend_forward_batch(b, &closed, 1, NULL, 0, NULL, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "is not open"), "%s", e.msg);
    ck_assert_int_eq(backend_forward_batch(b, h + 1, 1, NULL, 0, NULL, &e), RS_OK);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 2);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

/* Resident bytes of this process (/proc/self/statm), -1 where unknown. */
static long long resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long size, res = -1;
    if (f && fscanf(f, "%lld %lld", &size, &res) != 2) res = -1;
    if (f) fclose(f);
    return res < 0 ? -1 : res * 4096;
}

/* A cache is resident from creation, one sequence's as many sequences' (a server's), so
 * no pass (the first prompt's prefill, a server's first burst) takes its page faults. */
START_TEST(test_seq_cache_resident) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 4, 4, 4, 64, 3);
    long long kv = 2LL * 4 * 32 * 2 * 65536; /* K and V, 4 layers, 32 wide, f16, entries */
    for (int seqs = 1; seqs <= 4; seqs += 3) {
        BackendParams bp = {.kv_capacity = 65536, .max_batch = 16, .max_pending = 16,
                            .threads = 1, .max_seqs = seqs};
        Backend *b = NULL;
        RsErr e = {0};
        long long r0 = resident_bytes();
        ck_assert_msg(backend_create(&cpu_backend_ops, m, &bp, &b, &e) == RS_OK, "%s", e.msg);
        long long grew = resident_bytes() - r0;
        if (r0 < 0) {
            fprintf(stderr, "SKIP test_seq_cache_resident: no /proc/self/statm\n");
        } else {
            ck_assert_msg(grew >= kv * 9 / 10, "%d sequences: %lld bytes resident of %lld", seqs, grew, kv);
        }
        backend_destroy(&b);
    }
    model_destroy(&m);
}
END_TEST

/* Threads of this process allowed on one CPU only: -1 without /proc. */
static int pinned_threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *t; (t = readdir(d));) {
        if (t->d_name[0] == '.') continue;
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", t->d_name);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "Cpus_allowed_list:", 18)) {
                const char *v = line + 18;
                while (*v == ' ' || *v == '\t') v++;
                n += !strpbrk(v, ",-"); /* one CPU: no list, no range */
            }
        if (f) fclose(f);
    }
    closedir(d);
    return n;
}

/* A backend of one sequence pins its worker threads; one many sequences share (a
 * server's, beside a thread per sequence) leaves them to the scheduler. */
START_TEST(test_seq_workers_unpinned) {
    cpu_set_t set;
    int before = pinned_threads();
    if (before < 0 || sched_getaffinity(0, sizeof set, &set) || CPU_COUNT(&set) < 2) {
        fprintf(stderr, "SKIP test_seq_workers_unpinned: fewer than 2 CPUs or no /proc\n");
        return;
    }
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 4, 64, 3);
    for (int seqs = 1; seqs <= 4; seqs += 3) {
        BackendParams bp = {.kv_capacity = 256, .max_batch = 16, .max_pending = 16,
                            .threads = 2, .max_seqs = seqs};
        Backend *b = NULL;
        RsErr e = {0};
        ck_assert_msg(backend_create(&cpu_backend_ops, m, &bp, &b, &e) == RS_OK, "%s", e.msg);
        /* a worker pins itself once it runs: give it a moment (more where none should) */
        usleep(seqs == 1 ? 0 : 100000);
        int want = seqs == 1 ? 1 : 0, got = pinned_threads() - before;
        for (int i = 0; i < 100 && got != want; i++) {
            usleep(10000);
            got = pinned_threads() - before;
        }
        ck_assert_msg(got == want, "%d sequences: %d worker threads pinned, want %d", seqs, got, want);
        backend_destroy(&b);
    }
    model_destroy(&m);
}
END_TEST

Suite *suite_seqs(void) {
    Suite *s = suite_create("seqs");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_seq_batch, 0, 3);
    tcase_add_test(tc, test_seq_blocks);
    tcase_add_test(tc, test_seq_cache_resident);
    tcase_add_test(tc, test_seq_workers_unpinned);
    suite_add_tcase(s, tc);
    return s;
}
