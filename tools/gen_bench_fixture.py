#!/usr/bin/env python3
"""Writes tests/fixtures/bench_bootstrap.txt: synthetic per-prompt (tokens, ns) for two
decoders and the paired-bootstrap gain / speed intervals computed independently with numpy.

The C code (bench/stats.c) draws resample indices from common/rng.c (xoshiro256** seeded by
splitmix64) as floor(x * n / 2^64); this script re-implements that generator in pure Python
so both sides resample the same prompts, then computes the statistic with numpy sums and the
interval with np.percentile (default "linear" method). Run from the repository root:
    python3 tools/gen_bench_fixture.py
"""
import numpy as np

MASK = (1 << 64) - 1
MAGIC, VERSION = "ROOTSPEC-BENCH-BOOT", 1
N_PROMPTS, RESAMPLES, SEED = 13, 2000, 0x5EEDB007


class Xoshiro:
    def __init__(self, seed):
        x = seed & MASK
        self.s = []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & MASK
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
            self.s.append(z ^ (z >> 31))

    @staticmethod
    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & MASK

    def next(self):
        s = self.s
        result = (self.rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self.rotl(s[3], 45)
        return result


def resample_indices(n, b, seed):
    r = Xoshiro(seed)
    return np.array([[(r.next() * n) >> 64 for _ in range(n)] for _ in range(b)], dtype=np.int64)


def main():
    g = np.random.default_rng(7)
    tok_b = g.integers(40, 265, N_PROMPTS)
    speed_b = g.uniform(20.0, 40.0, N_PROMPTS)  # tok/s of the baseline
    ns_b = np.round(tok_b / speed_b * 1e9).astype(np.int64)
    tok_a = np.minimum(264, tok_b + g.integers(-10, 11, N_PROMPTS))
    speed_a = speed_b * g.uniform(0.95, 1.35, N_PROMPTS)  # heterogeneous gains
    ns_a = np.round(tok_a / speed_a * 1e9).astype(np.int64)

    idx = resample_indices(N_PROMPTS, RESAMPLES, SEED)
    ta, na, tb, nb = (np.asarray(v, dtype=np.float64) for v in (tok_a, ns_a, tok_b, ns_b))
    sp_a = ta[idx].sum(axis=1) * 1e9 / na[idx].sum(axis=1)
    sp_b = tb[idx].sum(axis=1) * 1e9 / nb[idx].sum(axis=1)
    gains = sp_a / sp_b - 1.0
    gain_est = (ta.sum() * 1e9 / na.sum()) / (tb.sum() * 1e9 / nb.sum()) - 1.0
    g_lo, g_hi = np.percentile(gains, [2.5, 97.5])
    speed_est = ta.sum() * 1e9 / na.sum()
    s_lo, s_hi = np.percentile(sp_a, [2.5, 97.5])

    with open("tests/fixtures/bench_bootstrap.txt", "w") as f:
        f.write(f"{MAGIC} {VERSION}\n")
        f.write(f"{N_PROMPTS} {RESAMPLES} {SEED}\n")
        for i in range(N_PROMPTS):
            f.write(f"{tok_a[i]} {ns_a[i]} {tok_b[i]} {ns_b[i]}\n")
        f.write(f"gain {gain_est:.17g} {g_lo:.17g} {g_hi:.17g}\n")
        f.write(f"speed {speed_est:.17g} {s_lo:.17g} {s_hi:.17g}\n")
        # first resample's indices, to localise a generator mismatch quickly
        f.write("idx0 " + " ".join(str(int(k)) for k in idx[0]) + "\n")
    print(f"gain {gain_est:.6f} [{g_lo:.6f}, {g_hi:.6f}]  speed {speed_est:.3f} [{s_lo:.3f}, {s_hi:.3f}]")


if __name__ == "__main__":
    main()
