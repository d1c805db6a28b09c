/* Suite `proto`: the wire codec (round trips, every kind of malformed frame, truncation at
 * every offset, byte flips), the ZeroMQ helpers over inproc:// (incl. timeout and
 * multi-part), pool_finalize / pool_rank_cmp, the cross-language test vectors, and the
 * endpoint policy and key generation of proto/secure.c.
 * The vectors in tests/fixtures/proto/vectors.bin are checked byte for byte here and by
 * tools/proto_client.py --check-vectors, whose Python msgpack encoder is the independent
 * reference; regenerate with PROTO_WRITE_VECTORS=1 after a deliberate format change. */
#include "proto/proto.h"
#include "proto/secure.h"
#include "testutil.h"
#include <math.h>
#include <string.h>
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/sched/types.h>
#include <sys/syscall.h>
#endif
#include <zmq.h>

/* ------------------------------------------------------------ fixtures */

/* EAGLE-3-shaped synthetic pool (DESIGN.md §2): 10 depth-1 nodes, all expanded; at depth
 * d >= 2 the expanded nodes are child j of the j-th expanded parent (start + 11 j). Values
 * are exact in float32 so that Python rebuilds the same bytes (tools/proto_client.py). */
static void make_pool(Pool *p) {
    memset(p, 0, sizeof *p);
    int n = 0;
    for (int j = 0; j < 10; j++) {
        p->parent[n] = -1;
        p->depth[n] = 1;
        n++;
    }
    int level_start = 0;
    for (int d = 2; d <= POOL_MAX_DEPTH; d++) {
        int new_start = n;
        for (int j = 0; j < 10; j++) {
            int par = d == 2 ? level_start + j : level_start + 11 * j;
            for (int c = 0; c < 10; c++) {
                p->parent[n] = par;
                p->depth[n] = (uint8_t)d;
                n++;
            }
        }
        level_start = new_start;
    }
    ck_assert_int_eq(n, POOL_MAX);
    p->n = n;
    for (int i = 0; i < n; i++) {
        p->token[i] = (int32_t)((i * 7919 + 13) % 49152);
        p->logq[i] = -(float)((i * 37) % 97 + 1) / 32.0f;
    }
    p->draft_ns = 51234567;
    p->n_passes = 8;
    p->n_expanded = 70;
}

/* A valid pool with `expanded` (10..110) nodes that have children: 10 depth-1 nodes with 10
 * children each, then one depth-3 child under each of the first expanded - 10 depth-2 nodes
 * (the (10 + k)-th expanded node is made so by candidate 110 + k - 1). */
static void make_wide_pool(Pool *p, int expanded) {
    ck_assert(expanded >= 10 && expanded <= 110);
    memset(p, 0, sizeof *p);
    int n = 0;
    for (int j = 0; j < 10; j++) {
        p->parent[n] = -1;
        p->depth[n] = 1;
        p->token[n] = j;
        n++;
    }
    for (int j = 0; j < 10; j++)
        for (int c = 0; c < 10; c++) {
            p->parent[n] = j;
            p->depth[n] = 2;
            p->token[n] = c;
            n++;
        }
    for (int k = 0; k < expanded - 10; k++) {
        p->parent[n] = 10 + k;
        p->depth[n] = 3;
        p->token[n] = 1;
        n++;
    }
    for (int i = 0; i < n; i++) p->logq[i] = -0.5f;
    p->n = n;
}

static Pool g_pool; /* vector pool; Pools are large, keep them off the stack */

#define SESSION 0x1122334455667788ull

static const int32_t reset_ids[] = {1, 9690, 28, 49151, 0, 127, 128, 255, 256, 32767, 32768};
static const int32_t grow_ids[] = {42, 1000, 2};
/* Feature payloads of the RESET (bf16, width 2) and COMMIT_GROW (f16, width 4) vectors:
 * bit patterns that decode to exact values (1.0, -2.5, 0, 65504 (f16 max), ...). */
static const uint16_t reset_feat[22] = {0x3f80, 0xc020, 0x0000, 0x8000, 0x7f7f, 0x0001,
                                        0x4049, 0xbf80, 0x3c00, 0x3e80, 0x4000, 0x4040,
                                        0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110,
                                        0x4120, 0x4130, 0x4140, 0xff7f};
static const uint16_t grow_feat[12] = {0x3c00, 0xc100, 0x0000, 0x7bff, 0x0001, 0x8400,
                                       0x3555, 0x4248, 0xfbff, 0x3800, 0x4000, 0x4400};

/* The seven canonical messages, one per type (the test vectors). */
static void make_vector(int type, ProtoMsg *m) {
    memset(m, 0, sizeof *m);
    m->type = (ProtoType)type;
    m->session = SESSION;
    switch (type) {
    case PROTO_HELLO:
        m->seq = 1;
        strcpy(m->u.hello.fingerprint, "smollm2-135m-q4_1-test");
        m->u.hello.tokenizer_hash = 0xcbf29ce484222325ull;
        m->u.hello.vocab_size = 49152;
        m->u.hello.caps = PROTO_CAP_POOL_V1;
        m->u.hello.topk = 10;
        m->u.hello.depth = 8;
        m->u.hello.expand = 10;
        break;
    case PROTO_HELLO_OK:
        m->seq = 1;
        strcpy(m->u.hello_ok.fingerprint, "smollm2-135m-q4_1-test");
        m->u.hello_ok.tokenizer_hash = 0xcbf29ce484222325ull;
        m->u.hello_ok.vocab_size = 49152;
        m->u.hello_ok.caps = PROTO_CAP_POOL_V1 | PROTO_CAP_CUDA | PROTO_CAP_FEATURES;
        strcpy(m->u.hello_ok.name, "rootspec-drafter/cpu");
        m->u.hello_ok.n_feat_layers = 3;
        m->u.hello_ok.feat_layers[0] = 2;
        m->u.hello_ok.feat_layers[1] = 16;
        m->u.hello_ok.feat_layers[2] = 300;
        break;
    case PROTO_RESET:
        m->seq = 2;
        m->sid = 7; /* the version-4 sequence id */
        m->u.tokens.ids = reset_ids;
        m->u.tokens.n = (int)(sizeof reset_ids / sizeof reset_ids[0]);
        m->u.tokens.feat_type = PROTO_FEAT_BF16;
        m->u.tokens.feat_width = 2;
        m->u.tokens.feat = reset_feat;
        break;
    case PROTO_COMMIT_GROW:
        m->seq = 3;
        m->sid = 7;
        m->u.tokens.ids = grow_ids;
        m->u.tokens.n = 3;
        m->u.tokens.feat_type = PROTO_FEAT_F16;
        m->u.tokens.feat_width = 4;
        m->u.tokens.feat = grow_feat;
        m->u.tokens.depth = 5; /* a narrowed pool: the version-3 width field rides along */
        m->u.tokens.width = 1;
        break;
    case PROTO_POOL:
        m->seq = 3;
        m->sid = 7;
        make_pool(&g_pool);
        m->u.pool.pool = &g_pool;
        m->u.pool.commit_pass_ns = 4567890;
        break;
    case PROTO_ERROR:
        m->seq = 4;
        m->u.error.code = RS_EPROTO;
        strcpy(m->u.error.message, "proto: unknown message type 99");
        break;
    case PROTO_BYE: m->seq = 5; break;
    default: ck_abort_msg("bad vector type %d", type);
    }
}

static const char *vector_name(int type) {
    static const char *names[] = {"",     "hello", "hello_ok", "reset",
                                  "commit_grow", "pool",  "error",    "bye"};
    return names[type];
}

static void encode_ok(const ProtoMsg *m, msgpack_sbuffer *sb) {
    RsErr e = {0};
    msgpack_sbuffer_clear(sb);
    int rc = proto_encode(m, sb, &e);
    ck_assert_msg(rc == RS_OK, "encode %s: %s", proto_type_name(m->type), e.msg);
}

/* Decodes buf expecting failure with code and a message containing want. */
static void expect_fail(const void *buf, size_t len, int code, const char *want) {
    ProtoMsg m = {0};
    RsErr e = {0};
    int rc = proto_decode(buf, len, &m, &e);
    ck_assert_msg(rc == code, "expected %s (%d) for '%s', got %d: %s", rs_status_name(code), code,
                  want, rc, e.msg);
    ck_assert_msg(strstr(e.msg, want) != NULL, "message '%s' lacks '%s'", e.msg, want);
    ck_assert_int_eq(m.type, PROTO_NONE);
    proto_msg_clear(&m);
}

/* msgpack-c packer on an sbuffer, for hand-built (malformed) frames. */
typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} Frame;

static void frame_init(Frame *f) {
    msgpack_sbuffer_init(&f->sb);
    msgpack_packer_init(&f->pk, &f->sb, msgpack_sbuffer_write);
}

/* A version-4 header has the sequence id (0 here); older ones are 6 elements. */
static void frame_header(Frame *f, const char *magic, unsigned version, unsigned type) {
    msgpack_pack_array(&f->pk, version >= 4 ? 7 : 6);
    msgpack_pack_str(&f->pk, strlen(magic));
    msgpack_pack_str_body(&f->pk, magic, strlen(magic));
    msgpack_pack_uint32(&f->pk, version);
    msgpack_pack_uint32(&f->pk, type);
    msgpack_pack_uint64(&f->pk, 77);
    msgpack_pack_uint64(&f->pk, 3);
    if (version >= 4) msgpack_pack_uint32(&f->pk, 0);
}

/* k nils: fills the rest of a body whose earlier field is the one under test. */
static void pad(msgpack_packer *pk, int k) {
    for (int i = 0; i < k; i++) msgpack_pack_nil(pk);
}

static void pack_s(msgpack_packer *pk, const char *s) {
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* ------------------------------------------------------------ pool_finalize / rank */

START_TEST(test_pool_finalize_valid) {
    static Pool p;
    make_pool(&p);
    RsErr e = {0};
    ck_assert_msg(pool_finalize(&p, 49152, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(pool_finalize(&p, 49152, NULL), 0);
    /* Score = sum of logq along the path, recomputed by walking parents in double. */
    int per_depth[POOL_MAX_DEPTH + 1] = {0};
    for (int i = 0; i < p.n; i++) {
        double s = 0;
        for (int k = i; k >= 0; k = p.parent[k]) s += p.logq[k];
        ck_assert_msg(fabs(s - p.score[i]) < 1e-4, "score %d: %g vs %g", i, p.score[i], s);
        per_depth[p.depth[i]]++;
    }
    ck_assert_int_eq(per_depth[1], 10);
    for (int d = 2; d <= 8; d++) ck_assert_int_eq(per_depth[d], 100);
    ck_assert_int_eq(p.root_first_child, 0);
    ck_assert_int_eq(p.root_n_children, 10);
    /* Child links match a brute-force scan; exactly 70 nodes have children. */
    int n_expanded = 0;
    for (int j = 0; j < p.n; j++) {
        int cnt = 0, first = -1;
        for (int i = 0; i < p.n; i++)
            if (p.parent[i] == j) {
                if (first < 0) first = i;
                cnt++;
            }
        ck_assert_int_eq(p.n_children[j], cnt);
        ck_assert_int_eq(p.first_child[j], first);
        n_expanded += cnt > 0;
    }
    ck_assert_int_eq(n_expanded, POOL_N_EXPANDED);
    ck_assert_int_eq(p.first_child[0], 10);
    ck_assert_int_eq(p.first_child[10], 110); /* node 10 = child 0 of node 0, expanded */
    ck_assert_int_eq(p.n_children[11], 0);    /* child 1 of node 0: not expanded */
    /* Empty pool is valid. */
    static Pool z;
    memset(&z, 0, sizeof z);
    ck_assert_int_eq(pool_finalize(&z, 10, NULL), 0);
    ck_assert_int_eq(z.root_n_children, 0);
    ck_assert_int_eq(z.root_first_child, -1);
}
END_TEST

static void bad_pool(Pool *p, int vocab, const char *want) {
    RsErr e = {0};
    int n = p->n;
    int rc = pool_finalize(p, vocab, &e);
    ck_assert_msg(rc == RS_EPROTO, "expected failure '%s', got %d", want, rc);
    ck_assert_msg(strstr(e.msg, want), "message '%s' lacks '%s'", e.msg, want);
    /* a rejected pool is emptied, so nothing can select from it; without a message too */
    ck_assert_int_eq(p->n, 0);
    p->n = n;
    ck_assert_int_eq(pool_finalize(p, vocab, NULL), RS_EPROTO);
}

START_TEST(test_pool_finalize_rejects) {
    static Pool p;
    make_pool(&p);
    p.parent[5] = 7;
    bad_pool(&p, 49152, "candidate 5 has parent 7, which does not precede it");
    make_pool(&p);
    p.parent[20] = 20;
    bad_pool(&p, 49152, "candidate 20 has parent 20, which does not precede it");
    make_pool(&p);
    p.parent[3] = -2;
    bad_pool(&p, 49152, "candidate 3 has parent -2");
    make_pool(&p);
    p.depth[15] = 3;
    bad_pool(&p, 49152, "candidate 15 has depth 3, expected 2");
    make_pool(&p);
    p.token[12] = 49152;
    bad_pool(&p, 49152, "candidate 12 has token 49152, outside [0, 49152)");
    make_pool(&p);
    p.token[0] = -1;
    bad_pool(&p, 0, "candidate 0 has negative token -1");
    make_pool(&p);
    p.logq[30] = 0.25f;
    bad_pool(&p, 49152, "candidate 30 has log q 0.25, expected finite <= 0");
    make_pool(&p);
    p.logq[31] = NAN;
    bad_pool(&p, 49152, "candidate 31 has log q nan");
    make_pool(&p);
    p.logq[32] = -INFINITY;
    bad_pool(&p, 49152, "candidate 32 has log q -inf");
    make_pool(&p);
    p.n = POOL_MAX + 1;
    bad_pool(&p, 49152, "711 candidates, expected 0..710");
    /* Non-contiguous children: node 0's children are 10..19; make 25 a child of node 0. */
    make_pool(&p);
    p.parent[25] = 0;
    bad_pool(&p, 49152, "children of node 0 are not contiguous (candidate 25 after run 10..19)");
    /* Root children after another run. */
    make_pool(&p);
    p.parent[50] = -1;
    p.depth[50] = 1;
    bad_pool(&p, 49152, "children of node -1 are not contiguous (candidate 50 after run 0..9)");
    /* Duplicate sibling tokens. */
    make_pool(&p);
    p.token[14] = p.token[12];
    bad_pool(&p, 49152, "candidates 12 and 14 are siblings with the same token");
    /* Depth 9: a chain of 9 nodes. */
    memset(&p, 0, sizeof p);
    p.n = 9;
    for (int i = 0; i < 9; i++) {
        p.parent[i] = i - 1;
        p.depth[i] = (uint8_t)(i + 1);
        p.logq[i] = -0.5f;
    }
    bad_pool(&p, 10, "candidate 8 has depth 9, expected 9 (parent 7, max 8)");
    p.n = 8;
    ck_assert_int_eq(pool_finalize(&p, 10, NULL), 0);
    /* More than POOL_N_EXPANDED nodes with children: the target's tree pass (score_all covers
     * every expanded node) is sized for 70, so such a pool used to abort it. */
    make_wide_pool(&p, POOL_N_EXPANDED);
    ck_assert_int_eq(pool_finalize(&p, 10, NULL), 0);
    make_wide_pool(&p, POOL_N_EXPANDED + 1);
    bad_pool(&p, 10, "candidate 170 makes 71 expanded nodes (nodes with children), at most 70");
}
END_TEST

static const Pool *g_cmp_pool;
static int qcmp(const void *a, const void *b) {
    return pool_rank_cmp(g_cmp_pool, *(const int *)a, *(const int *)b);
}

START_TEST(test_pool_rank_cmp) {
    /* 0: root child -1; 1: root child -0.5; 2: child of 1 (-0.5), score -1 at depth 2;
     * 3: root child -1 (ties 0 on score and depth, later index); 4: child of 1 (-0.25). */
    static Pool p;
    memset(&p, 0, sizeof p);
    p.n = 5;
    int32_t par[] = {-1, -1, -1, 1, 1};
    float lq[] = {-1.0f, -0.5f, -1.0f, -0.5f, -0.25f};
    uint8_t dep[] = {1, 1, 1, 2, 2};
    for (int i = 0; i < 5; i++) {
        p.parent[i] = par[i];
        p.logq[i] = lq[i];
        p.depth[i] = dep[i];
        p.token[i] = i;
    }
    ck_assert_int_eq(pool_finalize(&p, 10, NULL), 0);
    /* scores: 0:-1, 1:-0.5, 2:-1, 3:-1 (d2), 4:-0.75 */
    int order[5] = {0, 1, 2, 3, 4};
    g_cmp_pool = &p;
    qsort(order, 5, sizeof order[0], qcmp);
    int want[5] = {1, 4, 0, 2, 3};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(order[i], want[i]);
    for (int a = 0; a < 5; a++) {
        ck_assert_int_eq(pool_rank_cmp(&p, a, a), 0);
        for (int b = 0; b < 5; b++)
            if (a != b) ck_assert_int_eq(pool_rank_cmp(&p, a, b), -pool_rank_cmp(&p, b, a));
    }
    /* On the full pool, every prefix of the ranking is ancestor-closed (DESIGN.md §2). */
    static Pool f;
    make_pool(&f);
    ck_assert_int_eq(pool_finalize(&f, 49152, NULL), 0);
    static int idx[POOL_MAX], rank_of[POOL_MAX];
    for (int i = 0; i < f.n; i++) idx[i] = i;
    g_cmp_pool = &f;
    qsort(idx, (size_t)f.n, sizeof idx[0], qcmp);
    for (int r = 0; r < f.n; r++) rank_of[idx[r]] = r;
    for (int i = 0; i < f.n; i++)
        if (f.parent[i] >= 0)
            ck_assert_msg(rank_of[f.parent[i]] < rank_of[i], "parent of %d ranks after it", i);
    for (int r = 1; r < f.n; r++)
        ck_assert(f.score[idx[r - 1]] >= f.score[idx[r]]);
}
END_TEST

/* ------------------------------------------------------------ round trips */

START_TEST(test_roundtrip_all_types) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    static Pool into;
    ProtoMsg got = {0};
    got.pool_into = &into;
    got.vocab_size = 49152;
    for (int t = PROTO_HELLO; t <= PROTO_BYE; t++) {
        ProtoMsg m;
        make_vector(t, &m);
        encode_ok(&m, &sb);
        RsErr e = {0};
        int rc = proto_decode(sb.data, sb.size, &got, &e);
        ck_assert_msg(rc == RS_OK, "decode %s: %s", proto_type_name(t), e.msg);
        ck_assert_int_eq(got.type, t);
        ck_assert_msg(proto_msg_equal(&m, &got), "%s differs after round trip",
                      proto_type_name(t));
        if (t == PROTO_POOL) {
            ck_assert_ptr_eq(got.u.pool.pool, &into); /* straight into the caller's Pool */
            ck_assert_int_eq(into.n, 710);
            ck_assert_int_eq(into.root_n_children, 10);
            ck_assert(into.score[709] < 0);
            ck_assert_uint_eq(got.u.pool.commit_pass_ns, 4567890);
        }
    }
    /* Steady state allocates nothing: a second token list reuses the store. */
    ProtoMsg m;
    make_vector(PROTO_RESET, &m);
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    const int32_t *store = got.tok_store;
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert_ptr_eq(got.tok_store, store);
    ck_assert_ptr_null(got.pool_own);
    proto_msg_clear(&got);
    /* Without pool_into the decoder owns a Pool (freed by clear). */
    make_vector(PROTO_POOL, &m);
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert_ptr_eq(got.u.pool.pool, got.pool_own);
    ck_assert(proto_msg_equal(&m, &got));
    proto_msg_clear(&got);
    proto_msg_clear(&got);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

START_TEST(test_roundtrip_distinct_fields) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    ProtoMsg m, got = {0};
    /* Every numeric field distinct, so a decoder that swapped two fields of one type
     * (the vector HELLO asks for topk 10 / depth 8 / expand 10) would be caught. */
    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO;
    m.session = 3;
    m.seq = 4;
    strcpy(m.u.hello.fingerprint, "fp");
    m.u.hello.tokenizer_hash = 5;
    m.u.hello.vocab_size = 6;
    m.u.hello.caps = 7;
    m.u.hello.topk = 8;
    m.u.hello.depth = 9;
    m.u.hello.expand = 11;
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert(got.session == 3 && got.seq == 4 && got.u.hello.tokenizer_hash == 5 &&
              got.u.hello.vocab_size == 6 && got.u.hello.caps == 7 && got.u.hello.topk == 8 &&
              got.u.hello.depth == 9 && got.u.hello.expand == 11);
    memset(&m.u, 0, sizeof m.u);
    m.type = PROTO_HELLO_OK;
    strcpy(m.u.hello_ok.fingerprint, "fp");
    m.u.hello_ok.tokenizer_hash = 5;
    m.u.hello_ok.vocab_size = 6;
    m.u.hello_ok.caps = 7;
    strcpy(m.u.hello_ok.name, "nm");
    m.u.hello_ok.n_feat_layers = 2;
    m.u.hello_ok.feat_layers[0] = 12;
    m.u.hello_ok.feat_layers[1] = 13;
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert(got.u.hello_ok.tokenizer_hash == 5 && got.u.hello_ok.vocab_size == 6 &&
              got.u.hello_ok.caps == 7 && !strcmp(got.u.hello_ok.fingerprint, "fp") &&
              got.u.hello_ok.n_feat_layers == 2 && got.u.hello_ok.feat_layers[0] == 12 &&
              got.u.hello_ok.feat_layers[1] == 13 &&
              !strcmp(got.u.hello_ok.name, "nm"));
    proto_msg_clear(&got);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

START_TEST(test_roundtrip_edge_values) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    ProtoMsg m, got = {0};
    /* Edge values: empty RESET, empty pool, max-length strings, extreme ints. */
    memset(&m, 0, sizeof m);
    m.type = PROTO_RESET;
    m.session = UINT64_MAX;
    m.seq = 0;
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert(proto_msg_equal(&m, &got));
    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO_OK;
    memset(m.u.hello_ok.fingerprint, 'f', PROTO_FP_MAX);
    memset(m.u.hello_ok.name, 'n', PROTO_NAME_MAX);
    m.u.hello_ok.tokenizer_hash = UINT64_MAX;
    m.u.hello_ok.vocab_size = INT32_MAX;
    m.u.hello_ok.caps = UINT32_MAX;
    m.u.hello_ok.n_feat_layers = PROTO_FEAT_LAYERS_MAX;
    for (int i = 0; i < PROTO_FEAT_LAYERS_MAX; i++) m.u.hello_ok.feat_layers[i] = 65535 - i;
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert(proto_msg_equal(&m, &got));
    memset(&m, 0, sizeof m);
    m.type = PROTO_ERROR;
    m.u.error.code = INT32_MIN;
    memset(m.u.error.message, 'x', PROTO_MSG_MAX);
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert(proto_msg_equal(&m, &got));
    static Pool empty;
    memset(&empty, 0, sizeof empty);
    memset(&m, 0, sizeof m);
    m.type = PROTO_POOL;
    m.u.pool.pool = &empty;
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert(proto_msg_equal(&m, &got));
    /* The longest token list allowed (1<<20) round-trips. */
    int32_t *big = malloc(sizeof(int32_t) * PROTO_MAX_TOKENS);
    for (int i = 0; i < PROTO_MAX_TOKENS; i++) big[i] = (i * 31) % 70000;
    memset(&m, 0, sizeof m);
    m.type = PROTO_COMMIT_GROW;
    m.u.tokens.ids = big;
    m.u.tokens.n = PROTO_MAX_TOKENS;
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert(proto_msg_equal(&m, &got));
    free(big);
    proto_msg_clear(&got);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

/* POOL's optional draft_host_ns / draft_rows: sent when the drafter reports rows (11
 * fields), absent otherwise (9 fields, the bytes of the vectors), and then decoded as 0
 * even into a Pool holding older values. */
START_TEST(test_pool_optional_host_fields) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    static Pool into;
    ProtoMsg m, got = {0};
    got.pool_into = &into;
    make_vector(PROTO_POOL, &m);
    encode_ok(&m, &sb);
    size_t plain = sb.size;
    g_pool.draft_host_ns = 1234567;
    g_pool.draft_rows = 71;
    encode_ok(&m, &sb);
    ck_assert_uint_eq(sb.size, plain + 5 + 1); /* uint32 1234567 and fixint 71 */
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert_uint_eq(into.draft_host_ns, 1234567);
    ck_assert_int_eq(into.draft_rows, 71);
    ck_assert(proto_msg_equal(&m, &got));
    make_vector(PROTO_POOL, &m); /* draft_rows 0 again */
    encode_ok(&m, &sb);
    ck_assert_uint_eq(sb.size, plain);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, NULL), RS_OK);
    ck_assert_uint_eq(into.draft_host_ns, 0);
    ck_assert_int_eq(into.draft_rows, 0);
    /* the optional pair with draft_rows 0 (found by fuzz-short: it decoded, then lost
     * draft_host_ns = 85 on re-encoding) is refused by name */
    static const uint8_t zero_rows[] = {0x97, 0xa4, 'R', 'S', 'P', 'C', 0x04, 0x05, 0x08, 0x02, 0x00, 0x9b,
                                        0x00, 0x90, 0x90, 0x90, 0x90, 0x00, 0x50, 0x38, 0x44, 0x55, 0x00};
    RsErr e = {0};
    ck_assert_int_eq(proto_decode(zero_rows, sizeof zero_rows, &got, &e), RS_EPROTO);
    ck_assert_msg(strstr(e.msg, "draft_rows is 0"), "%s", e.msg);
    proto_msg_clear(&got);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

/* Version 4's sequence id: in the header of every frame, echoed by replies; CLOSE ends a
 * sequence. Hand-assembled bytes, then a round trip and the id's bound. */
START_TEST(test_sequence_id) {
    ProtoMsg m = {0}, back = {0};
    m.type = PROTO_CLOSE;
    m.session = 5;
    m.seq = 9;
    m.sid = 70000;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    encode_ok(&m, &sb);
    const uint8_t want[] = {0x97, 0xa4, 'R', 'S', 'P', 'C', 0x04, 0x09, 0x05, 0x09,
                            0xce, 0x00, 0x01, 0x11, 0x70, 0x90};
    ck_assert_uint_eq(sb.size, sizeof want);
    ck_assert(memcmp(sb.data, want, sizeof want) == 0);
    RsErr e = {0};
    ck_assert_msg(proto_decode(sb.data, sb.size, &back, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(back.type, PROTO_CLOSE);
    ck_assert_uint_eq(back.sid, 70000);
    ck_assert(proto_msg_equal(&m, &back));
    /* a POOL names its sequence; a different sid is a different message */
    make_vector(PROTO_POOL, &m);
    msgpack_sbuffer_clear(&sb);
    encode_ok(&m, &sb);
    ck_assert_msg(proto_decode(sb.data, sb.size, &back, &e) == RS_OK, "%s", e.msg);
    ck_assert_uint_eq(back.sid, 7);
    ck_assert(proto_msg_equal(&m, &back));
    back.sid = 8;
    ck_assert(!proto_msg_equal(&m, &back));
    /* an ERROR reply echoes the request's sid */
    ProtoMsg rep = {0};
    RsErr cause = {.code = RS_EPROTO, .msg = "x"};
    proto_error_reply(&rep, &m, &cause);
    ck_assert_uint_eq(rep.sid, 7);
    /* the id is a uint32 */
    uint8_t big[sizeof want + 4];
    memcpy(big, want, 10);
    const uint8_t u64[] = {0xcf, 0, 0, 0, 1, 0, 0, 0, 0};
    memcpy(big + 10, u64, sizeof u64);
    big[19] = 0x90;
    ck_assert_int_eq(proto_decode(big, 20, &back, &e), RS_EPROTO);
    ck_assert_msg(strstr(e.msg, "sid is 4294967296"), "%s", e.msg);
    proto_msg_clear(&back);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

START_TEST(test_exact_bytes) {
    /* Hand-assembled from the msgpack spec: an independent check of the header layout. */
    ProtoMsg m = {0};
    m.type = PROTO_BYE;
    m.session = 5;
    m.seq = 300;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    encode_ok(&m, &sb);
    const uint8_t want[] = {0x97, 0xa4, 'R', 'S', 'P', 'C', 0x04, 0x07, 0x05, 0xcd, 0x01, 0x2c, 0x00, 0x90};
    ck_assert_uint_eq(sb.size, sizeof want);
    ck_assert(memcmp(sb.data, want, sizeof want) == 0);
    /* COMMIT_GROW [-> body [[1, 200, 70000], []]] */
    int32_t ids[] = {1, 200, 70000};
    m.type = PROTO_COMMIT_GROW;
    m.seq = 1;
    m.u.tokens.ids = ids;
    m.u.tokens.n = 3;
    encode_ok(&m, &sb);
    const uint8_t want2[] = {0x97, 0xa4, 'R',  'S',  'P',  'C',  0x04, 0x04, 0x05, 0x01, 0x00, 0x92,
                             0x93, 0x01, 0xcc, 0xc8, 0xce, 0x00, 0x01, 0x11, 0x70, 0x90};
    ck_assert_uint_eq(sb.size, sizeof want2);
    ck_assert(memcmp(sb.data, want2, sizeof want2) == 0);
    /* ... with bf16 features of width 1: [1, 1, bin8 of 3 little-endian values] */
    const uint16_t fv[] = {0x3f80, 0xc020, 0x0102};
    m.u.tokens.feat_type = PROTO_FEAT_BF16;
    m.u.tokens.feat_width = 1;
    m.u.tokens.feat = fv;
    encode_ok(&m, &sb);
    const uint8_t want3[] = {0x97, 0xa4, 'R',  'S',  'P',  'C',  0x04, 0x04, 0x05, 0x01, 0x00,
                             0x92, 0x93, 0x01, 0xcc, 0xc8, 0xce, 0x00, 0x01, 0x11, 0x70,
                             0x93, 0x01, 0x01, 0xc4, 0x06, 0x80, 0x3f, 0x20, 0xc0, 0x02, 0x01};
    ck_assert_uint_eq(sb.size, sizeof want3);
    ck_assert(memcmp(sb.data, want3, sizeof want3) == 0);
    /* ... without features, with the pool depth 3: a third body element */
    m.u.tokens.feat_type = PROTO_FEAT_NONE;
    m.u.tokens.feat_width = 0;
    m.u.tokens.feat = NULL;
    m.u.tokens.depth = 3;
    encode_ok(&m, &sb);
    const uint8_t want4[] = {0x97, 0xa4, 'R',  'S',  'P',  'C',  0x04, 0x04, 0x05, 0x01, 0x00, 0x93,
                             0x93, 0x01, 0xcc, 0xc8, 0xce, 0x00, 0x01, 0x11, 0x70, 0x90, 0x03};
    ck_assert_uint_eq(sb.size, sizeof want4);
    ck_assert(memcmp(sb.data, want4, sizeof want4) == 0);
    ProtoMsg back = {0};
    RsErr de = {0};
    ck_assert_msg(proto_decode(sb.data, sb.size, &back, &de) == RS_OK, "%s", de.msg);
    ck_assert_int_eq(back.u.tokens.depth, 3);
    ck_assert(proto_msg_equal(&m, &back));
    proto_msg_clear(&back);
    /* ... and the pool width 1 (a chain): a fourth; never without a depth */
    m.u.tokens.width = 1;
    encode_ok(&m, &sb);
    const uint8_t want5[] = {0x97, 0xa4, 'R',  'S',  'P',  'C',  0x04, 0x04, 0x05, 0x01, 0x00, 0x94,
                             0x93, 0x01, 0xcc, 0xc8, 0xce, 0x00, 0x01, 0x11, 0x70, 0x90, 0x03,
                             0x01};
    ck_assert_uint_eq(sb.size, sizeof want5);
    ck_assert(memcmp(sb.data, want5, sizeof want5) == 0);
    ck_assert_msg(proto_decode(sb.data, sb.size, &back, &de) == RS_OK, "%s", de.msg);
    ck_assert_int_eq(back.u.tokens.width, 1);
    ck_assert(proto_msg_equal(&m, &back));
    proto_msg_clear(&back);
    uint8_t wide[sizeof want5];
    memcpy(wide, want5, sizeof wide);
    wide[sizeof wide - 1] = 11; /* more than POOL_EXPAND */
    ck_assert_int_eq(proto_decode(wide, sizeof wide, &back, &de), RS_EPROTO);
    ck_assert_msg(strstr(de.msg, "width"), "%s", de.msg);
    proto_msg_clear(&back);
    m.u.tokens.depth = 0;
    ck_assert_int_eq(proto_encode(&m, &sb, &de), RS_EINVAL);
    ck_assert_msg(strstr(de.msg, "pool width 1"), "%s", de.msg);
    m.u.tokens.depth = 3;
    m.u.tokens.width = 0;
    m.type = PROTO_APPEND; /* only a COMMIT_GROW asks for a pool */
    ck_assert_int_eq(proto_encode(&m, &sb, &de), RS_EINVAL);
    ck_assert_msg(strstr(de.msg, "pool depth 3"), "%s", de.msg);
    memset(&m.u, 0, sizeof m.u);
    /* The uint32 magic form is accepted too. */
    const uint8_t alt[] = {0x97, 0xce, 0x52, 0x53, 0x50, 0x43, 0x04, 0x07, 0x05, 0x01, 0x00, 0x90};
    ProtoMsg got = {0};
    RsErr e = {0};
    ck_assert_msg(proto_decode(alt, sizeof alt, &got, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(got.type, PROTO_BYE);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

START_TEST(test_encode_errors) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_sbuffer_write(&sb, "xy", 2);
    ProtoMsg m = {0};
    RsErr e = {0};
    m.type = PROTO_COMMIT_GROW; /* needs at least the continuation token */
    ck_assert_int_eq(proto_encode(&m, &sb, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "token list of 0 entries"), "%s", e.msg);
    ck_assert_uint_eq(sb.size, 2); /* nothing half-written */
    int32_t neg[] = {3, -4};
    m.u.tokens.ids = neg;
    m.u.tokens.n = 2;
    ck_assert_int_eq(proto_encode(&m, &sb, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "token -4 at index 1"), "%s", e.msg);
    m.type = (ProtoType)42;
    ck_assert_int_eq(proto_encode(&m, &sb, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "message type 42"), "%s", e.msg);
    memset(&m, 0, sizeof m);
    m.type = PROTO_POOL;
    ck_assert_int_eq(proto_encode(&m, &sb, &e), RS_EINVAL);
    ck_assert_uint_eq(sb.size, 2);
    /* Features: over the size bound (named), a bad dtype, width without a type, a HELLO_OK
     * whose layers and capability bit disagree. */
    static int32_t many[4096];
    static uint16_t fv[8];
    memset(&m, 0, sizeof m);
    m.type = PROTO_RESET;
    m.u.tokens.ids = many;
    m.u.tokens.n = 4096;
    m.u.tokens.feat_type = PROTO_FEAT_BF16;
    m.u.tokens.feat_width = 8193; /* 4096 x 8193 x 2 bytes = 64 MiB + 8 KiB */
    m.u.tokens.feat = fv;
    ck_assert_int_eq(proto_encode(&m, &sb, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "67117056 bytes, over the 67108864-byte limit "
                                "(PROTO_MAX_FEAT_BYTES)"), "%s", e.msg);
    m.u.tokens.feat_type = (ProtoFeatType)3;
    m.u.tokens.feat_width = 1;
    ck_assert_int_eq(proto_encode(&m, &sb, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "features of type 3, width 1"), "%s", e.msg);
    m.u.tokens.feat_type = PROTO_FEAT_NONE;
    ck_assert_int_eq(proto_encode(&m, &sb, &e), RS_EINVAL);
    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO_OK;
    m.u.hello_ok.n_feat_layers = 3;
    ck_assert_int_eq(proto_encode(&m, &sb, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "3 feature layers and capabilities 0x0"), "%s", e.msg);
    ck_assert_uint_eq(sb.size, 2);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

/* The remote kind's f32 -> bf16 and the server's widening back, against hand-made bit
 * patterns: round to nearest even, NaN stays NaN, and the wire payload at the size bound
 * round-trips (the bound is inclusive). */
START_TEST(test_features) {
    static const struct {
        uint32_t f32;
        uint16_t bf16;
    } rows[] = {
        {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80}, /* tie, even stays */
        {0x3f818000u, 0x3f82}, /* tie, odd rounds up */
        {0x3f80ffffu, 0x3f81}, {0xc0200001u, 0xc020}, {0x7f800000u, 0x7f80}, /* inf */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to inf, as torch's bfloat16 does */
        {0x80000000u, 0x8000}, {0x00000001u, 0x0000},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        float f;
        uint16_t b;
        memcpy(&f, &rows[i].f32, 4);
        proto_f32_to_bf16(&f, &b, 1);
        ck_assert_msg(b == rows[i].bf16, "f32 0x%08x -> bf16 0x%04x, want 0x%04x", rows[i].f32, b,
                      rows[i].bf16);
    }
    float nan = NAN, back;
    uint16_t b;
    proto_f32_to_bf16(&nan, &b, 1);
    proto_feat_to_f32(PROTO_FEAT_BF16, &b, &back, 1);
    ck_assert(isnan(back));
    const uint16_t h[] = {0x3c00, 0xc100, 0x7bff, 0x0001, 0x3555};
    const float want[] = {1.0f, -2.5f, 65504.0f, 5.9604645e-8f, 0.333251953125f};
    float got[5];
    proto_feat_to_f32(PROTO_FEAT_F16, h, got, 5);
    for (int i = 0; i < 5; i++) ck_assert_msg(got[i] == want[i], "f16 %d: %g", i, got[i]);
    /* exactly PROTO_MAX_FEAT_BYTES round-trips */
    int n = 2048, width = (int)(PROTO_MAX_FEAT_BYTES / 2 / 2048);
    int32_t *ids = calloc((size_t)n, sizeof *ids);
    uint16_t *fv = malloc(PROTO_MAX_FEAT_BYTES);
    for (size_t i = 0; i < PROTO_MAX_FEAT_BYTES / 2; i++) fv[i] = (uint16_t)(i * 2654435761u >> 7);
    ProtoMsg m = {0}, got2 = {0};
    m.type = PROTO_COMMIT_GROW;
    m.u.tokens.ids = ids;
    m.u.tokens.n = n;
    m.u.tokens.feat_type = PROTO_FEAT_BF16;
    m.u.tokens.feat_width = width;
    m.u.tokens.feat = fv;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    encode_ok(&m, &sb);
    ck_assert(sb.size <= PROTO_FRAME_MAX);
    RsErr e = {0};
    ck_assert_msg(proto_decode(sb.data, sb.size, &got2, &e) == RS_OK, "%s", e.msg);
    ck_assert(proto_msg_equal(&m, &got2));
    ck_assert_int_eq(got2.u.tokens.feat_width, width);
    /* one value over: refused */
    m.u.tokens.n = 1;
    m.u.tokens.feat_width = PROTO_FEAT_WIDTH_MAX;
    encode_ok(&m, &sb);
    ck_assert_int_eq(proto_decode(sb.data, sb.size, &got2, &e), RS_OK);
    proto_msg_clear(&got2);
    msgpack_sbuffer_destroy(&sb);
    free(ids);
    free(fv);
}
END_TEST

/* ------------------------------------------------------------ malformed frames */

START_TEST(test_truncation_every_offset) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    static Pool into;
    for (int t = PROTO_HELLO; t <= PROTO_BYE; t++) {
        ProtoMsg m;
        make_vector(t, &m);
        encode_ok(&m, &sb);
        size_t len = sb.size;
        /* A fresh heap copy of each prefix, so ASan sees any read past its end. */
        for (size_t cut = 0; cut < len; cut++) {
            uint8_t *pre = malloc(cut ? cut : 1);
            memcpy(pre, sb.data, cut);
            ProtoMsg got = {0};
            got.pool_into = &into;
            RsErr e = {0};
            int rc = proto_decode(cut ? pre : NULL, cut, &got, &e);
            ck_assert_msg(rc == RS_EFORMAT, "%s cut at %zu/%zu: rc %d (%s)", proto_type_name(t),
                          cut, len, rc, e.msg);
            ck_assert_msg(strstr(e.msg, "truncated frame"), "%s", e.msg);
            ck_assert_int_eq(got.type, PROTO_NONE);
            proto_msg_clear(&got);
            free(pre);
        }
        /* ... and one extra byte is trailing garbage. */
        msgpack_sbuffer_write(&sb, "\xc0", 1);
        ProtoMsg got = {0};
        got.pool_into = &into;
        RsErr e = {0};
        ck_assert_int_eq(proto_decode(sb.data, sb.size, &got, &e), RS_EFORMAT);
        ck_assert_msg(strstr(e.msg, "1 trailing bytes after the message"), "%s", e.msg);
        if (t == PROTO_POOL) ck_assert_int_eq(into.n, 0); /* no half pool left behind */
        proto_msg_clear(&got);
    }
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

START_TEST(test_byte_flips) {
    /* Every byte of every vector, three mutations each: decode must either fail cleanly
     * with a message or yield a message that round-trips. */
    msgpack_sbuffer sb, sb2;
    msgpack_sbuffer_init(&sb);
    msgpack_sbuffer_init(&sb2);
    static Pool into, into2;
    const uint8_t xors[] = {0x01, 0x80, 0xff};
    int n_ok = 0, n_fail = 0;
    for (int t = PROTO_HELLO; t <= PROTO_BYE; t++) {
        ProtoMsg m;
        make_vector(t, &m);
        encode_ok(&m, &sb);
        uint8_t *buf = malloc(sb.size);
        /* The pool is big: flip a stride of its bytes plus its whole head and tail. */
        for (size_t i = 0; i < sb.size; i++) {
            if (t == PROTO_POOL && i > 64 && i + 64 < sb.size && i % 7) continue;
            for (int x = 0; x < 3; x++) {
                memcpy(buf, sb.data, sb.size);
                buf[i] ^= xors[x];
                ProtoMsg got = {0}, again = {0};
                got.pool_into = &into;
                again.pool_into = &into2;
                RsErr e = {0};
                int rc = proto_decode(buf, sb.size, &got, &e);
                if (rc != RS_OK) {
                    ck_assert_msg(rc < 0 && e.msg[0] && e.code == rc, "flip %zu: rc %d", i, rc);
                    n_fail++;
                } else {
                    encode_ok(&got, &sb2);
                    ck_assert_int_eq(proto_decode(sb2.data, sb2.size, &again, &e), RS_OK);
                    ck_assert(proto_msg_equal(&got, &again));
                    n_ok++;
                }
                proto_msg_clear(&got);
                proto_msg_clear(&again);
            }
        }
        free(buf);
    }
    ck_assert(n_ok > 0 && n_fail > 0);
    msgpack_sbuffer_destroy(&sb);
    msgpack_sbuffer_destroy(&sb2);
}
END_TEST

START_TEST(test_malformed_header) {
    Frame f;
    /* wrong magic */
    frame_init(&f);
    frame_header(&f, "RSPX", 1, PROTO_BYE);
    msgpack_pack_array(&f.pk, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "bad magic \"RSPX\", expected \"RSPC\"");
    msgpack_sbuffer_destroy(&f.sb);
    /* magic of the wrong kind / value */
    const uint8_t m1[] = {0x96, 0xc0, 1, 7, 0, 0, 0x90};
    expect_fail(m1, sizeof m1, RS_EPROTO, "magic is nil, expected str \"RSPC\"");
    const uint8_t m2[] = {0x96, 0xce, 0x52, 0x53, 0x50, 0x44, 1, 7, 0, 0, 0x90};
    expect_fail(m2, sizeof m2, RS_EPROTO, "bad magic 0x52535044");
    /* an older peer is refused naming both versions; an unknown version by number */
    static const char *const older[] = {
        NULL,
        "the peer speaks protocol version 1, this end version 4 (target features for EAGLE-3 "
        "drafters, the pool width, then sequence ids): run the same rootspec release on both "
        "ends",
        "the peer speaks protocol version 2, this end version 4 (the pool width in "
        "COMMIT_GROW, then sequence ids): run the same rootspec release on both ends",
        "the peer speaks protocol version 3, this end version 4 (a sequence id in every "
        "frame, CLOSE): run the same rootspec release on both ends"};
    for (unsigned v = 1; v <= 3; v++) {
        frame_init(&f);
        frame_header(&f, "RSPC", v, PROTO_HELLO);
        msgpack_pack_array(&f.pk, 0);
        expect_fail(f.sb.data, f.sb.size, RS_EUNSUPPORTED, older[v]);
        msgpack_sbuffer_destroy(&f.sb);
    }
    frame_init(&f);
    frame_header(&f, "RSPC", 5, PROTO_BYE);
    msgpack_pack_array(&f.pk, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EUNSUPPORTED, "protocol version 5, expected 4");
    /* ... and proto_error_reply still answers with its session and seq */
    {
        ProtoMsg req = {0}, rep = {0}, back = {0};
        RsErr e = {0};
        ck_assert_int_eq(proto_decode(f.sb.data, f.sb.size, &req, &e), RS_EUNSUPPORTED);
        ck_assert_uint_eq(req.session, 77);
        ck_assert_uint_eq(req.seq, 3);
        proto_error_reply(&rep, &req, &e);
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        encode_ok(&rep, &sb);
        ck_assert_int_eq(proto_decode(sb.data, sb.size, &back, NULL), RS_OK);
        ck_assert_int_eq(back.type, PROTO_ERROR);
        ck_assert_uint_eq(back.session, 77);
        ck_assert_uint_eq(back.seq, 3);
        ck_assert_int_eq(back.u.error.code, RS_EUNSUPPORTED);
        ck_assert_str_eq(back.u.error.message, "proto: protocol version 5, expected 4");
        msgpack_sbuffer_destroy(&sb);
    }
    msgpack_sbuffer_destroy(&f.sb);
    /* type 99 */
    frame_init(&f);
    frame_header(&f, "RSPC", PROTO_VERSION, 99);
    msgpack_pack_array(&f.pk, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "unknown message type 99");
    msgpack_sbuffer_destroy(&f.sb);
    frame_init(&f);
    frame_header(&f, "RSPC", PROTO_VERSION, 0);
    msgpack_pack_array(&f.pk, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "unknown message type 0");
    msgpack_sbuffer_destroy(&f.sb);
    /* frame shape */
    const uint8_t map[] = {0x80};
    expect_fail(map, 1, RS_EPROTO, "frame is a map, expected array");
    const uint8_t five[] = {0x95, 0xa4, 'R', 'S', 'P', 'C', 1, 7, 0, 0};
    expect_fail(five, sizeof five, RS_EPROTO, "frame is an array of 5 elements, expected 7");
    const uint8_t negseq[] = {0x96, 0xa4, 'R', 'S', 'P', 'C', 1, 7, 0, 0xff, 0x90};
    expect_fail(negseq, sizeof negseq, RS_EPROTO, "seq is -1, expected 0..");
    const uint8_t huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0};
    expect_fail(huge, sizeof huge, RS_EFORMAT, "frame has 4294967295 entries but only 1 bytes");
    const uint8_t c1[] = {0xc1};
    expect_fail(c1, 1, RS_EPROTO, "frame is the reserved byte 0xc1, expected array");
    expect_fail(NULL, 0, RS_EFORMAT, "truncated frame: frame needs 1 bytes at offset 0");
}
END_TEST

/* A frame of message `type` whose body the test packs next (mb_fail checks and frees it). */
static msgpack_packer *mb_begin(Frame *f, unsigned type) {
    frame_init(f);
    frame_header(f, "RSPC", PROTO_VERSION, type);
    return &f->pk;
}

/* The frame fails to decode with `code` and a message containing `want`. */
static void mb_fail(Frame *f, int code, const char *want) {
    expect_fail(f->sb.data, f->sb.size, code, want);
    msgpack_sbuffer_destroy(&f->sb);
}

#define BEGIN(type) pk = mb_begin(&f, type)
#define END(code, want) mb_fail(&f, code, want)

START_TEST(test_malformed_hello) {
    Frame f;
    msgpack_packer *pk;
    /* HELLO: fingerprint as int, too long, embedded NUL; wrong field count; bad shape */
    BEGIN(PROTO_HELLO);
    msgpack_pack_array(pk, 5);
    msgpack_pack_int(pk, 12);
    pad(pk, 4);
    END(RS_EPROTO, "HELLO fingerprint is an int, expected str");
    BEGIN(PROTO_HELLO);
    msgpack_pack_array(pk, 5);
    char longfp[PROTO_FP_MAX + 2];
    memset(longfp, 'a', PROTO_FP_MAX + 1);
    longfp[PROTO_FP_MAX + 1] = 0;
    pack_s(pk, longfp);
    pad(pk, 4);
    END(RS_EPROTO, "HELLO fingerprint is 65 bytes, max 64");
    BEGIN(PROTO_HELLO);
    msgpack_pack_array(pk, 5);
    msgpack_pack_str(pk, 3);
    msgpack_pack_str_body(pk, "a\0b", 3);
    pad(pk, 4);
    END(RS_EPROTO, "HELLO fingerprint contains a NUL byte");
    BEGIN(PROTO_HELLO);
    msgpack_pack_array(pk, 4);
    pad(pk, 4);
    END(RS_EPROTO, "HELLO body has 4 fields, expected 5");
    BEGIN(PROTO_HELLO);
    msgpack_pack_array(pk, 5);
    pack_s(pk, "fp");
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_uint64(pk, 1ull << 31);
    pad(pk, 2);
    END(RS_EPROTO, "HELLO vocab_size is 2147483648, expected 0..2147483647");
    BEGIN(PROTO_HELLO);
    msgpack_pack_array(pk, 5);
    pack_s(pk, "fp");
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_uint64(pk, 100);
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_map(pk, 0);
    END(RS_EPROTO, "HELLO pool shape is a map, expected array");
    BEGIN(PROTO_HELLO);
    msgpack_pack_array(pk, 5);
    pack_s(pk, "fp");
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_uint64(pk, 100);
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, 10);
    msgpack_pack_double(pk, 8.0);
    pad(pk, 1);
    END(RS_EPROTO, "HELLO depth is a float, expected int");
}
END_TEST

START_TEST(test_malformed_hello_ok) {
    Frame f;
    msgpack_packer *pk;
    /* HELLO_OK: name of the wrong type */
    BEGIN(PROTO_HELLO_OK);
    msgpack_pack_array(pk, 6);
    pack_s(pk, "fp");
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_uint64(pk, 100);
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_bin(pk, 2);
    msgpack_pack_bin_body(pk, "ab", 2);
    pad(pk, 1);
    END(RS_EPROTO, "HELLO_OK drafter_name is a bin, expected str");
    /* HELLO_OK v2: the v1 body (5 fields), feature layers without the capability bit and
     * the reverse, too many layers, a layer over 65535 */
    BEGIN(PROTO_HELLO_OK);
    msgpack_pack_array(pk, 5);
    pad(pk, 5);
    END(RS_EPROTO, "HELLO_OK body has 5 fields, expected 6");
    for (int v = 0; v < 4; v++) {
        static const char *const want[] = {
            "HELLO_OK feature_layers has 3 entries but capabilities 0x1 lack FEATURES (0x4)",
            "HELLO_OK feature_layers has 0 entries but capabilities 0x5 have FEATURES (0x4)",
            "HELLO_OK feature_layers has 9 entries, limit 8",
            "HELLO_OK feature_layers[1] is 65536, expected 0..65535"};
        BEGIN(PROTO_HELLO_OK);
        msgpack_pack_array(pk, 6);
        pack_s(pk, "fp");
        msgpack_pack_uint64(pk, 1);
        msgpack_pack_uint64(pk, 100);
        msgpack_pack_uint64(pk, v == 0 ? PROTO_CAP_POOL_V1 : PROTO_CAP_POOL_V1 | PROTO_CAP_FEATURES);
        pack_s(pk, "nm");
        int n = v == 1 ? 0 : v == 2 ? 9 : 3;
        msgpack_pack_array(pk, (size_t)n);
        for (int i = 0; i < n; i++) msgpack_pack_uint32(pk, v == 3 && i == 1 ? 65536 : (uint32_t)i);
        END(RS_EPROTO, want[v]);
    }
}
END_TEST

START_TEST(test_malformed_tokens) {
    Frame f;
    msgpack_packer *pk;
    /* RESET: body a map; tokens a str; negative token; token list over the limit */
    BEGIN(PROTO_RESET);
    msgpack_pack_map(pk, 1);
    END(RS_EPROTO, "RESET body is a map, expected array");
    BEGIN(PROTO_RESET);
    msgpack_pack_array(pk, 1);
    msgpack_pack_array(pk, 0);
    END(RS_EPROTO, "RESET body has 1 fields, expected 2"); /* a v1 body */
    BEGIN(PROTO_RESET);
    msgpack_pack_array(pk, 2);
    pack_s(pk, "1 2 3");
    END(RS_EPROTO, "RESET tokens is a str, expected array");
    BEGIN(PROTO_RESET);
    msgpack_pack_array(pk, 2);
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, 1);
    msgpack_pack_int(pk, 2);
    msgpack_pack_int(pk, -5);
    END(RS_EPROTO, "RESET tokens[2] is -5, expected 0..2147483647");
    BEGIN(PROTO_RESET);
    msgpack_pack_array(pk, 2);
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, 1ull << 31);
    END(RS_EPROTO, "RESET tokens[0] is 2147483648, expected 0..2147483647");
    BEGIN(PROTO_RESET);
    msgpack_pack_array(pk, 2);
    msgpack_pack_array(pk, PROTO_MAX_TOKENS + 1); /* header alone: limit checked first */
    END(RS_EPROTO, "RESET tokens has 1048577 entries, limit 1048576");
    BEGIN(PROTO_COMMIT_GROW);
    msgpack_pack_array(pk, 2);
    msgpack_pack_array(pk, 0);
    msgpack_pack_array(pk, 0);
    END(RS_EPROTO, "COMMIT_GROW tokens has 0 entries, expected at least 1");
    BEGIN(PROTO_COMMIT_GROW); /* a pool depth past the pool's 8 levels */
    msgpack_pack_array(pk, 3);
    msgpack_pack_array(pk, 1);
    msgpack_pack_int(pk, 1);
    msgpack_pack_array(pk, 0);
    msgpack_pack_int(pk, 9);
    END(RS_EPROTO, "COMMIT_GROW depth is 9, expected 1..8");
    BEGIN(PROTO_APPEND); /* a depth where no pool is grown */
    msgpack_pack_array(pk, 3);
    msgpack_pack_array(pk, 1);
    msgpack_pack_int(pk, 1);
    msgpack_pack_array(pk, 0);
    msgpack_pack_int(pk, 2);
    END(RS_EPROTO, "APPEND body has 3 fields, expected 2");
    BEGIN(PROTO_COMMIT_GROW);
    msgpack_pack_array(pk, 2);
    msgpack_pack_array(pk, 1000); /* claims more entries than bytes left */
    msgpack_pack_int(pk, 1);
    END(RS_EFORMAT, "COMMIT_GROW truncated frame: tokens has 1000 entries but only 1 bytes remain");
    /* vocab_size bound applies when the caller set it */
    {
        BEGIN(PROTO_COMMIT_GROW);
        msgpack_pack_array(pk, 2);
        msgpack_pack_array(pk, 1);
        msgpack_pack_int(pk, 49152);
        msgpack_pack_array(pk, 0);
        ProtoMsg m = {0};
        RsErr e = {0};
        m.vocab_size = 49152;
        ck_assert_int_eq(proto_decode(f.sb.data, f.sb.size, &m, &e), RS_EPROTO);
        ck_assert_str_eq(e.msg, "proto: COMMIT_GROW tokens[0] is 49152, expected 0..49151");
        m.vocab_size = 0;
        ck_assert_int_eq(proto_decode(f.sb.data, f.sb.size, &m, &e), RS_OK);
        proto_msg_clear(&m);
        msgpack_sbuffer_destroy(&f.sb);
    }
}
END_TEST

START_TEST(test_malformed_features) {
    Frame f;
    msgpack_packer *pk;
    /* Features: every field checked, the size bound before the payload is read. */
    {
        static const struct {
            int n_fields, dtype, width;
            uint32_t bin_len; /* header value; the body holds min(bin_len, 64) bytes */
            const char *want;
            int code;
        } rows[] = {
            {2, 1, 1, 4, "COMMIT_GROW features has 2 fields, expected 0 or 3", RS_EPROTO},
            {4, 1, 1, 4, "COMMIT_GROW features has 4 entries, limit 3", RS_EPROTO},
            {3, 0, 1, 4, "COMMIT_GROW features dtype is 0, expected 1..2", RS_EPROTO},
            {3, 3, 1, 4, "COMMIT_GROW features dtype is 3, expected 1..2", RS_EPROTO},
            {3, 1, 0, 4, "COMMIT_GROW features width is 0, expected 1..131072", RS_EPROTO},
            {3, 1, PROTO_FEAT_WIDTH_MAX + 1, 4, "features width is 131073, expected 1..131072",
             RS_EPROTO},
            {3, 1, 1, 6, "COMMIT_GROW features data is 6 bytes, expected 4 (2 tokens x width 1 x 2)",
             RS_EPROTO},
            {3, 2, 3, 4, "features data is 4 bytes, expected 12 (2 tokens x width 3 x 2)",
             RS_EPROTO},
            {3, 1, 1, PROTO_MAX_FEAT_BYTES + 2,
             "COMMIT_GROW features data is 67108866 bytes, over the 67108864-byte limit "
             "(PROTO_MAX_FEAT_BYTES)", RS_EPROTO},
            {3, 1, 1, 100, "COMMIT_GROW truncated frame: features data needs", RS_EFORMAT},
        };
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
            BEGIN(PROTO_COMMIT_GROW);
            msgpack_pack_array(pk, 2);
            msgpack_pack_array(pk, 2);
            msgpack_pack_int(pk, 5);
            msgpack_pack_int(pk, 6);
            msgpack_pack_array(pk, (size_t)rows[k].n_fields);
            if (rows[k].n_fields >= 2) {
                msgpack_pack_uint32(pk, (uint32_t)rows[k].dtype);
                msgpack_pack_uint32(pk, (uint32_t)rows[k].width);
            }
            if (rows[k].n_fields >= 3) {
                uint8_t zero[64] = {0};
                msgpack_pack_bin(pk, rows[k].bin_len);
                msgpack_pack_bin_body(pk, zero, rows[k].bin_len < 64 ? rows[k].bin_len : 64);
            }
            if (rows[k].n_fields == 4) msgpack_pack_nil(pk);
            END(rows[k].code, rows[k].want);
        }
        BEGIN(PROTO_RESET);
        msgpack_pack_array(pk, 2);
        msgpack_pack_array(pk, 0);
        msgpack_pack_array(pk, 3);
        msgpack_pack_uint32(pk, 1);
        msgpack_pack_uint32(pk, 8);
        pack_s(pk, "");
        END(RS_EPROTO, "RESET features data is a str, expected bin");
    }
}
END_TEST

START_TEST(test_malformed_error_bye) {
    Frame f;
    msgpack_packer *pk;
    /* ERROR: code out of int32, message as int */
    BEGIN(PROTO_ERROR);
    msgpack_pack_array(pk, 2);
    msgpack_pack_int64(pk, -(1ll << 40));
    END(RS_EPROTO, "ERROR code is -1099511627776, expected -2147483648..2147483647");
    BEGIN(PROTO_ERROR);
    msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, -5);
    msgpack_pack_int(pk, 7);
    END(RS_EPROTO, "ERROR message is an int, expected str");
    /* BYE with a body */
    BEGIN(PROTO_BYE);
    msgpack_pack_array(pk, 1);
    msgpack_pack_nil(pk);
    END(RS_EPROTO, "BYE body has 1 fields, expected 0");
}
END_TEST
#undef BEGIN
#undef END

/* Packs a POOL body from p with optional corruption: which = 0 none, 1 n = 711,
 * 2 parents one short, 3 logq[4] as str, 4 depth 9, 5 tokens array of 711 (header). */
static void pack_pool(Frame *f, const Pool *p, int which) {
    msgpack_packer *pk = &f->pk;
    frame_init(f);
    frame_header(f, "RSPC", PROTO_VERSION, PROTO_POOL);
    msgpack_pack_array(pk, 9);
    msgpack_pack_uint32(pk, which == 1 ? 711 : (uint32_t)p->n);
    if (which == 5) {
        msgpack_pack_array(pk, 711);
        pad(pk, 8);
        return;
    }
    msgpack_pack_array(pk, (size_t)p->n);
    for (int i = 0; i < p->n; i++) msgpack_pack_int32(pk, p->token[i]);
    msgpack_pack_array(pk, (size_t)p->n - (which == 2));
    for (int i = 0; i < p->n - (which == 2); i++) msgpack_pack_int32(pk, p->parent[i]);
    msgpack_pack_array(pk, (size_t)p->n);
    for (int i = 0; i < p->n; i++) {
        if (which == 3 && i == 4)
            pack_s(pk, "-1.5");
        else
            msgpack_pack_float(pk, p->logq[i]);
    }
    msgpack_pack_array(pk, (size_t)p->n);
    for (int i = 0; i < p->n; i++) msgpack_pack_uint8(pk, which == 4 && i == 9 ? 9 : p->depth[i]);
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_uint64(pk, 2);
    msgpack_pack_uint32(pk, 8);
    msgpack_pack_uint32(pk, 70);
}

START_TEST(test_malformed_pool) {
    static Pool p;
    Frame f;
    make_pool(&p);
    pack_pool(&f, &p, 0); /* sanity: the hand-packed pool is valid */
    {
        ProtoMsg m = {0};
        RsErr e = {0};
        ck_assert_msg(proto_decode(f.sb.data, f.sb.size, &m, &e) == RS_OK, "%s", e.msg);
        proto_msg_clear(&m);
    }
    msgpack_sbuffer_destroy(&f.sb);
    pack_pool(&f, &p, 1);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "POOL n is 711, expected 0..710");
    msgpack_sbuffer_destroy(&f.sb);
    pack_pool(&f, &p, 2);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "POOL parents has 709 entries, n is 710");
    msgpack_sbuffer_destroy(&f.sb);
    pack_pool(&f, &p, 3);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "POOL logq[4] is a str, expected float");
    msgpack_sbuffer_destroy(&f.sb);
    pack_pool(&f, &p, 4);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "POOL depths[9] is 9, expected 1..8");
    msgpack_sbuffer_destroy(&f.sb);
    pack_pool(&f, &p, 5);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "POOL tokens has 711 entries, limit 710");
    msgpack_sbuffer_destroy(&f.sb);
    /* Structurally bad pools are caught by pool_finalize inside the decoder. */
    make_pool(&p);
    p.parent[5] = 7;
    pack_pool(&f, &p, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO,
                "POOL bad pool: candidate 5 has parent 7, which does not precede it");
    msgpack_sbuffer_destroy(&f.sb);
    make_pool(&p);
    p.logq[100] = 0.5f;
    pack_pool(&f, &p, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "candidate 100 has log q 0.5");
    msgpack_sbuffer_destroy(&f.sb);
    make_pool(&p);
    p.parent[300] = p.parent[280];
    pack_pool(&f, &p, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "are not contiguous");
    msgpack_sbuffer_destroy(&f.sb);
    /* 71 expanded nodes: the decoder refuses the pool before the target sizes a pass on it. */
    make_wide_pool(&p, POOL_N_EXPANDED + 1);
    pack_pool(&f, &p, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "POOL bad pool: candidate 170 makes 71 expanded");
    msgpack_sbuffer_destroy(&f.sb);
}
END_TEST

/* ------------------------------------------------------------ ZeroMQ */

#if defined(__linux__) && defined(SYS_sched_getattr)
/* A thread's slice (sched_getattr's runtime of a fair task), -1 when unknown. */
static long long thread_slice(int tid) {
    struct sched_attr a = {0};
    if (syscall(SYS_sched_getattr, tid, &a, sizeof a, 0) != 0) return -1;
    return (long long)a.sched_runtime;
}

/* 1 when the kernel grants this thread a slice of its own (Linux 6.12+), left as it was. */
static int slices_granted(void) {
    struct sched_attr a = {0}, b;
    if (syscall(SYS_sched_getattr, 0, &a, sizeof a, 0) != 0) return 0;
    b = a;
    b.size = sizeof b;
    b.sched_runtime = 300000;
    int ok = syscall(SYS_sched_setattr, 0, &b, 0) == 0 && thread_slice(0) == 300000;
    a.size = sizeof a;
    (void)syscall(SYS_sched_setattr, 0, &a, 0);
    return ok;
}

/* The ZeroMQ I/O threads of this process (by name), and how many have the 100 us slice. */
static void io_threads(int *io, int *short_slice) {
    *io = *short_slice = 0;
    DIR *d = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(d);
    for (struct dirent *t; (t = readdir(d));) {
        char path[300], comm[32] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", t->d_name);
        FILE *f = t->d_name[0] != '.' ? fopen(path, "r") : NULL;
        if (!f) continue;
        if (fgets(comm, sizeof comm, f) && strstr(comm, "ZMQbg/IO")) {
            (*io)++;
            *short_slice += thread_slice(atoi(t->d_name)) == 100000;
        }
        fclose(f);
    }
    closedir(d);
}

/* proto_ctx_new's I/O threads run with the shortest slice (100 us), and the caller keeps
 * its own. Skipped where the kernel grants no slice of one's own. */
START_TEST(test_ctx_io_slice) {
    if (!slices_granted()) {
        fprintf(stderr, "SKIP test_ctx_io_slice: the kernel grants no slice of one's own\n");
        return;
    }
    long long mine = thread_slice(0);
    void *ctx = proto_ctx_new();
    ck_assert_ptr_nonnull(ctx);
    ck_assert_int_eq(thread_slice(0), mine);
    int io = 0, short_slice = 0;
    /* the threads name themselves once running */
    for (int tries = 0; tries < 200 && !io; tries++, usleep(5000)) io_threads(&io, &short_slice);
    zmq_ctx_term(ctx);
    ck_assert_msg(io > 0, "no ZeroMQ I/O thread running after proto_ctx_new");
    ck_assert_msg(short_slice == io, "%d of %d I/O threads have the short slice", short_slice, io);
}
END_TEST
#endif

START_TEST(test_zmq_pair) {
    void *ctx = zmq_ctx_new();
    void *a = zmq_socket(ctx, ZMQ_PAIR), *b = zmq_socket(ctx, ZMQ_PAIR);
    ck_assert_int_eq(zmq_bind(a, "inproc://proto-test"), 0);
    ck_assert_int_eq(zmq_connect(b, "inproc://proto-test"), 0);
    static Pool into;
    ProtoMsg got = {0};
    got.pool_into = &into;
    RsErr e = {0};
    /* Timeout path: nothing sent. */
    uint64_t t0 = rs_now_ns();
    ck_assert_int_eq(proto_recv(a, &got, 50, &e), RS_ETIMEOUT);
    double ms = (rs_now_ns() - t0) / 1e6;
    ck_assert_msg(ms >= 45 && ms < 2000, "timeout took %.1f ms", ms);
    ck_assert_str_eq(e.msg, "proto: no message within 50 ms");
    ck_assert_int_eq(proto_recv(a, &got, 0, &e), RS_ETIMEOUT);
    /* Every vector both ways. */
    for (int t = PROTO_HELLO; t <= PROTO_BYE; t++) {
        ProtoMsg m;
        make_vector(t, &m);
        ck_assert_msg(proto_send(b, &m, &e) == RS_OK, "%s", e.msg);
        ck_assert_msg(proto_recv(a, &got, 2000, &e) == RS_OK, "%s", e.msg);
        ck_assert(proto_msg_equal(&m, &got));
        ck_assert_msg(proto_send(a, &m, &e) == RS_OK, "%s", e.msg);
        ck_assert_msg(proto_recv(b, &got, 2000, &e) == RS_OK, "%s", e.msg);
        ck_assert(proto_msg_equal(&m, &got));
    }
    /* Multi-part is rejected and drained; the next message still arrives. */
    zmq_send(b, "a", 1, ZMQ_SNDMORE);
    zmq_send(b, "b", 1, ZMQ_SNDMORE);
    zmq_send(b, "c", 1, 0);
    ck_assert_int_eq(proto_recv(a, &got, 2000, &e), RS_EPROTO);
    ck_assert_str_eq(e.msg, "proto: multi-part message (3 frames), expected one frame");
    /* A garbage frame is answered with ERROR, which the sender decodes. */
    const uint8_t bad[] = {0x97, 0xa4, 'R', 'S', 'P', 'C', 4, 99, 0x2a, 0x07, 0x00, 0x90};
    zmq_send(b, bad, sizeof bad, 0);
    ck_assert_int_eq(proto_recv(a, &got, 2000, &e), RS_EPROTO);
    ProtoMsg rep = {0};
    proto_error_reply(&rep, &got, &e);
    ck_assert_int_eq(proto_send(a, &rep, &e), RS_OK);
    ck_assert_int_eq(proto_recv(b, &got, 2000, &e), RS_OK);
    ck_assert_int_eq(got.type, PROTO_ERROR);
    ck_assert_uint_eq(got.session, 42);
    ck_assert_uint_eq(got.seq, 7);
    ck_assert_int_eq(got.u.error.code, RS_EPROTO);
    ck_assert_str_eq(got.u.error.message, "proto: unknown message type 99");
    ProtoMsg m;
    make_vector(PROTO_BYE, &m);
    ck_assert_int_eq(proto_send(b, &m, &e), RS_OK);
    ck_assert_int_eq(proto_recv(a, &got, 2000, &e), RS_OK);
    ck_assert_int_eq(got.type, PROTO_BYE);
    proto_msg_clear(&got);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
}
END_TEST

/* ------------------------------------------------------------ test vectors */

/* File: "RSPV", u32 LE version 1, u32 LE count, then per vector: u8 name length, name,
 * u32 LE frame length, frame bytes. */
static void put_u32(FILE *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    fwrite(b, 1, 4, f);
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

START_TEST(test_vectors) {
    const char *path = tu_fixture("proto/vectors.bin");
    msgpack_sbuffer enc[PROTO_BYE + 1];
    for (int t = PROTO_HELLO; t <= PROTO_BYE; t++) {
        ProtoMsg m;
        make_vector(t, &m);
        msgpack_sbuffer_init(&enc[t]);
        encode_ok(&m, &enc[t]);
    }
    const char *w = getenv("PROTO_WRITE_VECTORS");
    if (w && strcmp(w, "1") == 0) {
        FILE *f = fopen(path, "wb");
        ck_assert_msg(f, "cannot write %s", path);
        fwrite("RSPV", 1, 4, f);
        put_u32(f, 1);
        put_u32(f, PROTO_BYE);
        for (int t = PROTO_HELLO; t <= PROTO_BYE; t++) {
            uint8_t nl = (uint8_t)strlen(vector_name(t));
            fwrite(&nl, 1, 1, f);
            fwrite(vector_name(t), 1, nl, f);
            put_u32(f, (uint32_t)enc[t].size);
            fwrite(enc[t].data, 1, enc[t].size, f);
        }
        fclose(f);
    }
    char *buf;
    size_t len;
    RsErr e = {0};
    ck_assert_msg(rs_read_file(path, &buf, &len, &e) == RS_OK,
                  "%s (regenerate with PROTO_WRITE_VECTORS=1)", e.msg);
    const uint8_t *p = (const uint8_t *)buf, *end = p + len;
    ck_assert_msg(len >= 12 && memcmp(p, "RSPV", 4) == 0, "bad vector file magic");
    ck_assert_uint_eq(get_u32(p + 4), 1);
    ck_assert_uint_eq(get_u32(p + 8), PROTO_BYE);
    p += 12;
    for (int t = PROTO_HELLO; t <= PROTO_BYE; t++) {
        ck_assert(p < end);
        size_t nl = *p++;
        ck_assert(end - p >= (long)nl + 4);
        ck_assert_msg(nl == strlen(vector_name(t)) && memcmp(p, vector_name(t), nl) == 0,
                      "vector %d name", t);
        p += nl;
        size_t fl = get_u32(p);
        p += 4;
        ck_assert((size_t)(end - p) >= fl);
        ck_assert_msg(fl == enc[t].size && memcmp(p, enc[t].data, fl) == 0,
                      "vector %s: C encoding differs from %s", vector_name(t), path);
        p += fl;
        msgpack_sbuffer_destroy(&enc[t]);
    }
    ck_assert(p == end);
    free(buf);
}
END_TEST

/* ------------------------------------------------------------ proto/secure.c */

/* libzmq takes a tcp port modulo 65536 (tcp://host:99999 binds 34463) and an empty ipc path
 * fails later with a vaguer error: both are refused when the endpoint is checked. */
START_TEST(test_secure_check_endpoint) {
    static const struct {
        const char *ep, *msg; /* msg NULL: accepted */
    } rows[] = {
        {"tcp://127.0.0.1:5555", NULL},
        {"tcp://127.0.0.1:1", NULL},
        {"tcp://127.0.0.1:65535", NULL},
        {"tcp://*:*", NULL}, /* any free port */
        {"tcp://127.0.0.1:*", NULL},
        {"ipc:///tmp/rootspec-x.sock", NULL},
        {"inproc://x", "inproc:// reaches only the same process"},
        {"tcp://127.0.0.1:0", "port '0' is not a number in 1..65535"},
        {"tcp://127.0.0.1:65536", "port '65536' is not a number in 1..65535"},
        {"tcp://127.0.0.1:99999", "port '99999'"},
        {"tcp://127.0.0.1:-5", "port '-5'"},
        {"tcp://127.0.0.1:+5", "port '+5'"},
        {"tcp://127.0.0.1:http", "port 'http'"},
        {"tcp://127.0.0.1:55x", "port '55x'"},
        {"tcp://127.0.0.1:", "port ''"},
        {"tcp://127.0.0.1:99999999999999999999", "is not a number in 1..65535"},
        {"tcp://127.0.0.1", "has no port"},
        {"ipc://", "has no socket path"},
        {"udp://127.0.0.1:5", "unknown transport"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        RsErr e = {0};
        int rc = secure_check_endpoint(rows[i].ep, 1, NULL, &e);
        if (!rows[i].msg) {
            ck_assert_msg(rc == RS_OK, "'%s' refused: %s", rows[i].ep, e.msg);
            continue;
        }
        ck_assert_msg(rc == RS_EINVAL, "'%s' gave %d, want RS_EINVAL", rows[i].ep, rc);
        ck_assert_msg(strstr(e.msg, rows[i].msg), "'%s': message '%s' lacks '%s'", rows[i].ep,
                      e.msg, rows[i].msg);
    }
    /* the port is checked before the CURVE policy, which still applies to good ports */
    RsErr e = {0};
    ck_assert_int_eq(secure_check_endpoint("tcp://127.0.0.1:99999", 0, NULL, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "port '99999'"), "%s", e.msg);
    ck_assert_int_eq(secure_check_endpoint("tcp://127.0.0.1:5555", 0, NULL, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "plain tcp://"), "%s", e.msg);
    ck_assert_int_eq(secure_check_endpoint("tcp://127.0.0.1:5555", 0, "/some/keys", &e), RS_OK);
}
END_TEST

static char *read_text(const char *path) {
    char *t;
    RsErr e = {0};
    ck_assert_msg(rs_read_file(path, &t, NULL, &e) == RS_OK, "%s", e.msg);
    return t;
}

/* --gen-keys into a directory that holds keys already is refused: replacing a deployed
 * pair would lock out every host holding the old keys. The old files stay as they were. */
START_TEST(test_secure_gen_keys_keeps_existing) {
    char dir[] = "/tmp/rs_keys_XXXXXX", path[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    RsErr e = {0};
    ck_assert_msg(secure_gen_keys(dir, &e) == RS_OK, "%s", e.msg);
    const char *names[] = {"server.key", "server.pub", "client.key", "client.pub"};
    char *before[4];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        before[i] = read_text(path);
        ck_assert_int_ge(strlen(before[i]), 40); /* one Z85 key */
    }
    ck_assert_int_eq(secure_gen_keys(dir, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "exists already") && strstr(e.msg, dir), "%s", e.msg);
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        char *after = read_text(path);
        ck_assert_msg(!strcmp(after, before[i]), "%s was rewritten", names[i]);
        free(after);
    }
    /* one key left behind is enough to refuse */
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        ck_assert_int_eq(unlink(path), 0);
    }
    ck_assert_int_eq(secure_gen_keys(dir, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "client.pub"), "%s", e.msg);
    snprintf(path, sizeof path, "%s/client.pub", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_msg(secure_gen_keys(dir, &e) == RS_OK, "%s", e.msg); /* empty again: fine */
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        ck_assert_int_eq(unlink(path), 0);
        free(before[i]);
    }
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* APPEND (a context in parts): round trip with features, at least one token, its name; and
 * the chunk size a sender splits at (2730 rows of a Llama-3.1-8B head's 3 x 4096 values). */
START_TEST(test_append_roundtrip) {
    static const int32_t ids[3] = {5, 0, 49151};
    static const uint16_t feat[6] = {0x3f80, 0xc020, 0x0000, 0x8000, 0x7f7f, 0x0001};
    ProtoMsg m = {0}, got = {0};
    m.type = PROTO_APPEND;
    m.session = 0x1234;
    m.seq = 8;
    m.u.tokens.ids = ids;
    m.u.tokens.n = 3;
    m.u.tokens.feat_type = PROTO_FEAT_BF16;
    m.u.tokens.feat_width = 2;
    m.u.tokens.feat = feat;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    encode_ok(&m, &sb);
    RsErr e = {0};
    ck_assert_msg(proto_decode(sb.data, sb.size, &got, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(got.type, PROTO_APPEND);
    ck_assert(proto_msg_equal(&m, &got));
    ck_assert_str_eq(proto_type_name(PROTO_APPEND), "APPEND");
    ck_assert_str_eq(proto_type_name(PROTO_CLOSE), "CLOSE");
    ck_assert_str_eq(proto_type_name(PROTO_CLOSE + 1), "UNKNOWN");
    m.u.tokens.n = 0;
    m.u.tokens.feat_type = PROTO_FEAT_NONE, m.u.tokens.feat_width = 0, m.u.tokens.feat = NULL;
    msgpack_sbuffer_clear(&sb);
    ck_assert_int_eq(proto_encode(&m, &sb, &e), RS_EINVAL);
    Frame f;
    frame_init(&f);
    frame_header(&f, "RSPC", PROTO_VERSION, PROTO_APPEND);
    msgpack_pack_array(&f.pk, 2);
    msgpack_pack_array(&f.pk, 0);
    msgpack_pack_array(&f.pk, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "APPEND tokens has 0 entries, expected at least 1");
    msgpack_sbuffer_destroy(&f.sb);
    frame_init(&f);
    frame_header(&f, "RSPC", PROTO_VERSION, PROTO_CLOSE + 1);
    msgpack_pack_array(&f.pk, 0);
    expect_fail(f.sb.data, f.sb.size, RS_EPROTO, "unknown message type 10");
    msgpack_sbuffer_destroy(&f.sb);
    ck_assert_int_eq(proto_feat_chunk_rows(3 * 4096, PROTO_MAX_FEAT_BYTES), 2730);
    ck_assert_int_eq(proto_feat_chunk_rows(1, PROTO_MAX_FEAT_BYTES), PROTO_MAX_TOKENS);
    ck_assert_int_eq(proto_feat_chunk_rows(96, 384), 2);
    ck_assert_int_eq(proto_feat_chunk_rows(PROTO_FEAT_WIDTH_MAX, 64), 1);
    msgpack_sbuffer_destroy(&sb);
    proto_msg_clear(&got);
}
END_TEST

Suite *suite_proto(void) {
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_pool_finalize_valid);
    tcase_add_test(tc, test_pool_finalize_rejects);
    tcase_add_test(tc, test_pool_rank_cmp);
    tcase_add_test(tc, test_roundtrip_all_types);
    tcase_add_test(tc, test_roundtrip_distinct_fields);
    tcase_add_test(tc, test_roundtrip_edge_values);
    tcase_add_test(tc, test_pool_optional_host_fields);
    tcase_add_test(tc, test_exact_bytes);
    tcase_add_test(tc, test_sequence_id);
    tcase_add_test(tc, test_encode_errors);
    tcase_add_test(tc, test_features);
    tcase_add_test(tc, test_truncation_every_offset);
    tcase_add_test(tc, test_byte_flips);
    tcase_add_test(tc, test_malformed_header);
    tcase_add_test(tc, test_malformed_hello);
    tcase_add_test(tc, test_malformed_hello_ok);
    tcase_add_test(tc, test_malformed_tokens);
    tcase_add_test(tc, test_malformed_features);
    tcase_add_test(tc, test_malformed_error_bye);
    tcase_add_test(tc, test_malformed_pool);
    tcase_add_test(tc, test_zmq_pair);
#if defined(__linux__) && defined(SYS_sched_getattr)
    tcase_add_test(tc, test_ctx_io_slice);
#endif
    tcase_add_test(tc, test_vectors);
    tcase_add_test(tc, test_append_roundtrip);
    tcase_add_test(tc, test_secure_check_endpoint);
    tcase_add_test(tc, test_secure_gen_keys_keeps_existing);
    suite_add_tcase(s, tc);
    return s;
}
