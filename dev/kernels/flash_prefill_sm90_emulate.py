#!/usr/bin/env python3
"""Emulates flash_prefill_sm90.cu's data movement and register math with NumPy.

A GPU-free check of the kernel's glue: where TMA puts a tile in shared memory
(128-byte swizzle), the wgmma descriptors exactly as the kernel encodes them
(start address, LBO, SBO, k-step offsets) decoded by the rules of the PTX ISA
"Matrix Descriptor Format" / canonical 128B-swizzle layouts (K-major for Q and
K, MN-major for V), the accumulator and A-fragment layouts per thread, the
masking limits, the online softmax with quad reductions, the bf16 P repack,
and the epilogue's swizzled staging. Both variants (serial and overlapped)
follow the kernel's order of operations. It cannot check the hardware itself
(barriers, async proxies): that is the device test's job.

usage: python3 dev/kernels/flash_prefill_sm90_emulate.py   (exit 0 when all cases match)
"""
import sys

import numpy as np

D, BM, BN, STAGES = 128, 128, 128, 2
BOX = 128 * 64 * 2
TILE = 2 * BOX
Q_OFF, K_OFF = 0, TILE
V_OFF = K_OFF + STAGES * TILE
SMEM = V_OFF + STAGES * TILE
LOG2E = 1.4426950408889634


def bf16(x):
    """Round f32 to bf16 (nearest even), returned as f32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def swz(addr):
    """128-byte swizzle of a shared-memory byte address (1024-aligned tiles)."""
    return addr ^ (((addr >> 7) & 7) << 4)


class Smem:
    def __init__(self):
        self.b = np.zeros(SMEM // 2, np.float32)  # one f32 slot per bf16 element (address / 2)

    def tma_load(self, dst, tensor, c0, c1):
        """Box of [128 rows][64 cols] at (col c0, row c1); rows past the end arrive as zeros."""
        rows, width = tensor.shape
        for r in range(128):
            for c in range(64):
                v = tensor[c1 + r, c0 + c] if c1 + r < rows else 0.0
                assert c0 + c < width
                self.b[swz(dst + r * 128 + c * 2) // 2] = v

    def read(self, addr):
        return self.b[swz(addr) // 2]


def desc_sw128(addr, lbo, sbo):
    return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (1 << 62)


def desc_fields(d):
    assert (d >> 62) == 1, "128B swizzle"
    assert ((d >> 49) & 7) == 0, "base offset"
    return (d & 0x3FFF) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4


def kmajor_operand(smem, d, rows):
    """[rows, 16] read through a K-major 128B-swizzle descriptor."""
    start, _, sbo = desc_fields(d)
    out = np.zeros((rows, 16), np.float32)
    for i in range(rows):
        for k in range(16):
            out[i, k] = smem.read(start + (i // 8) * sbo + (i % 8) * 128 + k * 2)
    return out


def mnmajor_operand(smem, d, n):
    """[16, n] (K rows, N cols) read through an MN-major 128B-swizzle descriptor."""
    start, lbo, sbo = desc_fields(d)
    out = np.zeros((16, n), np.float32)
    for k in range(16):
        for j in range(n):
            out[k, j] = smem.read(start + (k // 8) * sbo + (k % 8) * 128 + (j // 64) * lbo + (j % 64) * 2)
    return out


# Thread t (0..127) of a warpgroup: warp w = t // 32, lane: g = lane // 4, q = lane % 4.
T = np.arange(128)
W, G, Q4 = T // 32, (T % 32) // 4, T % 4


def acc_index(j, e):
    """(row, col) of accumulator element d[4j + e] for every thread."""
    return 16 * W + G + 8 * (e >> 1), 8 * j + 2 * Q4 + (e & 1)


def to_regs(mat):
    """[64, 128] matrix → per-thread accumulator registers [128, 64]."""
    regs = np.zeros((128, 64), np.float32)
    for j in range(16):
        for e in range(4):
            r, c = acc_index(j, e)
            regs[:, 4 * j + e] = mat[r, c]
    return regs


def from_a_frag(pa):
    """Per-thread A fragments pa[128, 8 (kk), 4 (reg), 2 (lo, hi)] → the [64, 128] matrix they describe."""
    mat = np.full((64, 128), np.nan, np.float32)
    for kk in range(8):
        for reg in range(4):
            for half in range(2):
                row = 16 * W + G + 8 * (reg & 1)
                col = 16 * kk + 2 * Q4 + half + 8 * (reg >> 1)
                mat[row, col] = pa[:, kk, reg, half]
    assert not np.isnan(mat).any(), "A fragment does not cover the matrix"
    return mat


def wgmma_ss(s, smem, dq, dk, accumulate):
    a = kmajor_operand(smem, dq, 64)  # [64, 16]
    b = kmajor_operand(smem, dk, 128)  # [128 keys, 16]
    res = to_regs(a.astype(np.float64) @ b.T.astype(np.float64))
    return (s + res if accumulate else res).astype(np.float32)


def wgmma_rs(o, pa_kk, smem, dv):
    # pa_kk: [128, 4, 2]: one k16 step of A → build a [64, 16] A block
    a = np.zeros((64, 16), np.float32)
    for reg in range(4):
        for half in range(2):
            a[16 * W + G + 8 * (reg & 1), 2 * Q4 + half + 8 * (reg >> 1)] = pa_kk[:, reg, half]
    b = mnmajor_operand(smem, dv, 128)  # [16 keys, 128]
    return (o + to_regs(a.astype(np.float64) @ b.astype(np.float64))).astype(np.float32)


def quad_max(x):
    """x[128] → max over the 4 threads of each quad (shfl xor 1, then 2)."""
    y = np.maximum(x, x[T ^ 1])
    return np.maximum(y, y[T ^ 2])


def quad_sum(x):
    y = x + x[T ^ 1]
    return y + y[T ^ 2]


class Consumer:
    """One consumer warpgroup, following the kernel's ConsumerCtx / consume / epilogue."""

    def __init__(self, cw, pos0, n_kv, scale):
        self.cw = cw
        self.desc_q = desc_sw128(Q_OFF + cw * 64 * 128, 16, 1024)
        self.wg_pos = pos0 + cw * 64
        self.row_pos = self.wg_pos + W * 16 + G  # per thread
        self.n_kv = n_kv
        self.sl2 = np.float32(scale * LOG2E)

    def desc_k(self, st):
        return desc_sw128(K_OFF + st * TILE, 16, 1024)

    def desc_v(self, st):
        return desc_sw128(V_OFF + st * TILE, BOX, 1024)

    def needs_mask(self, kv0):
        return kv0 + BN - 1 > self.wg_pos or kv0 + BN > self.n_kv

    def softmax(self, s, m, l, kv0):
        s = s.copy()
        if self.needs_mask(kv0):
            lim = [np.maximum(np.minimum(self.row_pos + 8 * r, self.n_kv - 1) - kv0, -1) for r in range(2)]
            for j in range(16):
                for e in range(4):
                    key = 8 * j + 2 * Q4 + (e & 1)
                    s[:, 4 * j + e] = np.where(key > lim[e >> 1], -np.inf, s[:, 4 * j + e])
        mx = [m[0].copy(), m[1].copy()]
        for j in range(16):
            for e in range(4):
                mx[e >> 1] = np.maximum(mx[e >> 1], s[:, 4 * j + e])
        corr, ms = [None, None], [None, None]
        with np.errstate(invalid="ignore"):
            for r in range(2):
                mx[r] = quad_max(mx[r])
                m_use = np.where(mx[r] == -np.inf, np.float32(0), mx[r]).astype(np.float32)
                corr[r] = np.exp2((m[r] - m_use) * self.sl2).astype(np.float32)
                m[r] = mx[r]
                ms[r] = (m_use * self.sl2).astype(np.float32)
        sums = [np.zeros(128, np.float32), np.zeros(128, np.float32)]
        for j in range(16):
            for e in range(4):
                pe = np.exp2(s[:, 4 * j + e] * self.sl2 - ms[e >> 1]).astype(np.float32)
                s[:, 4 * j + e] = pe
                sums[e >> 1] = sums[e >> 1] + pe
        for r in range(2):
            l[r] = l[r] * corr[r] + sums[r]
        return s, corr

    @staticmethod
    def rescale(o, corr):
        o = o.copy()
        for j in range(16):
            o[:, 4 * j + 0] *= corr[0]
            o[:, 4 * j + 1] *= corr[0]
            o[:, 4 * j + 2] *= corr[1]
            o[:, 4 * j + 3] *= corr[1]
        return o

    @staticmethod
    def p_to_bf16(s):
        pa = np.zeros((128, 8, 4, 2), np.float32)
        for kk in range(8):
            pa[:, kk, 0] = bf16(s[:, [8 * kk + 0, 8 * kk + 1]])
            pa[:, kk, 1] = bf16(s[:, [8 * kk + 2, 8 * kk + 3]])
            pa[:, kk, 2] = bf16(s[:, [8 * kk + 4, 8 * kk + 5]])
            pa[:, kk, 3] = bf16(s[:, [8 * kk + 6, 8 * kk + 7]])
        return pa

    def gemm_qk(self, smem, st):
        s = np.zeros((128, 64), np.float32)
        for kk in range(D // 16):
            off = ((kk >> 2) * BOX + (kk & 3) * 32) >> 4
            s = wgmma_ss(s, smem, self.desc_q + off, self.desc_k(st) + off, kk > 0)
        return s

    def gemm_pv(self, o, pa, smem, st):
        for kk in range(BN // 16):
            o = wgmma_rs(o, pa[:, kk], smem, self.desc_v(st) + ((kk * 16 * 128) >> 4))
        return o


def run_block(q, k, v, n_head, n_kv_head, h, by, scale, overlap, out):
    n_q, n_kv = q.shape[0], k.shape[0]
    kvh = h // (n_head // n_kv_head)
    n_qt = (n_q + BM - 1) // BM
    q0 = (n_qt - 1 - by) * BM
    pos0 = n_kv - n_q + q0
    kv_end = min(n_kv, pos0 + BM)
    n_tiles = (kv_end + BN - 1) // BN
    smem = Smem()
    smem.tma_load(Q_OFF, q, h * D, q0)
    smem.tma_load(Q_OFF + BOX, q, h * D + 64, q0)

    stage_tile = [-1] * STAGES

    def ensure(j):
        """The producer's loads of tile j into stage j % 2 (the barriers order them; the emulation
        cannot check that, it only needs the stage to hold the tile the consumer reads)."""
        st = j % STAGES
        if stage_tile[st] != j:
            smem.tma_load(K_OFF + st * TILE, k, kvh * D, j * BN)
            smem.tma_load(K_OFF + st * TILE + BOX, k, kvh * D + 64, j * BN)
            smem.tma_load(V_OFF + st * TILE, v, kvh * D, j * BN)
            smem.tma_load(V_OFF + st * TILE + BOX, v, kvh * D + 64, j * BN)
            stage_tile[st] = j

    results = []
    for cw in range(2):
        c = Consumer(cw, pos0, n_kv, scale)
        o = np.zeros((128, 64), np.float32)
        m = [np.full(128, -np.inf, np.float32), np.full(128, -np.inf, np.float32)]
        l = [np.zeros(128, np.float32), np.zeros(128, np.float32)]
        if not overlap:
            for j in range(n_tiles):
                st = j % STAGES
                ensure(j)
                s = c.gemm_qk(smem, st)
                s, corr = c.softmax(s, m, l, j * BN)
                o = c.rescale(o, corr)
                pa = c.p_to_bf16(s)
                o = c.gemm_pv(o, pa, smem, st)
        else:
            ensure(0)
            s = c.gemm_qk(smem, 0)
            s, corr = c.softmax(s, m, l, 0)
            pa = c.p_to_bf16(s)
            for j in range(1, n_tiles):
                st, sp = j % STAGES, (j - 1) % STAGES
                ensure(j)  # stage sp still holds tile j - 1
                s = c.gemm_qk(smem, st)  # S_j ...
                o_after = c.gemm_pv(o, pa, smem, sp)  # ... then O += P_{j-1} V_{j-1}
                s, corr = c.softmax(s, m, l, j * BN)
                o = c.rescale(o_after, corr)
                pa = c.p_to_bf16(s)
            sl = (n_tiles - 1) % STAGES
            o = c.gemm_pv(o, pa, smem, sl)
        results.append((c, o, l))

    # epilogue: O / l → smem (swizzled, in the warpgroup's Q rows) → out
    n_q_out = out.shape[0]
    for c, o, l in results:
        inv = []
        for r in range(2):
            x = quad_sum(l[r])
            inv.append(np.where(x > 0, 1 / np.where(x > 0, x, 1), 0).astype(np.float32))
        so = Q_OFF + c.cw * 64 * 128
        stage = {}
        for j in range(16):
            for r in range(2):
                row = W * 16 + G + 8 * r
                dst = so + (j >> 3) * BOX + row * 128 + (((j & 7) ^ G) << 4) + 4 * Q4
                lo = bf16(o[:, 4 * j + 2 * r] * inv[r])
                hi = bf16(o[:, 4 * j + 2 * r + 1] * inv[r])
                for ti in range(128):
                    a = int(dst[ti])
                    assert a not in stage, "two threads write one address"
                    stage[a] = lo[ti]
                    stage[a + 2] = hi[ti]
        for i in range(64 * 16):
            row, cc = i >> 4, i & 15
            tok = q0 + c.cw * 64 + row
            if tok >= n_q_out:
                continue
            src = so + (cc >> 3) * BOX + row * 128 + (((cc & 7) ^ (row & 7)) << 4)
            for e in range(8):
                out[tok, h * D + cc * 8 + e] = stage[src + 2 * e]


def reference(q, k, v, n_head, n_kv_head, scale):
    n_q, n_kv = q.shape[0], k.shape[0]
    out = np.zeros((n_q, n_head * D))
    for h in range(n_head):
        g = h // (n_head // n_kv_head)
        qh = q[:, h * D:(h + 1) * D].astype(np.float64)
        kh = k[:, g * D:(g + 1) * D].astype(np.float64)
        vh = v[:, g * D:(g + 1) * D].astype(np.float64)
        s = qh @ kh.T * scale
        pos = n_kv - n_q + np.arange(n_q)
        s[np.arange(n_kv)[None, :] > pos[:, None]] = -np.inf
        s -= s.max(1, keepdims=True)
        p = np.exp(s)
        out[:, h * D:(h + 1) * D] = (p @ vh) / p.sum(1, keepdims=True)
    return out


def check(n_head, n_kv_head, n_q, n_kv, overlap, rng):
    q = bf16(rng.uniform(-2, 2, (n_q, n_head * D)).astype(np.float32))
    k = bf16(rng.uniform(-2, 2, (n_kv, n_kv_head * D)).astype(np.float32))
    v = bf16(rng.uniform(-1, 1, (n_kv, n_kv_head * D)).astype(np.float32))
    scale = 1 / np.sqrt(D)
    out = np.full((n_q, n_head * D), np.nan, np.float32)
    n_qt = (n_q + BM - 1) // BM
    for h in range(n_head):
        for by in range(n_qt):
            run_block(q, k, v, n_head, n_kv_head, h, by, scale, overlap, out)
    ref = reference(q, k, v, n_head, n_kv_head, scale)
    if np.isnan(out).any():
        return float("inf")
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def main():
    rng = np.random.default_rng(1)
    cases = [(2, 1, 1, 1), (1, 1, 100, 100), (2, 2, 129, 129), (1, 1, 33, 300), (2, 1, 200, 333), (1, 1, 256, 256),
             (1, 1, 64, 193)]
    bad = 0
    for overlap in (False, True):
        for n_head, n_kv_head, n_q, n_kv in cases:
            err = check(n_head, n_kv_head, n_q, n_kv, overlap, rng)
            ok = err < 1e-2
            bad += not ok
            print(f"{'overlap' if overlap else 'serial ':8} heads {n_head}/{n_kv_head} n_q {n_q:4} n_kv {n_kv:4}: "
                  f"rel-L2 {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
