#!/usr/bin/env python3
"""Writes the libFuzzer seed corpus tests/fuzz_corpus/proto/: one valid protocol frame per
message type (the canonical test vectors of tools/proto_client.py, byte-identical to the C
encoder's, see tests/fixtures/proto/vectors.bin), plus a small pool and the uint32-magic
header form so the fuzzer starts from every decoder branch; protocol v2 adds feature payloads
(bf16 and f16, with and without), a HELLO_OK without feature layers, v1 and v2 frames
(refused naming both versions), and an APPEND (the later parts of a context too long for one
message); the COMMIT_GROW vector carries the v3 pool depth and width; v4 frames carry a
sequence id, a v3 frame is refused, and CLOSE ends a sequence."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import msgpack  # noqa: E402
import proto_client as pc  # noqa: E402


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz_corpus/proto"
    os.makedirs(out, exist_ok=True)
    frames = {name: pc.encode(t, s, q, b, sid) for name, t, s, q, sid, b in pc.vectors()}
    # A 3-node pool (root child with two children) and the empty pool.
    frames["pool_small"] = pc.encode(pc.POOL, 9, 2, [3, [5, 6, 7], [-1, 0, 0],
                                                     [-0.5, -1.0, -2.0], [1, 2, 2],
                                                     1000, 10, 1, 1])
    frames["pool_empty"] = pc.encode(pc.POOL, 9, 2, [0, [], [], [], [], 0, 0, 0, 0])
    frames["bye_u32_magic"] = msgpack.packb([pc.MAGIC_U32, pc.VERSION, pc.BYE, 1, 2, 0, []])
    frames["reset_v3"] = msgpack.packb([pc.MAGIC, 3, pc.RESET, 1, 2, [[1, 2], []]])
    frames["close"] = pc.encode(pc.CLOSE, 9, 6, [], 3)
    frames["bye_v1"] = msgpack.packb([pc.MAGIC, 1, pc.BYE, 1, 2, []])
    frames["hello_v2"] = msgpack.packb([pc.MAGIC, 2, pc.HELLO, 1, 2, []])
    frames["reset_nofeat"] = pc.encode(pc.RESET, 9, 3, [[1, 2, 3], []])
    frames["commit_grow_bf16"] = pc.encode(pc.COMMIT_GROW, 9, 4,
                                           [[7, 8], [pc.FEAT_BF16, 3, pc.u16le(range(6))]])
    # A prompt in parts (RESET, then APPEND with the next rows).
    frames["append_bf16"] = pc.encode(pc.APPEND, 9, 5, [[9, 10, 11],
                                                        [pc.FEAT_BF16, 2, pc.u16le(range(6))]])
    frames["hello_ok_nofeat"] = pc.encode(pc.HELLO_OK, 9, 1,
                                          ["fp", 5, 100, pc.CAP_POOL_V1, "d", []])
    for name, data in sorted(frames.items()):
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
        print(f"{out}/{name}.bin: {len(data)} bytes")


if __name__ == "__main__":
    main()
