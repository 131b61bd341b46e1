// CPU decode attention: tasks of (sequence, split, KV heads) on the thread
// pool, each through the row kernel of the machine's ISA
// (decode_attn_kernels.h: AVX-512, AVX2, or scalar for head dims no vector
// kernel takes), K/V read as stored (bf16 and FP8 widened in registers, f32
// as they are). Then the LSE merge.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/half.h"
#include "core/status.h"
#include "core/threads.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/decode_attn/decode_attn_kernels.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {

void decode_attn_cpu(const DecodeAttnParams& p, const float* q, const uint8_t* const* rows, const int32_t* idx,
                     float* part_out, float* part_lse);
void attn_merge_cpu(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse, float* out,
                    float* lse);

namespace {

void check_params(const DecodeAttnParams& p) {
  KVT_CHECK(p.n_kv_head > 0 && p.n_head > 0 && p.n_head % p.n_kv_head == 0,
            "decode_attn: n_head {} is not a positive multiple of n_kv_head {}", p.n_head, p.n_kv_head);
  KVT_CHECK(p.head_dim > 0, "decode_attn: head_dim {} must be positive", p.head_dim);
  KVT_CHECK(p.n_seq >= 0 && (p.n_tok || p.n_tok_fixed >= 0), "decode_attn: n_seq {} and n_tok {} must not be negative",
            p.n_seq, p.n_tok_fixed);
  KVT_CHECK(p.n_split >= 1 && p.part0 >= 0, "decode_attn: n_split {} (>= 1) and part0 {} (>= 0)", p.n_split,
            p.part0);
  KVT_CHECK(p.elt == KvElt::bf16 || p.elt == KvElt::fp8 || p.elt == KvElt::f32,
            "decode_attn: unknown element type {}", int(p.elt));
}

}  // namespace

namespace attn_kernels {
namespace {

float load_scalar(const RowJob& j, const uint8_t* row, int d) {
  if (j.f32) {
    float x;
    std::memcpy(&x, row + 4 * d, 4);
    return x;
  }
  if (j.fp8) return e4m3_to_f32(row[d]);
  uint16_t b;
  std::memcpy(&b, row + 2 * d, 2);
  return bf16_to_f32(b);
}

// Two passes over the slots (scores and max, then exp and accumulation),
// f32 arithmetic; what the vector kernels compute, without the tiling.
void row_scalar_one(const RowJob& j) {
  const int D = j.head_dim;
  for (int h = 0; h < j.n_qh; ++h) {
    const float* q = j.q + int64_t(h) * D;
    float* out = j.out + int64_t(h) * D;
    std::fill(out, out + D, 0.f);
    float m = -INFINITY;
    for (int64_t e = 0; e < j.n_tok; ++e) {
      const int64_t slot = j.idx ? j.idx[e] : e;
      if (slot < 0) continue;
      const uint8_t* kr = j.k + slot * j.tok_stride;
      float s = 0;
      for (int d = 0; d < D; ++d) s += q[d] * load_scalar(j, kr, d);
      m = std::max(m, s * j.scale);
    }
    float sum = 0;
    for (int64_t e = 0; e < j.n_tok && m > -INFINITY; ++e) {
      const int64_t slot = j.idx ? j.idx[e] : e;
      if (slot < 0) continue;
      const uint8_t* kr = j.k + slot * j.tok_stride;
      const uint8_t* vr = j.v + slot * j.tok_stride;
      float s = 0;
      for (int d = 0; d < D; ++d) s += q[d] * load_scalar(j, kr, d);
      const float w = std::exp(s * j.scale - m);
      sum += w;
      for (int d = 0; d < D; ++d) out[d] += w * load_scalar(j, vr, d);
    }
    const float inv = sum > 0 ? 1.f / sum : 0.f;
    for (int d = 0; d < D; ++d) out[d] *= inv;
    j.max[h] = sum > 0 ? m : -INFINITY;
    j.sum[h] = sum;
  }
}

}  // namespace

void row_scalar(const RowJob* jobs, int n_jobs) {
  for (int i = 0; i < n_jobs; ++i) row_scalar_one(jobs[i]);
}

RowKernel row_kernel_for(CpuPath path, int head_dim) {
  if (path == CpuPath::avx512 && head_dim % 16 == 0 && cpu_supports(CpuPath::avx512)) return row_avx512;
  if (head_dim % 8 == 0) return row_avx2;
  return row_scalar;
}

void decode_attn_with(RowKernel kernel, const DecodeAttnParams& p, const float* q, const uint8_t* const* rows,
                      const int32_t* idx, float* part_out, float* part_lse) {
  check_params(p);
  const int G = p.n_head / p.n_kv_head, D = p.head_dim;
  const int64_t n_qh = int64_t(p.n_seq) * p.n_head;
  const int64_t n_floats = scratch_floats(G, D) + 2 * int64_t(G) + 16;  // a job's scratch, max, sum
  // A task: KV heads of one sequence over one split's token range, run
  // together by the kernel. All of them, unless the (sequence, split) pairs
  // are fewer than the threads: then the heads divide among them.
  const int64_t groups = int64_t(p.n_seq) * p.n_split, n_threads = default_pool().n_threads();
  const int64_t ways = groups >= n_threads ? 1 : (n_threads + groups - 1) / groups;
  const int per_task = int(std::min<int64_t>(kMaxRowJobs, (p.n_kv_head + ways - 1) / ways));
  const int64_t tasks_per_split = (p.n_kv_head + per_task - 1) / per_task;
  const int64_t n_tasks = int64_t(p.n_seq) * p.n_split * tasks_per_split;
  default_pool().parallel_for(n_tasks, 1, [&](int64_t a, int64_t b, int) {
    thread_local std::vector<float> scratch;
    const int64_t stride = (n_floats + 15) / 16 * 16;  // keeps every job's scratch 64-byte aligned
    if (int64_t(scratch.size()) < stride * per_task + 16) scratch.resize(size_t(stride * per_task + 16));
    // 64-byte aligned start (the kernels use unaligned loads; alignment keeps
    // the key tile on cache-line boundaries).
    float* base = scratch.data();
    base += (16 - (reinterpret_cast<uintptr_t>(base) / 4) % 16) % 16;
    RowJob jobs[kMaxRowJobs];
    for (int64_t task = a; task < b; ++task) {
      const int64_t seq = task / (p.n_split * tasks_per_split);
      const int split = int(task / tasks_per_split % p.n_split);
      const int kvh0 = int(task % tasks_per_split) * per_task;
      const int n_jobs = std::min(per_task, p.n_kv_head - kvh0);
      const int64_t n = p.n_tok ? p.n_tok[seq * p.n_tok_stride] : p.n_tok_fixed;
      const int64_t chunk = (n + p.n_split - 1) / p.n_split;
      const int64_t e0 = std::min<int64_t>(n, int64_t(split) * chunk);
      const int64_t e1 = std::min<int64_t>(n, e0 + chunk);
      const int64_t part = p.part0 + split;
      for (int i = 0; i < n_jobs; ++i) {
        const int64_t r = seq * p.n_kv_head + kvh0 + i;
        const int64_t qh0 = seq * p.n_head + int64_t(kvh0 + i) * G;  // first query head of the group
        float* js = base + i * stride;
        RowJob& j = jobs[i];
        j = RowJob();
        j.q = q + qh0 * D;
        j.n_qh = G;
        j.head_dim = D;
        j.scale = p.scale;
        j.fp8 = p.elt == KvElt::fp8;
        j.f32 = p.elt == KvElt::f32;
        j.k = rows[r];
        j.v = rows[r] + p.v_offset;
        j.tok_stride = p.tok_stride;
        j.idx = idx ? idx + r * p.idx_stride + e0 : nullptr;
        // Without idx the entries are the slots themselves: shift the row base.
        if (!idx) {
          j.k += e0 * p.tok_stride;
          j.v += e0 * p.tok_stride;
        }
        j.n_tok = e1 - e0;
        j.out = part_out + (part * n_qh + qh0) * D;
        j.scratch = js;
        j.max = js + scratch_floats(G, D);
        j.sum = j.max + G;
      }
      kernel(jobs, n_jobs);
      for (int i = 0; i < n_jobs; ++i) {
        const int64_t qh0 = seq * p.n_head + int64_t(kvh0 + i) * G;
        float* lse = part_lse + part * n_qh + qh0;
        for (int g = 0; g < G; ++g) lse[g] = jobs[i].sum[g] > 0 ? jobs[i].max[g] + std::log(jobs[i].sum[g]) : -INFINITY;
      }
    }
  });
}

}  // namespace attn_kernels

void decode_attn_cpu(const DecodeAttnParams& p, const float* q, const uint8_t* const* rows, const int32_t* idx,
                     float* part_out, float* part_lse) {
  check_params(p);
  attn_kernels::decode_attn_with(attn_kernels::row_kernel_for(cpu_path(), p.head_dim), p, q, rows, idx, part_out,
                                 part_lse);
}

void attn_merge_cpu(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse, float* out,
                    float* lse) {
  KVT_CHECK(n_part >= 1 && head_dim > 0, "attn_merge: n_part {} and head_dim {} must be positive", n_part,
            head_dim);
  for (int64_t i = 0; i < n_qh; ++i) {
    float m = -INFINITY;
    for (int j = 0; j < n_part; ++j) m = std::max(m, part_lse[j * n_qh + i]);
    float* o = out + i * head_dim;
    std::fill(o, o + head_dim, 0.f);
    float sum = 0;
    if (m > -INFINITY)
      for (int j = 0; j < n_part; ++j) {
        const float w = std::exp(part_lse[j * n_qh + i] - m);
        if (w == 0.f) continue;
        sum += w;
        const float* po = part_out + (j * n_qh + i) * head_dim;
        for (int c = 0; c < head_dim; ++c) o[c] += w * po[c];
      }
    for (int c = 0; c < head_dim && sum > 0; ++c) o[c] /= sum;
    if (lse) lse[i] = sum > 0 ? m + std::log(sum) : -INFINITY;
  }
}

}  // namespace kvtier
