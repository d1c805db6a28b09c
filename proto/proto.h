/* The target <-> drafter wire protocol, version 4: codec (msgpack) and ZeroMQ helpers.
 * Version 4 adds a sequence id to every frame and CLOSE, so one session drafts for several
 * sequences (a batch); version 3 added the pool width to COMMIT_GROW; version 2 the
 * target's per-token features for EAGLE-3 heads. An older peer is refused at HELLO,
 * naming both versions.
 *
 * Every message is ONE ZeroMQ frame holding ONE msgpack array of 7 elements:
 *
 *   [ magic, version, type, session, seq, sid, body ]
 *     magic    str "RSPC" (decoder also accepts uint 0x52535043)
 *     version  uint, 4 (an older one is refused with a message naming both versions)
 *     type     uint, ProtoType below
 *     session  uint64, chosen by the target in HELLO and echoed in every later message
 *     seq      uint64, the target numbers its requests; a reply echoes its request's seq
 *     sid      uint32, the sequence a RESET, APPEND, COMMIT_GROW, POOL or CLOSE is about
 *              (the drafter keeps one context per sid); a reply echoes its request's sid;
 *              0 in HELLO, HELLO_OK and BYE
 *     body     array, per type (positional fields; ints use any msgpack int width, the
 *              encoder always writes the shortest form, as msgpack-c and Python do):
 *
 *   HELLO       1  target -> drafter
 *                  [fingerprint str(<=64), tokenizer_hash uint64, vocab_size uint32,
 *                   capabilities uint32, [topk uint, depth uint, expand uint]]
 *   HELLO_OK    2  drafter -> target, reply to HELLO
 *                  [fingerprint str(<=64), tokenizer_hash uint64, vocab_size uint32,
 *                   capabilities uint32, drafter_name str(<=63),
 *                   feature_layers [uint <= 65535]*(0..PROTO_FEAT_LAYERS_MAX)]
 *                  feature_layers: the target layers whose entering residual stream the
 *                  drafter wants with each commit (ascending); non-empty exactly when
 *                  capabilities has PROTO_CAP_FEATURES.
 *   RESET       3  target -> drafter: new prompt; the drafter drops its KV and prefills
 *                  the tokens (the next COMMIT_GROW continues from them).
 *                  [tokens [int32 >= 0, ...] (<= 1<<20), features]   no reply unless it fails
 *   COMMIT_GROW 4  target -> drafter: newly committed tokens, ending with the
 *                  continuation token; the drafter appends them and grows a pool.
 *                  [tokens [int32 >= 0, ...] (1 .. 1<<20), features
 *                   (, depth uint 1..8 (, width uint 1..10))]
 *                  reply: POOL or ERROR. depth, when present, is the deepest pool level
 *                  to grow (a cost-aware target asks for less than 8); absent: 8. width,
 *                  when present, is how many nodes each level expands; absent: 10.
 *                  features: [] (none), or [dtype uint (PROTO_FEAT_BF16 / _F16), width uint
 *                  (1..PROTO_FEAT_WIDTH_MAX), data bin] with data n * width 16-bit values,
 *                  little-endian, row i for tokens[i], at most PROTO_MAX_FEAT_BYTES bytes.
 *   POOL        5  drafter -> target
 *                  [n uint (<= POOL_MAX), tokens [int32]*n, parents [int32 >= -1]*n,
 *                   logq [float32]*n, depths [uint 1..8]*n, draft_ns uint64,
 *                   commit_pass_ns uint64, n_passes uint, n_expanded uint
 *                   (, draft_host_ns uint64, draft_rows uint: both only when draft_rows > 0)]
 *                  The decoder runs pool_finalize on it: parents precede children, depths
 *                  consistent, log q finite and <= 0, sibling runs contiguous and distinct,
 *                  at most POOL_N_EXPANDED (70) nodes with children.
 *   ERROR       6  either way: [code int32 (an RsStatus), message str(<=511)]
 *                  After a failed RESET / COMMIT_GROW (or a rejected frame) of the session
 *                  the drafter refuses COMMIT_GROW until RESET or HELLO (context lost).
 *   BYE         7  either way: []   (the target's BYE is answered with BYE, then both close)
 *   APPEND      8  target -> drafter: more committed tokens without growing, for a prompt
 *                  (or a commit) whose features exceed one message: RESET carries the
 *                  first chunk, APPENDs the next ones in order, then COMMIT_GROW the last
 *                  (or the next round). [tokens [int32 >= 0, ...] (1 .. 1<<20), features]
 *                  no reply unless it fails (then the context is lost, as for RESET).
 *   CLOSE       9  target -> drafter: the sequence sid ended; the drafter frees its context.
 *                  []   no reply unless it fails (a sid it does not hold is not a failure)
 *
 * Sockets: one frame per message, so use ZMQ_PAIR (recommended: the drafter binds, the
 * target connects) or DEALER<->DEALER; a ROUTER must strip its envelope itself and call
 * proto_decode on the payload frame. proto_recv rejects multi-part messages.
 *
 * Decoding never trusts the frame: every read is bounds-checked, lengths are checked
 * against limits before any use, trailing bytes are an error, and every failure returns
 * RS_EFORMAT (not valid msgpack / truncated), RS_EUNSUPPORTED (protocol version) or
 * RS_EPROTO (valid msgpack, invalid message) with a message naming the offending value.
 * POOL decodes straight into a caller-provided Pool and token lists into a buffer the
 * ProtoMsg keeps between decodes, so the steady state allocates nothing. */
#ifndef ROOTSPEC_PROTO_H
#define ROOTSPEC_PROTO_H
#include "common/pool.h"
#include "common/util.h"
#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#define PROTO_MAGIC "RSPC"
#define PROTO_MAGIC_U32 0x52535043u
#define PROTO_VERSION 4
#define PROTO_MAX_TOKENS (1 << 20) /* longest RESET / COMMIT_GROW token list */
#define PROTO_FP_MAX 64            /* fingerprint bytes (Model.fingerprint is char[65]) */
#define PROTO_NAME_MAX 63          /* drafter name bytes */
#define PROTO_MSG_MAX 511          /* ERROR message bytes */
/* Start of the ERROR text a drafter sends to a target whose session another client's HELLO
 * replaced (PROTOCOL.md, "Trust"): the target reports it, a timing run knows it was
 * disturbed. */
#define PROTO_TAKEN_OVER "session taken over by another client"
#define PROTO_FEAT_LAYERS_MAX 8     /* HELLO_OK feature_layers entries */
#define PROTO_FEAT_WIDTH_MAX (1 << 17) /* feature row width (3 x 43690 hidden) */
/* Feature payload bound of one message: 64 MiB is 2730 tokens for a Llama-3.1-8B head (3 x
 * 4096 bf16 values a token). Sized so a frame stays a bounded allocation; a longer prompt
 * travels in chunks (RESET, then APPEND messages). */
#define PROTO_MAX_FEAT_BYTES (64u << 20)
/* Largest frame either end accepts (ZMQ_MAXMSGSIZE; libzmq drops a peer that sends more,
 * before allocating it). Every valid message fits: a COMMIT_GROW of PROTO_MAX_TOKENS ids
 * even at 9 bytes an id (int64 form) is 9.4 MB, plus PROTO_MAX_FEAT_BYTES of features. */
#define PROTO_FRAME_MAX (80 << 20)

typedef enum {
    PROTO_NONE = 0, /* not a message (after a failed decode / clear) */
    PROTO_HELLO = 1,
    PROTO_HELLO_OK = 2,
    PROTO_RESET = 3,
    PROTO_COMMIT_GROW = 4,
    PROTO_POOL = 5,
    PROTO_ERROR = 6,
    PROTO_BYE = 7,
    PROTO_APPEND = 8,
    PROTO_CLOSE = 9,
} ProtoType;
#define PROTO_TYPE_LAST PROTO_CLOSE

/* Capability bits (HELLO / HELLO_OK). */
#define PROTO_CAP_POOL_V1 (1u << 0) /* grows EAGLE-3-shaped pools (DESIGN.md §2) */
#define PROTO_CAP_CUDA (1u << 1)    /* runs on a CUDA device */
/* HELLO: the target can send features; HELLO_OK: the drafter needs them (an EAGLE-3 head)
 * for the layers its feature_layers names. */
#define PROTO_CAP_FEATURES (1u << 2)

/* Feature payload element types (RESET / COMMIT_GROW). */
typedef enum { PROTO_FEAT_NONE = 0, PROTO_FEAT_BF16 = 1, PROTO_FEAT_F16 = 2 } ProtoFeatType;

typedef struct {
    char fingerprint[PROTO_FP_MAX + 1]; /* NUL-terminated, no embedded NUL */
    uint64_t tokenizer_hash;
    uint32_t vocab_size; /* <= INT32_MAX */
    uint32_t caps;
    uint32_t topk, depth, expand; /* requested pool shape (10, 8, 10) */
} ProtoHello;

typedef struct {
    char fingerprint[PROTO_FP_MAX + 1];
    uint64_t tokenizer_hash;
    uint32_t vocab_size;
    uint32_t caps;
    char name[PROTO_NAME_MAX + 1];
    int n_feat_layers; /* 0..PROTO_FEAT_LAYERS_MAX; > 0 exactly when caps has FEATURES */
    int feat_layers[PROTO_FEAT_LAYERS_MAX];
} ProtoHelloOk;

typedef struct {
    const int32_t *ids; /* (n); encode: caller's; decode: points into ProtoMsg.tok_store */
    int n;
    /* Features of the n tokens: PROTO_FEAT_NONE (feat NULL, feat_width 0) or 16-bit
     * values in host order. */
    ProtoFeatType feat_type;
    int feat_width;
    const uint16_t *feat; // (n, feat_width); decode: points into ProtoMsg.feat_store
    int depth; /* COMMIT_GROW: the pool depth asked for, 1..POOL_MAX_DEPTH; 0: not sent
                  (the full depth) */
    int width; /* COMMIT_GROW: nodes expanded per level, 1..POOL_EXPAND; 0: not sent (the
                  full width); sent only with a depth */
} ProtoTokens;

typedef struct {
    Pool *pool;              /* encode: caller's; decode: ProtoMsg.pool_into or pool_own */
    uint64_t commit_pass_ns; /* drafter time of the commit pass alone (part of draft_ns) */
} ProtoPool;

typedef struct {
    int32_t code; /* RsStatus */
    char message[PROTO_MSG_MAX + 1];
} ProtoError;

typedef struct {
    ProtoType type;
    uint64_t session;
    uint64_t seq;
    uint32_t sid; /* the sequence (RESET, APPEND, COMMIT_GROW, POOL, CLOSE, their ERROR) */
    union {
        ProtoHello hello;       /* PROTO_HELLO */
        ProtoHelloOk hello_ok;  /* PROTO_HELLO_OK */
        ProtoTokens tokens;     /* PROTO_RESET, PROTO_COMMIT_GROW, PROTO_APPEND */
        ProtoPool pool;         /* PROTO_POOL */
        ProtoError error;       /* PROTO_ERROR */
    } u;                        /* PROTO_BYE has no body */
    /* Decoder settings: set by the caller, kept across decodes. */
    Pool *pool_into; /* POOL bodies decode into this Pool; NULL: into pool_own */
    int vocab_size;  /* > 0: decoded token ids (lists and pools) must be < vocab_size */
    /* Decoder-owned storage, reused across decodes, freed by proto_msg_clear. */
    int32_t *tok_store;
    int tok_cap;
    uint16_t *feat_store;
    size_t feat_cap; /* values */
    Pool *pool_own;
} ProtoMsg;

/* Appends the encoding of m to out (clear it first with msgpack_sbuffer_clear to reuse).
 * Checks sizes and string lengths (RS_EINVAL); does not validate pool structure. */
int proto_encode(const ProtoMsg *m, msgpack_sbuffer *out, RsErr *e);

/* Decodes one frame into out. out must be zeroed or previously used (its settings and
 * storage are kept). On failure out->type is PROTO_NONE and out->session / out->seq hold
 * the header values if the header was readable (else 0), for proto_error_reply. */
int proto_decode(const void *buf, size_t len, ProtoMsg *out, RsErr *e);

/* Frees decoder-owned storage and zeroes the message (settings included). */
void proto_msg_clear(ProtoMsg *m);

/* 1 if a and b carry the same message (type, header, body; pools compared on the wire
 * fields, floats bitwise). */
int proto_msg_equal(const ProtoMsg *a, const ProtoMsg *b);

/* Fills out (type, header, body) as the ERROR reply to a request that failed with cause:
 * session/seq copied from req (those proto_decode recovered, 0 if none), code and message
 * from cause (message truncated to PROTO_MSG_MAX bytes). Keeps out's settings/storage. */
void proto_error_reply(ProtoMsg *out, const ProtoMsg *req, const RsErr *cause);

const char *proto_type_name(int type);

/* Rows of `width` 16-bit feature values that fit one message's payload of at most
 * max_bytes (PROTO_MAX_FEAT_BYTES unless a test lowers it), and at most PROTO_MAX_TOKENS;
 * >= 1. A sender splits longer token lists at this many rows. */
int proto_feat_chunk_rows(int width, size_t max_bytes);

/* Feature conversions for the payload: f32 -> bf16 rounds to nearest even (NaN kept NaN);
 * to f32 from either 16-bit type is exact. */
void proto_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
void proto_feat_to_f32(ProtoFeatType t, const uint16_t *src, float *dst, size_t n);

/* ZeroMQ helpers, one frame per message. proto_send blocks until ZeroMQ has queued the
 * frame (RS_EIO on failure). proto_recv waits at most timeout_ms (< 0: forever) and
 * returns RS_ETIMEOUT when nothing came, RS_EPROTO for a multi-part message (drained),
 * RS_EIO for socket errors, or proto_decode's error (the message is consumed). */
int proto_send(void *sock, const ProtoMsg *m, RsErr *e);
/* A ZeroMQ context whose I/O threads are running, started with the scheduler's shortest
 * slice: a message that reaches a process whose threads compute moves on at once instead of
 * after a computing thread's slice (Linux's EEVDF lets a waking task of shorter slice
 * preempt; where slices cannot be asked for, a plain context). NULL when ZeroMQ fails. */
void *proto_ctx_new(void);
int proto_recv(void *sock, ProtoMsg *out, int timeout_ms, RsErr *e);

#endif
