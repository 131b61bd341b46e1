// decode_attn_records on mma.sync tensor cores (record_attn.h): the layout of
// decode_attn_kernel (one block of 4 warps per (row, split), interleaved
// 16-token tiles, one online softmax per warp, the GQA group as the rows of
// the A operand), but a tile is the tokens' raw store entries, copied by
// cp.async (kStages deep) and used in the rotated domain:
// - the query is rotated once per block (c·H·(s ⊙ q), shared memory);
// - K's B fragments come straight from the code bytes: a lane's fragment is
//   one (dim 2i, 2i+1) pair, i.e. one code, looked up in the grid as bf16x2;
// - each score is scaled by its token's σ_k, each probability by its σ_v
//   (the softmax sums take it unscaled);
// - V's B fragments come from the code bytes too: a lane looks up 8 codes of
//   each of its 4 tokens and pairs the tokens' halves (the output's dims come
//   out permuted, undone when it is written);
// - the grid sits in shared memory once per lane (no bank conflicts);
// - the merged output is rotated back once (s ⊙ (c·H·o)).
// A token costs head_dim code bytes and two scales of memory traffic: no
// decoded K|V is written or read.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda_backend.h"
#include "backend/cuda_mma.cuh"
#include "ops/decode_attn/decode_attn_tile.cuh"
#include "ops/decode_attn/record_attn.h"
#include "ops/quant/quant_dev.cuh"

namespace kvtier::cuda {
namespace {

using namespace mma;

constexpr int kWarps = 4, kThreads = kWarps * 32, kTile = 16;
// Blocks per SM: 168 registers a thread and ~74 KB of shared memory (head_dim
// 128) fit three. (__launch_bounds__ says 2: asked for 3, ptxas spills.)
constexpr int kBlocksPerSm = 3;
// Tiles of entries in flight per warp: the kernel is bound by the latency of
// its scattered reads (a token is 144 bytes), so each warp keeps kStages − 1
// tiles coming while it computes one.
constexpr int kStages = 4;
constexpr int kGridWords = 256;  // byte codes: grid points as bf16x2
constexpr int kGridCopies = 32;  // copy l of point c at [c · 32 + l]: lane l's lookups hit bank l
constexpr float kLog2e = 1.4426950408889634f;

struct Args {
  DecodeAttnParams a;
  int64_t entry_bytes = 0, tok_bytes = 0;
  int v_rec = 0;                 // V's record within the entry (the K record's bytes)
  int meta = 0;                  // σ within a record (after the codes)
  const float* grid = nullptr;   // [grid_size][2] f32
  const float* signs = nullptr;  // [head_dim] ±1, or null
  float hscale = 1.f;
  int grid_size = 0;
  unsigned long long* const* counters = nullptr;
};

// Shared memory before the warps' areas: the grid's copies, then [G][D] f32
// for the query's and the output's rotations.
template <int D>
constexpr int head_bytes() {
  return kGridWords * kGridCopies * 4 + 8 * D * 4;
}

// The unnormalized Hadamard transform of G rows of D floats in shared memory
// (natural order, as the HIGGS decoder's butterflies); every thread calls it.
template <int G, int D>
__device__ __forceinline__ void hadamard_rows(float* y) {
#pragma unroll
  for (int hh = 1; hh < D; hh *= 2) {
    for (int e = threadIdx.x; e < G * D / 2; e += kThreads) {
      const int gg = e / (D / 2), k = e % (D / 2);
      const int j = gg * D + (k / hh) * 2 * hh + (k % hh);
      const float a = y[j], b = y[j + hh];
      y[j] = a + b;
      y[j + hh] = a - b;
    }
    __syncthreads();
  }
}

__device__ __forceinline__ float bf16_bits_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

// Code bytes 4h .. 4h + 3 from shared memory at p (4-byte aligned less
// sh / 8 bytes), as one word.
__device__ __forceinline__ uint32_t code_word(const unsigned char* p, int sh, int h) {
  const auto* w = reinterpret_cast<const uint32_t*>(p - sh / 8) + h;
  return __funnelshift_r(w[0], w[1], sh);
}

template <int G, int D>
__global__ void __launch_bounds__(kThreads, 2)
    record_attn_kernel(Args A, const __nv_bfloat16* __restrict__ q, const uint8_t* const* __restrict__ host,
                       const int32_t* __restrict__ sel, float* __restrict__ part_out, float* __restrict__ part_lse) {
  const DecodeAttnParams& p = A.a;
  extern __shared__ __align__(128) unsigned char smem[];
  uint32_t* grid2 = reinterpret_cast<uint32_t*>(smem);
  float* rot = reinterpret_cast<float*>(smem + kGridWords * kGridCopies * 4);  // [G][D]
  const int EB = int(A.entry_bytes);
  const int warp_bytes = kStages * kTile * EB + 16;
  unsigned char* areas = smem + head_bytes<D>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tig = lane & 3;
  unsigned char* ws = areas + warp * warp_bytes;  // [kStages][kTile] entries, the stages' masks
  const int64_t r = blockIdx.y;
  const int seq = int(r / p.n_kv_head), kvh = int(r % p.n_kv_head);
  const float qscale = p.scale * kLog2e;

  // The grid as bf16 pairs; codes past the grid read its last point (as the
  // decoder clamps).
  for (int i = threadIdx.x; i < kGridWords * kGridCopies; i += kThreads) {
    const int c = min(i / kGridCopies, A.grid_size - 1);
    grid2[i] = pack_bf16(A.grid[2 * c], A.grid[2 * c + 1]);
  }
  const uint32_t* gl = grid2 + lane;  // this lane's copy: point c at gl[c · kGridCopies]
  // The rotated query of each head of the group.
  for (int e = threadIdx.x; e < G * D; e += kThreads) {
    const int gg = e / D, d = e % D;
    float v = __bfloat162float(q[(int64_t(seq) * p.n_head + kvh * G + gg) * D + d]);
    if (A.signs) v *= A.signs[d];
    rot[e] = v;
  }
  __syncthreads();
  hadamard_rows<G, D>(rot);
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const float* qh = rot + (g < G ? g : 0) * D + kk * 16 + tig * 2;
    qf[kk][0] = g < G ? pack_bf16(qh[0] * A.hscale, qh[1] * A.hscale) : 0u;
    qf[kk][2] = g < G ? pack_bf16(qh[8] * A.hscale, qh[9] * A.hscale) : 0u;
    qf[kk][1] = qf[kk][3] = 0u;
  }

  const int64_t n_row = p.n_tok_fixed;
  const int64_t chunk = (n_row + p.n_split - 1) / p.n_split;
  const int64_t j0 = int64_t(blockIdx.x) * chunk, j1 = min(n_row, j0 + chunk);
  const int n_tiles = j1 > j0 ? int((j1 - j0 + kTile - 1) / kTile) : 0;
  const uint8_t* base = host[seq] + int64_t(kvh) * A.entry_bytes;
  const int32_t* ir = sel + r * p.idx_stride;
  const int chunks = EB >> 4, total = kTile * chunks;

  // Tile `t`'s token id of lane l < kTile (−1: none). A tile's ids are
  // loaded a turn before its copies are issued, so that their latency hides
  // behind a tile's products.
  auto load_tok = [&](int t) -> int32_t {
    const int64_t jt = j0 + int64_t(t) * kTile;
    return t < n_tiles && lane < kTile && jt + lane < j1 ? __ldg(ir + jt + lane) : -1;
  };
  // Issues the copies of the entries of the tile whose ids are `tok` into
  // stage `st`; returns its valid-token mask.
  auto issue = [&](int32_t tok, int st) -> uint32_t {
    const uint32_t valid = __ballot_sync(0xffffffffu, tok >= 0);
    unsigned char* dst = ws + st * kTile * EB;
    for (int c0 = 0; c0 < total; c0 += 32) {
      const int c = c0 + lane;
      const int tk = min(c / chunks, kTile - 1), cc = c % chunks;
      const int64_t tid = __shfl_sync(0xffffffffu, tok, tk);
      if (c < total) cp_async16(dst + tk * EB + cc * 16, base + (tid >= 0 ? tid : 0) * A.tok_bytes + cc * 16, tid >= 0);
    }
    return valid;
  };

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_row[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.f, 0.f};
  auto* masks = reinterpret_cast<uint32_t*>(ws + kStages * kTile * EB);  // [kStages]
  // V's B fragments: lane (g, tig) takes codes NP·g .. NP·g + NP − 1 of the
  // V records of tokens 2tig, 2tig + 1 (k rows of b0) and 2tig + 8, 2tig + 9
  // (b1). Code i = NP·g + jp holds dims 2i, 2i + 1: they become column g of
  // n-tiles 2jp and 2jp + 1, so n-tile j's column c is dim (D/8)·c + j.
  constexpr int NP = D / 16;
  const int v_at = A.v_rec + NP * g, v_sh = 8 * (v_at & 3);

  // Tile t of this warp's i-th turn lives in stage i % kStages; a group is
  // committed per tile slot, issued or not, so that the wait counts alike.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    const int t = warp + st * kWarps;
    if (t < n_tiles) {
      const uint32_t v = issue(load_tok(t), st);
      if (lane == 0) masks[st] = v;
    }
    cp_async_commit();
  }
  unsigned n_attended = 0;
  int32_t tok_next = load_tok(warp + (kStages - 1) * kWarps);  // the ids of the tile issued next
  for (int t = warp, i = 0; t < n_tiles; t += kWarps, ++i) {
    const int tn = t + (kStages - 1) * kWarps, sn = (i + kStages - 1) % kStages;
    const int32_t tok = tok_next;
    tok_next = load_tok(tn + kWarps);
    if (tn < n_tiles) {
      const uint32_t v = issue(tok, sn);
      if (lane == 0) masks[sn] = v;
    }
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint32_t valid = masks[i % kStages];
    n_attended += __popc(valid);
    const unsigned char* raw = ws + (i % kStages) * kTile * EB;
    // S = Q' K'ᵀ, K' from the code bytes: lane (g, tig) needs codes kk·8 + tig
    // and kk·8 + 4 + tig of token n·8 + g.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const unsigned char* kr = raw + (n * 8 + g) * EB;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint2 w = *reinterpret_cast<const uint2*>(kr + kk * 8);
        mma16816(s[n], qf[kk], gl[((w.x >> (8 * tig)) & 0xffu) * kGridCopies],
                 gl[((w.y >> (8 * tig)) & 0xffu) * kGridCopies]);
      }
    }
    // Each key's σ_k, σ_v: keys n·8 + tig·2 + (e & 1).
    float sk[2][2], sv[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const unsigned char* er = raw + (n * 8 + tig * 2 + b) * EB;
        sk[n][b] = bf16_bits_f32(*reinterpret_cast<const uint16_t*>(er + A.meta)) * qscale;
        sv[n][b] = bf16_bits_f32(*reinterpret_cast<const uint16_t*>(er + A.v_rec + A.meta));
      }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n * 8 + tig * 2 + (e & 1);
        s[n][e] = (valid >> key) & 1u ? s[n][e] * sk[n][e & 1] : -INFINITY;
      }
    decode_tile::online_softmax<D>(s, m_row, l_row, o);
    // O' += (P·σ_v) V' (the sums above took P unscaled).
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= sv[n][e & 1];
    uint32_t hi[4], lo[4];
    decode_tile::p_fragments(s, hi, lo);
    uint32_t cw[4];  // codes NP·g + (jp & ~3) .. + 3 of tokens 2tig, 2tig + 1, 2tig + 8, 2tig + 9
#pragma unroll
    for (int jp = 0; jp < NP; ++jp) {
      if ((jp & 3) == 0) {
#pragma unroll
        for (int u = 0; u < 4; ++u) cw[u] = code_word(raw + (2 * tig + (u & 1) + 8 * (u >> 1)) * EB + v_at, v_sh, jp / 4);
      }
      uint32_t pt[4];  // the four tokens' points of code NP·g + jp
#pragma unroll
      for (int u = 0; u < 4; ++u) pt[u] = gl[((cw[u] >> (8 * (jp & 3))) & 0xffu) * kGridCopies];
      const uint32_t b0e = __byte_perm(pt[0], pt[1], 0x5410), b0o = __byte_perm(pt[0], pt[1], 0x7632);
      const uint32_t b1e = __byte_perm(pt[2], pt[3], 0x5410), b1o = __byte_perm(pt[2], pt[3], 0x7632);
      mma16816(o[2 * jp], hi, b0e, b1e);
      mma16816(o[2 * jp + 1], hi, b0o, b1o);
      mma16816(o[2 * jp], lo, b0e, b1e);
      mma16816(o[2 * jp + 1], lo, b0o, b1o);
    }
    __syncwarp();  // this stage is refilled next
  }
  cp_async_wait<0>();
  if (A.counters && lane == 0 && n_attended) atomicAdd(A.counters[seq], (unsigned long long)n_attended);
  // Merge the 4 warps through shared memory (the warps' areas), into rot.
  __syncthreads();
  const int64_t n_qh = int64_t(p.n_seq) * p.n_head;
  const int64_t part = p.part0 + blockIdx.x;
  decode_tile::merge_warps<G, D, kWarps>(reinterpret_cast<float*>(areas), m_row, l_row, o,
                                         [&](int gg, int d, float v, float lse) {
                                           rot[gg * D + (D / 8) * (d % 8) + d / 8] = v;  // dims unpermuted
                                           if (d == 0)
                                             part_lse[part * n_qh + int64_t(seq) * p.n_head + kvh * G + gg] = lse;
                                         });
  __syncthreads();
  hadamard_rows<G, D>(rot);
  for (int e = threadIdx.x; e < G * D; e += kThreads) {
    const int gg = e / D, d = e % D;
    const int64_t qh = int64_t(seq) * p.n_head + kvh * G + gg;
    float v = rot[e] * A.hscale;
    if (A.signs) v *= A.signs[d];
    part_out[(part * n_qh + qh) * D + d] = v;
  }
}

template <int G, int D>
void launch(const Args& A, const void* q, const uint8_t* const* host, const int32_t* sel, float* po, float* pl,
            cudaStream_t s) {
  const dim3 grid{unsigned(A.a.n_split), unsigned(A.a.n_seq * A.a.n_kv_head)};
  // The warps' areas also hold merge_warps' (2 + D)·kWarps·G floats at the end.
  const int areas = std::max(kWarps * int(kStages * kTile * A.entry_bytes + 16), (2 + D) * kWarps * G * 4);
  const int smem = head_bytes<D>() + areas;
  static int configured = 0;  // the largest dynamic shared memory set for this instance
  if (smem > configured) {
    KVT_CUDA_CHECK(cudaFuncSetAttribute(record_attn_kernel<G, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = smem;
  }
  record_attn_kernel<G, D><<<grid, kThreads, smem, s>>>(A, static_cast<const __nv_bfloat16*>(q), host, sel, po, pl);
  KVT_CUDA_LAUNCH_CHECK("record_attn_kernel");
}

template <int D>
void dispatch_group(const Args& A, const void* q, const uint8_t* const* host, const int32_t* sel, float* po, float* pl,
                    cudaStream_t s) {
  switch (A.a.n_head / A.a.n_kv_head) {
    case 1: return launch<1, D>(A, q, host, sel, po, pl, s);
    case 2: return launch<2, D>(A, q, host, sel, po, pl, s);
    case 3: return launch<3, D>(A, q, host, sel, po, pl, s);
    case 4: return launch<4, D>(A, q, host, sel, po, pl, s);
    case 5: return launch<5, D>(A, q, host, sel, po, pl, s);
    case 6: return launch<6, D>(A, q, host, sel, po, pl, s);
    case 7: return launch<7, D>(A, q, host, sel, po, pl, s);
    default: return launch<8, D>(A, q, host, sel, po, pl, s);
  }
}

}  // namespace

int record_attn_splits(int64_t n_rows, int64_t n_tok) {
  const int64_t want = int64_t(device_info().n_sm) * kBlocksPerSm / std::max<int64_t>(1, n_rows);
  const int64_t cap = n_tok / kRecordSplitTokens;
  return int(std::max<int64_t>(1, std::min(want, cap)));
}

void decode_attn_records(const Exec& x, const RecordAttnParams& p, const void* q_bf16, const uint8_t* const* host,
                         const int32_t* sel, float* part_out, float* part_lse) {
  const DecodeAttnParams& a = p.attn;
  KVT_CHECK(a.n_split >= 1, "decode_attn_records: n_split {} < 1", a.n_split);
  KVT_CHECK(p.entry_bytes % 16 == 0 && p.tok_bytes % 16 == 0 && p.entry_bytes >= 2 * p.fmt.bytes,
            "decode_attn_records: entries of {} bytes (tokens of {}) for "
            "records of {}: 16-byte multiples holding K|V",
            p.entry_bytes, p.tok_bytes, p.fmt.bytes);
  if (a.n_seq == 0) return;
  const DevFormat f = make_dev_format(p.fmt);
  Args A;
  A.a = a;
  A.entry_bytes = p.entry_bytes;
  A.tok_bytes = p.tok_bytes;
  A.v_rec = int(f.bytes);
  A.meta = int(f.meta_offset);
  A.grid = f.grid;
  A.signs = f.signs;
  A.hscale = f.hadamard_scale;
  A.grid_size = f.grid_size;
  A.counters = p.counters;
  const cudaStream_t s = static_cast<cudaStream_t>(x.stream);
  if (a.head_dim == 64)
    dispatch_group<64>(A, q_bf16, host, sel, part_out, part_lse, s);
  else
    dispatch_group<128>(A, q_bf16, host, sel, part_out, part_lse, s);
}

}  // namespace kvtier::cuda
