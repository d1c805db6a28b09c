#!/usr/bin/env python3
"""Dev-time client for the rootspec target<->drafter protocol v4 (proto/PROTOCOL.md).

Modes:
  proto_client.py ENDPOINT [--tokens 42,1000,2] [--prompt 1,2,3] [--fingerprint FP
                  --tokenizer-hash H --vocab V] [--rounds N] [--socket dealer|pair]
                  [--feat-width W]
      connect to a drafter, HELLO, RESET, COMMIT_GROW, check each POOL, BYE. A drafter
      that wants target features (an EAGLE-3 head) gets random bf16 rows of width W.
      Exits non-zero on any failure (ERROR reply, timeout, malformed or invalid pool).
  proto_client.py --check-vectors [tests/fixtures/proto/vectors.bin]
      decode the C encoder's test vectors, compare them with the messages rebuilt here and
      check that this encoder produces the same bytes.
  proto_client.py --mock-drafter ENDPOINT [--bad-pool KIND] [--want-features]
      serve a synthetic drafter (ROUTER, or PAIR with --socket pair) for testing the client.
  proto_client.py --self-test
      run the client against the mock drafter in-process, good and bad pools.

Only pyzmq and msgpack are needed. The encoder writes exactly the bytes the C codec writes
(shortest ints, float32 log q, str8 strings), which --check-vectors verifies."""
import argparse
import math
import os
import random
import re
import struct
import sys
import threading

import msgpack
import zmq

MAGIC = "RSPC"
MAGIC_U32 = 0x52535043
VERSION = 4
# What the versions after an older peer's added, as the C decoder words it.
VERSION_NEWS = {1: "target features for EAGLE-3 drafters, the pool width, then sequence ids",
                2: "the pool width in COMMIT_GROW, then sequence ids",
                3: "a sequence id in every frame, CLOSE"}
HELLO, HELLO_OK, RESET, COMMIT_GROW, POOL, ERROR, BYE, APPEND, CLOSE = range(1, 10)
TYPE_NAMES = {1: "HELLO", 2: "HELLO_OK", 3: "RESET", 4: "COMMIT_GROW", 5: "POOL", 6: "ERROR",
              7: "BYE", 8: "APPEND", 9: "CLOSE"}
BODY_FIELDS = {HELLO: 5, HELLO_OK: 6, RESET: 2, COMMIT_GROW: 2, POOL: 9, ERROR: 2, BYE: 0,
               APPEND: 2, CLOSE: 0}
CAP_POOL_V1, CAP_CUDA, CAP_FEATURES = 1, 2, 4
FEAT_BF16, FEAT_F16 = 1, 2
FEAT_LAYERS_MAX, FEAT_WIDTH_MAX, MAX_FEAT_BYTES = 8, 1 << 17, 64 << 20
POOL_MAX, POOL_MAX_DEPTH, POOL_EXPAND, MAX_TOKENS = 710, 8, 10, 1 << 20
U64 = (1 << 64) - 1


class ProtoError(Exception):
    pass


# ------------------------------------------------------------------ codec

def encode(mtype, session, seq, body, sid=0):
    """body: the per-type field list (see PROTOCOL.md); logq must be Python floats; sid: the
    sequence the message is about."""
    return msgpack.packb([MAGIC, VERSION, mtype, session, seq, sid, body], use_bin_type=True,
                         use_single_float=True)


def _int(v, what, lo, hi):
    if not isinstance(v, int) or isinstance(v, bool):
        raise ProtoError(f"{what} is {type(v).__name__}, expected int")
    if not lo <= v <= hi:
        raise ProtoError(f"{what} is {v}, expected {lo}..{hi}")
    return v


def _str(v, what, maxlen):
    if not isinstance(v, str):
        raise ProtoError(f"{what} is {type(v).__name__}, expected str")
    if len(v.encode()) > maxlen or "\0" in v:
        raise ProtoError(f"{what} is too long or has a NUL")
    return v


def _arr(v, what, n=None):
    if not isinstance(v, list):
        raise ProtoError(f"{what} is {type(v).__name__}, expected array")
    if n is not None and len(v) != n:
        raise ProtoError(f"{what} has {len(v)} fields, expected {n}")
    return v


def decode(buf):
    """Returns (type, session, seq, body) with the body checked field by field."""
    mtype, session, seq, _sid, body = decode_sid(buf)
    return mtype, session, seq, body


def decode_sid(buf):
    """Returns (type, session, seq, sid, body) with the body checked field by field."""
    try:
        msg = msgpack.unpackb(buf, raw=False, use_list=True, strict_map_key=False,
                              unicode_errors="replace")
    except Exception as ex:  # msgpack raises several types for malformed input
        raise ProtoError(f"not a msgpack message: {ex}")
    _arr(msg, "frame")
    if len(msg) not in (6, 7):
        raise ProtoError(f"frame has {len(msg)} elements, expected 7")
    magic, ver = msg[0], msg[1]
    if magic != MAGIC and magic != MAGIC_U32:
        raise ProtoError(f"bad magic {magic!r}")
    _int(ver, "version", 0, U64)
    if 1 <= ver < VERSION:
        raise ProtoError(f"the peer speaks protocol version {ver}, this end version {VERSION} "
                         f"({VERSION_NEWS[ver]}): run the same rootspec release on both ends")
    if ver != VERSION:
        raise ProtoError(f"protocol version {ver}, expected {VERSION}")
    _arr(msg, "frame", 7)
    _, _, mtype, session, seq, sid, body = msg
    _int(sid, "sid", 0, (1 << 32) - 1)
    _int(mtype, "type", 0, U64)
    if mtype not in TYPE_NAMES:
        raise ProtoError(f"unknown message type {mtype}")
    _int(session, "session", 0, U64)
    _int(seq, "seq", 0, U64)
    name = TYPE_NAMES[mtype]
    if mtype == POOL and isinstance(body, list) and len(body) == 11:
        pass  # the optional draft_host_ns, draft_rows
    elif mtype == COMMIT_GROW and isinstance(body, list) and len(body) in (3, 4):
        _int(body[2], "pool depth", 1, POOL_MAX_DEPTH)  # the optional pool shape
        if len(body) == 4:
            _int(body[3], "pool width", 1, POOL_EXPAND)
    else:
        _arr(body, f"{name} body", BODY_FIELDS[mtype])
    if mtype in (HELLO, HELLO_OK):
        _str(body[0], "fingerprint", 64)
        _int(body[1], "tokenizer_hash", 0, U64)
        _int(body[2], "vocab_size", 0, 2**31 - 1)
        _int(body[3], "capabilities", 0, 2**32 - 1)
        if mtype == HELLO:
            for i, v in enumerate(_arr(body[4], "pool shape", 3)):
                _int(v, f"pool shape[{i}]", 0, 2**32 - 1)
        else:
            _str(body[4], "drafter_name", 63)
            layers = _arr(body[5], "feature_layers")
            if len(layers) > FEAT_LAYERS_MAX:
                raise ProtoError(f"feature_layers has {len(layers)} entries")
            for i, v in enumerate(layers):
                _int(v, f"feature_layers[{i}]", 0, 65535)
            if bool(layers) != bool(body[3] & CAP_FEATURES):
                raise ProtoError("feature_layers and the FEATURES capability disagree")
    elif mtype in (RESET, COMMIT_GROW, APPEND):
        toks = _arr(body[0], "tokens")
        if len(toks) > MAX_TOKENS or (mtype in (COMMIT_GROW, APPEND) and not toks):
            raise ProtoError(f"{name} has {len(toks)} tokens")
        for i, t in enumerate(toks):
            _int(t, f"tokens[{i}]", 0, 2**31 - 1)
        feat = _arr(body[1], "features")
        if feat:
            _arr(feat, "features", 3)
            _int(feat[0], "features dtype", FEAT_BF16, FEAT_F16)
            width = _int(feat[1], "features width", 1, FEAT_WIDTH_MAX)
            if not isinstance(feat[2], bytes):
                raise ProtoError(f"features data is {type(feat[2]).__name__}, expected bin")
            if len(feat[2]) > MAX_FEAT_BYTES:
                raise ProtoError(f"features data is {len(feat[2])} bytes, over the "
                                 f"{MAX_FEAT_BYTES}-byte limit")
            if len(feat[2]) != len(toks) * width * 2:
                raise ProtoError(f"features data is {len(feat[2])} bytes, expected "
                                 f"{len(toks) * width * 2}")
    elif mtype == POOL:
        n = _int(body[0], "n", 0, POOL_MAX)
        for k, what in enumerate(("tokens", "parents", "logq", "depths"), start=1):
            _arr(body[k], what)
            if len(body[k]) != n:
                raise ProtoError(f"POOL {what} has {len(body[k])} entries, n is {n}")
        for i in range(n):
            _int(body[1][i], f"tokens[{i}]", 0, 2**31 - 1)
            _int(body[2][i], f"parents[{i}]", -1, POOL_MAX - 1)
            if not isinstance(body[3][i], float):
                raise ProtoError(f"logq[{i}] is {type(body[3][i]).__name__}, expected float")
            _int(body[4][i], f"depths[{i}]", 1, POOL_MAX_DEPTH)
        for k, what in ((5, "draft_ns"), (6, "commit_pass_ns")):
            _int(body[k], what, 0, U64)
        _int(body[7], "n_passes", 0, 2**31 - 1)
        _int(body[8], "n_expanded", 0, 2**31 - 1)
        if len(body) == 11:
            _int(body[9], "draft_host_ns", 0, U64)
            _int(body[10], "draft_rows", 0, 2**31 - 1)
    elif mtype == ERROR:
        _int(body[0], "code", -2**31, 2**31 - 1)
        _str(body[1], "message", 511)
    return mtype, session, seq, sid, body


def check_pool(body, vocab=0, expect_full=True):
    """The structural rules of DESIGN.md §2 (and pool_finalize); returns a list of problems."""
    n, toks, parents, logq, depths = body[:5]
    bad = []
    if expect_full and n != POOL_MAX:
        bad.append(f"pool has {n} candidates, expected {POOL_MAX}")
    for i in range(n):
        p = parents[i]
        if not -1 <= p < i:
            bad.append(f"candidate {i} has parent {p}, which does not precede it")
            continue
        want = 1 if p < 0 else depths[p] + 1
        if depths[i] != want:
            bad.append(f"candidate {i} has depth {depths[i]}, expected {want}")
        if not (math.isfinite(logq[i]) and logq[i] <= 0):
            bad.append(f"candidate {i} has log q {logq[i]}, expected finite <= 0")
        if vocab and not 0 <= toks[i] < vocab:
            bad.append(f"candidate {i} has token {toks[i]}, outside [0, {vocab})")
    children = {}
    for i in range(n):
        children.setdefault(parents[i], []).append(i)
    for p, ch in children.items():
        if ch != list(range(ch[0], ch[0] + len(ch))):
            bad.append(f"children of node {p} are not contiguous")
        if len({toks[c] for c in ch}) != len(ch):
            bad.append(f"children of node {p} repeat a token")
    expanded = sum(1 for p in children if p >= 0)
    if expanded > 70:  # pool_finalize's limit: the target sizes its passes for 70
        bad.append(f"{expanded} expanded nodes, at most 70")
    if expect_full:
        per = [sum(1 for d in depths if d == k) for k in range(1, POOL_MAX_DEPTH + 1)]
        if per != [10] + [100] * 7:
            bad.append(f"candidates per depth {per}, expected [10, 100 x 7]")
        if n and expanded != 70:
            bad.append(f"{expanded} expanded nodes, expected 70")
    return bad


# ------------------------------------------------------------------ test vectors

SESSION = 0x1122334455667788
FP = "smollm2-135m-q4_1-test"
TOK_HASH = 0xcbf29ce484222325


def vector_pool():
    """Same synthetic EAGLE-3-shaped pool as tests/test_proto.c make_pool()."""
    parents = [-1] * 10
    depths = [1] * 10
    level_start = 0
    for d in range(2, POOL_MAX_DEPTH + 1):
        new_start = len(parents)
        for j in range(10):
            par = level_start + j if d == 2 else level_start + 11 * j
            parents += [par] * 10
            depths += [d] * 10
        level_start = new_start
    n = len(parents)
    toks = [(i * 7919 + 13) % 49152 for i in range(n)]
    logq = [-float((i * 37) % 97 + 1) / 32.0 for i in range(n)]
    return [n, toks, parents, logq, depths, 51234567, 4567890, 8, 70]


def u16le(values):
    return struct.pack(f"<{len(values)}H", *values)


# The feature payloads of tests/test_proto.c's RESET (bf16, width 2) and COMMIT_GROW
# (f16, width 4) vectors.
RESET_FEAT = [0x3f80, 0xc020, 0x0000, 0x8000, 0x7f7f, 0x0001, 0x4049, 0xbf80, 0x3c00, 0x3e80,
              0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120, 0x4130,
              0x4140, 0xff7f]
GROW_FEAT = [0x3c00, 0xc100, 0x0000, 0x7bff, 0x0001, 0x8400, 0x3555, 0x4248, 0xfbff, 0x3800,
             0x4000, 0x4400]


def f32_to_bf16(values):
    """Round to nearest even, as proto_f32_to_bf16 does (NaN-free input)."""
    out = []
    for v in values:
        (u,) = struct.unpack("<I", struct.pack("<f", v))
        out.append(((u + 0x7fff + ((u >> 16) & 1)) >> 16) & 0xffff)
    return out


def vectors():
    """(name, type, session, seq, sid, body) for the seven canonical messages."""
    return [
        ("hello", HELLO, SESSION, 1, 0, [FP, TOK_HASH, 49152, CAP_POOL_V1, [10, 8, 10]]),
        ("hello_ok", HELLO_OK, SESSION, 1, 0,
         [FP, TOK_HASH, 49152, CAP_POOL_V1 | CAP_CUDA | CAP_FEATURES, "rootspec-drafter/cpu",
          [2, 16, 300]]),
        ("reset", RESET, SESSION, 2, 7,
         [[1, 9690, 28, 49151, 0, 127, 128, 255, 256, 32767, 32768],
          [FEAT_BF16, 2, u16le(RESET_FEAT)]]),
        ("commit_grow", COMMIT_GROW, SESSION, 3, 7,
         [[42, 1000, 2], [FEAT_F16, 4, u16le(GROW_FEAT)], 5, 1]),
        ("pool", POOL, SESSION, 3, 7, vector_pool()),
        ("error", ERROR, SESSION, 4, 0, [-5, "proto: unknown message type 99"]),
        ("bye", BYE, SESSION, 5, 0, []),
    ]


def read_vector_file(path):
    data = open(path, "rb").read()
    if len(data) < 12 or data[:4] != b"RSPV":
        raise ProtoError(f"{path}: bad magic")
    version, count = struct.unpack_from("<II", data, 4)
    if version != 1:
        raise ProtoError(f"{path}: vector file version {version}, expected 1")
    off, out = 12, []
    for _ in range(count):
        nl = data[off]
        name = data[off + 1:off + 1 + nl].decode()
        off += 1 + nl
        (fl,) = struct.unpack_from("<I", data, off)
        off += 4
        if off + fl > len(data):
            raise ProtoError(f"{path}: truncated at vector {name}")
        out.append((name, data[off:off + fl]))
        off += fl
    if off != len(data):
        raise ProtoError(f"{path}: {len(data) - off} trailing bytes")
    return out


def check_vectors(path):
    got = dict(read_vector_file(path))
    fails = 0
    for name, mtype, session, seq, sid, body in vectors():
        before = fails
        if name not in got:
            print(f"FAIL {name}: missing from {path}")
            fails += 1
            continue
        frame = got[name]
        try:
            dec = decode_sid(frame)
        except ProtoError as ex:
            print(f"FAIL {name}: {ex}")
            fails += 1
            continue
        if dec != (mtype, session, seq, sid, body):
            print(f"FAIL {name}: decoded content differs from the expected message")
            fails += 1
        mine = encode(mtype, session, seq, body, sid)
        if mine != frame:
            i = next((k for k in range(min(len(mine), len(frame))) if mine[k] != frame[k]),
                     min(len(mine), len(frame)))
            print(f"FAIL {name}: Python encoding differs from C at byte {i} "
                  f"({len(mine)} vs {len(frame)} bytes)")
            fails += 1
        if mtype == POOL and check_pool(body, 49152):
            print(f"FAIL {name}: {check_pool(body, 49152)[:3]}")
            fails += 1
        if fails == before:
            print(f"ok   {name}: {len(frame)} bytes identical, decoded as {TYPE_NAMES[mtype]}")
    return fails


# ------------------------------------------------------------------ client

def recv(sock, timeout_ms):
    if not sock.poll(timeout_ms):
        raise ProtoError(f"no reply within {timeout_ms} ms")
    parts = sock.recv_multipart()
    if len(parts) != 1:
        raise ProtoError(f"multi-part message ({len(parts)} frames), expected one frame")
    return decode(parts[0])


def expect(sock, timeout_ms, session, seq, want):
    mtype, s, q, body = recv(sock, timeout_ms)
    if mtype == ERROR:
        raise ProtoError(f"drafter replied ERROR {body[0]}: {body[1]} (seq {q})")
    if mtype != want:
        raise ProtoError(f"got {TYPE_NAMES[mtype]}, expected {TYPE_NAMES[want]}")
    if s != session or q != seq:
        raise ProtoError(f"{TYPE_NAMES[mtype]} has session {s} seq {q}, "
                         f"expected {session} {seq}")
    return body


def run_client(sock, args, log=print):
    session = args.session if args.session is not None else random.getrandbits(64)
    seq = 1
    shape = [10, 8, 10]
    fp, tok_hash, vocab = args.fingerprint, args.tokenizer_hash, args.vocab
    caps = CAP_POOL_V1 | (CAP_FEATURES if args.feat_width else 0)
    for attempt in range(2):
        sock.send(encode(HELLO, session, seq, [fp, tok_hash, vocab, caps, shape]))
        try:
            ok = expect(sock, args.timeout_ms, session, seq, HELLO_OK)
            break
        except ProtoError as ex:
            # "Accept the drafter's": rootspec-draft refuses a mismatch and names its own
            # vocab and tokenizer hash; when the user gave neither, retry once with those.
            m = re.search(r"drafter vocab (\d+) \(tokenizer ([0-9a-fA-F]+)\)", str(ex))
            if attempt or not m or args.vocab or args.tokenizer_hash:
                raise
            vocab, tok_hash = int(m.group(1)), int(m.group(2), 16)
            log(f"HELLO refused ({ex}); retrying with the drafter's vocab {vocab} "
                f"tokenizer {tok_hash:#018x}")
            seq += 1
    vocab = args.vocab or ok[2]
    rng = random.Random(1)

    def features(n):
        # Random rows stand in for the target's features: the drafter's pool is only
        # checked for shape, not content.
        if not ok[5]:
            return []
        vals = [rng.gauss(0.0, 1.0) for _ in range(n * args.feat_width)]
        return [FEAT_BF16, args.feat_width, u16le(f32_to_bf16(vals))]

    if ok[5]:
        if not args.feat_width:
            raise ProtoError(f"drafter wants the target's features of layers {ok[5]}: "
                             f"give --feat-width (3 x the target's hidden size)")
        log(f"drafter wants features of layers {ok[5]}: sending random bf16 rows of width "
            f"{args.feat_width}")
    # Features over one message's bound travel in parts (PROTOCOL.md, Features): a RESET
    # as RESET + APPENDs, a COMMIT_GROW as APPENDs + COMMIT_GROW.
    chunk_bytes = getattr(args, "feat_chunk_bytes", MAX_FEAT_BYTES)
    rows = max(1, min(MAX_TOKENS, chunk_bytes // (2 * args.feat_width))) if ok[5] else MAX_TOKENS

    def send_tokens(kind, toks):
        nonlocal seq
        off = 0
        while True:
            part = toks[off:off + rows]
            last = off + len(part) >= len(toks)
            mtype = (RESET if kind == RESET and off == 0
                     else COMMIT_GROW if kind == COMMIT_GROW and last else APPEND)
            seq += 1
            sock.send(encode(mtype, session, seq, [part, features(len(part))]))
            off += len(part)
            if last:
                return

    send_tokens(RESET, list(args.prompt))  # no reply unless it fails
    commit = list(args.tokens)
    for rnd in range(args.rounds):
        send_tokens(COMMIT_GROW, commit)
        body = expect(sock, args.timeout_ms, session, seq, POOL)
        bad = check_pool(body, vocab)
        if bad:
            raise ProtoError(f"round {rnd}: invalid pool: " + "; ".join(bad[:5]))
        n, toks, parents, logq, depths = body[:5]
        score = []
        for i in range(n):
            score.append(logq[i] + (score[parents[i]] if parents[i] >= 0 else 0.0))
        best = sorted(range(n), key=lambda i: (-score[i], depths[i], i))[:5]
        log(f"round {rnd}: POOL ok: {n} candidates, draft {body[5] / 1e6:.2f} ms "
            f"(commit pass {body[6] / 1e6:.2f} ms), {body[7]} passes, {body[8]} expanded; "
            f"top: " + ", ".join(f"{toks[i]}@d{depths[i]}({score[i]:.2f})" for i in best))
        commit = [toks[best[0]] if depths[best[0]] == 1 else toks[0]]
    seq += 1
    sock.send(encode(BYE, session, seq, []))
    expect(sock, args.timeout_ms, session, seq, BYE)
    log("BYE ok")


# ------------------------------------------------------------------ mock drafter

def serve_mock(sock, bad_pool=None, vocab=49152, router=False, want_features=False, stats=None):
    """Answers like a drafter: HELLO_OK, POOL per COMMIT_GROW, BYE; ERROR for bad frames.
    router: the socket is a ROUTER (frames [identity, payload]), as rootspec-draft's is.
    want_features: asks for features (layers 2, 16, 29) and refuses commits without them."""
    layers = [2, 16, 29] if want_features else []
    appends = stats if stats is not None else [0]
    caps = CAP_POOL_V1 | (CAP_FEATURES if want_features else 0)
    while True:
        parts = sock.recv_multipart()
        ident, frame = (parts[0], parts[1:]) if router else (None, parts)

        def reply(data):
            sock.send_multipart([ident, data] if router else [data])

        if len(frame) != 1:
            reply(encode(ERROR, 0, 0, [-5, f"multi-part message ({len(frame)} frames)"]))
            continue
        try:
            mtype, session, seq, sid, body = decode_sid(frame[0])
        except ProtoError as ex:
            reply(encode(ERROR, 0, 0, [-5, f"proto: {ex}"[:511]]))
            continue
        if mtype == HELLO:
            reply(encode(HELLO_OK, session, seq, ["mock-fingerprint", body[1], body[2] or vocab,
                                                  caps, "mock-drafter", layers]))
            vocab = body[2] or vocab
        elif mtype in (RESET, APPEND, CLOSE):
            appends[0] += mtype == APPEND
        elif mtype == COMMIT_GROW and want_features and not body[1]:
            reply(encode(ERROR, session, seq, [-4, "COMMIT_GROW without features"]))
        elif mtype == COMMIT_GROW:
            pool = vector_pool()
            pool[1] = [t % vocab for t in pool[1]]
            if bad_pool == "parent":
                pool[2][5] = 7
            elif bad_pool == "logq":
                pool[3][100] = 0.5
            elif bad_pool == "short":
                pool = [9] + [x[:9] for x in pool[1:5]] + pool[5:]
            reply(encode(POOL, session, seq, pool, sid))
        elif mtype == BYE:
            reply(encode(BYE, session, seq, []))
            return
        else:
            reply(encode(ERROR, session, seq, [-5, f"unexpected {TYPE_NAMES[mtype]}"]))


def self_test():
    fails = 0
    ctx = zmq.Context.instance()
    cases = [(bad, "pair") for bad in (None, "parent", "logq", "short")] + [(None, "dealer")]
    cases += [(None, "features"), ("nofeat", "features"), (None, "features-chunked")]
    for bad, kind in cases:
        ep = f"inproc://mock-{bad}-{kind}"
        router = kind == "dealer"
        feats = kind.startswith("features")
        stats = [0]
        srv = ctx.socket(zmq.ROUTER if router else zmq.PAIR)
        srv.bind(ep)
        t = threading.Thread(target=serve_mock,
                             args=(srv, None if feats else bad, 49152, router, feats, stats),
                             daemon=True)
        t.start()
        cli = ctx.socket(zmq.DEALER if router else zmq.PAIR)
        cli.connect(ep)
        args = argparse.Namespace(session=7, fingerprint="", tokenizer_hash=0, vocab=0,
                                  prompt=[1, 2, 3], tokens=[42], rounds=2, timeout_ms=5000,
                                  feat_width=0 if bad == "nofeat" else (12 if feats else 0),
                                  feat_chunk_bytes=48 if kind == "features-chunked"
                                  else MAX_FEAT_BYTES)
        if kind == "features-chunked":
            args.prompt, args.tokens = [1, 2, 3, 4, 5], [42, 43, 44]  # 2 rows a message
        try:
            run_client(cli, args, log=lambda s: None)
            ok = bad is None
            why = "accepted"
            if kind == "features-chunked":  # RESET 2+2+1: 2 APPENDs; commit 2+1: 1, then 1 token
                ok = ok and stats[0] == 3
                why = f"accepted, {stats[0]} APPENDs"
        except ProtoError as ex:
            ok = bad is not None
            why = str(ex)
            cli.send(encode(BYE, 7, 99, []))  # let the mock finish
        print(f"{'ok  ' if ok else 'FAIL'} self-test {kind} pool={bad or 'good'}: {why[:90]}")
        fails += not ok
        t.join(5)
        cli.close(0)
        srv.close(0)
    return fails


# ------------------------------------------------------------------ main

def ints(s):
    return [int(x) for x in s.split(",") if x.strip()] if s else []


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("endpoint", nargs="?", help="drafter endpoint, e.g. ipc:///tmp/draft.sock")
    ap.add_argument("--check-vectors", nargs="?", const="tests/fixtures/proto/vectors.bin")
    ap.add_argument("--mock-drafter", metavar="ENDPOINT")
    ap.add_argument("--bad-pool", choices=["parent", "logq", "short"])
    ap.add_argument("--want-features", action="store_true",
                    help="the mock drafter asks for target features (an EAGLE-3 head)")
    ap.add_argument("--feat-chunk-bytes", type=int, default=MAX_FEAT_BYTES,
                    help="feature bytes a message before splitting (tests lower it)")
    ap.add_argument("--feat-width", type=int, default=0,
                    help="width of the random feature rows sent to a drafter that wants them")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--socket", choices=["dealer", "pair"], default="dealer",
                    help="dealer (default; talks to rootspec-draft's ROUTER) or pair")
    ap.add_argument("--fingerprint", default="", help="target model fingerprint ('' = any)")
    ap.add_argument("--tokenizer-hash", type=lambda s: int(s, 0), default=0,
                    help="0 = accept the drafter's")
    ap.add_argument("--vocab", type=int, default=0, help="0 = accept the drafter's")
    ap.add_argument("--prompt", type=ints, default=[1, 2, 3], help="RESET tokens, comma list")
    ap.add_argument("--tokens", type=ints, default=[42], help="COMMIT_GROW tokens")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--session", type=int, default=None)
    ap.add_argument("--timeout-ms", type=int, default=30000)
    args = ap.parse_args()
    if args.check_vectors:
        sys.exit(1 if check_vectors(args.check_vectors) else 0)
    if args.self_test:
        sys.exit(1 if self_test() else 0)
    kind = zmq.PAIR if args.socket == "pair" else zmq.DEALER
    ctx = zmq.Context.instance()
    if args.mock_drafter:
        router = args.socket == "dealer"
        sock = ctx.socket(zmq.ROUTER if router else zmq.PAIR)
        sock.bind(args.mock_drafter)
        serve_mock(sock, args.bad_pool, router=router, want_features=args.want_features)
        sock.close(linger=1000)
        return
    if not args.endpoint:
        ap.error("give a drafter ENDPOINT, --check-vectors, --mock-drafter or --self-test")
    if not args.tokens:
        ap.error("--tokens must not be empty (it ends with the continuation token)")
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.endpoint)
    try:
        run_client(sock, args)
    except ProtoError as ex:
        print(f"proto_client: FAIL: {ex}", file=sys.stderr)
        sys.exit(1)
    finally:
        sock.close(0)


if __name__ == "__main__":
    main()
