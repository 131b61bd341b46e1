// fetch_rows on the CPU (fetch.h): attention reads bf16 / FP8 / f32 host
// entries in place; other formats are decoded by the CPU quantizer into the
// row's slot cache (the GPU's assignment), misses only. The hit/miss
// statistics are those a GPU sees.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "core/threads.h"
#include "ops/gather/fetch.h"

namespace kvtier {
namespace {

// RoPE of one head's key at position t, as Rope::apply computes it.
void rope_one(float* k, int D, int64_t t, const float* inv_freq, bool interleaved) {
  const int half = D / 2;
  for (int i = 0; i < half; ++i) {
    const double a = double(t) * inv_freq[i];
    const float c = float(std::cos(a)), s = float(std::sin(a));
    const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const float x0 = k[i0], x1 = k[i1];
    k[i0] = x0 * c - x1 * s;
    k[i1] = x0 * s + x1 * c;
  }
}

QuantSpec with_scale(QuantSpec s, float scale) {
  s.tensor_scale = scale;
  return s;
}

// Selected entries of a row that the previous step's selection also held
// (both ascending, −1 first).
int64_t count_hits(const int32_t* now, const int32_t* prev, int k) {
  int64_t hits = 0;
  int i = 0, j = 0;
  while (i < k && now[i] < 0) ++i;
  while (j < k && prev[j] < 0) ++j;
  while (i < k && j < k) {
    if (now[i] == prev[j]) ++hits, ++i, ++j;
    else if (now[i] < prev[j]) ++i;
    else ++j;
  }
  return hits;
}

}  // namespace

int64_t assign_slots(const int32_t* now, int k, int32_t* prev_sel, int32_t* prev_slot, int32_t* slot_of,
                     std::vector<int32_t>* miss) {
  // A selected token the last step held keeps its slot; the misses take the
  // free slots in ascending order, in selection order (the CUDA assignment).
  // Both selections ascend, so one merge finds the tokens held.
  thread_local std::vector<uint8_t> used;
  used.assign(size_t(k), 0);
  int64_t n_sel = 0;
  miss->clear();
  int i = 0;
  while (i < k && prev_sel[i] < 0) ++i;
  for (int j = 0; j < k; ++j) {
    const int32_t t = now[j];
    slot_of[j] = -1;
    if (t < 0) continue;
    ++n_sel;
    while (i < k && prev_sel[i] < t) ++i;
    if (i < k && prev_sel[i] == t) {
      slot_of[j] = prev_slot[i];
      used[size_t(slot_of[j])] = 1;
    } else {
      miss->push_back(j);
    }
  }
  int free_slot = 0;
  for (const int32_t j : *miss) {
    while (used[size_t(free_slot)]) ++free_slot;
    slot_of[j] = free_slot++;
  }
  std::copy_n(now, k, prev_sel);
  std::copy_n(slot_of, k, prev_slot);
  return n_sel;
}

namespace {

// Token t of row (s, h) decoded into `slot`: K then V, f32 [D] each.
void decode_token(const FetchParams& p, const FetchRows& r, int s, int h, int32_t t, uint8_t* slot,
                  std::vector<float>& kbuf, std::vector<float>& vbuf) {
  const int D = p.head_dim;
  const int64_t W = int64_t(p.n_kv_head) * D;
  const QuantSpec ks = with_scale(p.fmt.spec, p.seq_scales ? p.seq_scales[2 * s] : p.k_scale);
  const QuantSpec vs = with_scale(p.fmt.spec, p.seq_scales ? p.seq_scales[2 * s + 1] : p.v_scale);
  float* ko = reinterpret_cast<float*>(slot);
  float* vo = ko + D;
  const uint8_t* tok = r.host[s] + int64_t(t) * p.tok_bytes;
  if (p.values_only) {
    dequantize(vs, tok + int64_t(h) * p.entry_bytes, 1, D, vo);
    if (r.key_first[s] >= 0 && t >= r.key_first[s]) {
      dequantize(ks, r.kplane[s] + (t - r.key_first[s]) * p.tok_bytes + int64_t(h) * p.entry_bytes, 1, D, ko);
    } else {  // K = RoPE(A[t] · B[:, head h]), the SVD's rebuild
      const uint16_t* a = r.svd_a[s] + int64_t(t) * p.rank;
      const uint16_t* b = r.svd_b[s];
      std::fill(ko, ko + D, 0.0f);
      for (int q = 0; q < p.rank; ++q) {
        const float c = bf16_to_f32(a[q]);
        const uint16_t* bq = b + int64_t(q) * W + int64_t(h) * D;
        for (int d = 0; d < D; ++d) ko[d] += c * bf16_to_f32(bq[d]);
      }
      rope_one(ko, D, t, p.inv_freq, p.interleaved);
    }
    return;
  }
  if (p.layer_wide) {
    const int dim = p.fmt.dim;
    kbuf.resize(size_t(dim));
    vbuf.resize(size_t(dim));
    dequantize(ks, tok, 1, dim, kbuf.data());
    dequantize(vs, tok + p.fmt.bytes, 1, dim, vbuf.data());
    std::copy_n(kbuf.data() + int64_t(h) * D, D, ko);
    std::copy_n(vbuf.data() + int64_t(h) * D, D, vo);
  } else {
    const uint8_t* e = tok + int64_t(h) * p.entry_bytes;
    dequantize(ks, e, 1, D, ko);
    dequantize(vs, e + p.fmt.bytes, 1, D, vo);
  }
  if (p.keys_prerope) rope_one(ko, D, t, p.inv_freq, p.interleaved);
}

}  // namespace

void fetch_rows_cpu(const FetchParams& p, const int32_t* sel, const FetchRows& r, const uint8_t** view_rows,
                    FetchView* view) {
  const int H = p.n_kv_head, D = p.head_dim, K = p.kmax;
  const int64_t n_rows = int64_t(p.n_seq) * H;
  KVT_CHECK(!p.raw || (!p.layer_wide && !p.values_only && !p.keys_prerope),
            "fetch: raw entries must be per-head records with post-RoPE keys");
  KVT_CHECK(p.raw || p.elt == KvElt::f32, "fetch (CPU): decoded entries are f32");
  auto all = [&](int s) { return r.cache_all && r.cache_all[s]; };
  for (int64_t row = 0; row < n_rows; ++row) {
    const int s = int(row / H);
    const int ks = r.kslots[s];
    KVT_CHECK(ks <= K, "fetch: {} slots per row exceed the selection width {}", ks, K);
    const int32_t* now = sel + row * K + (K - ks);
    for (int j = 0; j < K - ks; ++j) KVT_CHECK(sel[row * K + j] < 0, "fetch: row {} selects more than {}", row, ks);
    if (!p.raw) continue;  // counted where the misses are decoded
    int64_t n_sel = 0, misses = 0;
    for (int j = 0; j < ks; ++j) n_sel += now[j] >= 0;
    if (all(s)) {  // a bitmap of the tokens held; a miss is read once
      auto* held = reinterpret_cast<uint32_t*>(r.prev_sel[row]);
      for (int j = 0; j < ks; ++j) {
        const int32_t t = now[j];
        if (t < 0) continue;
        const uint32_t bit = 1u << (t & 31);
        if (!(held[t >> 5] & bit)) ++misses, held[t >> 5] |= bit;
      }
    } else {
      misses = n_sel - count_hits(now, r.prev_sel[row], ks);
      std::copy_n(now, ks, r.prev_sel[row]);
    }
    if (r.counters) {
      r.counters[s][0] += uint64_t(n_sel);
      r.counters[s][1] += uint64_t(misses);
    }
  }
  if (p.raw) {
    for (int64_t row = 0; row < n_rows; ++row)
      view_rows[row] = r.host[row / H] + (row % H) * p.entry_bytes;
    view->rows = view_rows;
    view->tok_stride = p.tok_bytes;
    view->v_offset = p.fmt.bytes;
    view->elt = p.elt;
    view->idx = sel;
    return;
  }
  // Per row: (selected, decoded). Only misses are decoded. cache=all: slot
  // = token, held tokens marked in a bitmap. Otherwise the row's kslots
  // slots persist across steps as on the GPU (assign_slots). The rows'
  // misses are listed first, then decoded over the threads: a batch of one
  // has only a few rows (KV heads) to split.
  std::vector<int64_t> read(size_t(2 * n_rows), 0);
  struct Miss {
    int32_t row, t;
    uint8_t* slot;
  };
  std::vector<Miss> misses;
  std::vector<int32_t> miss;
  for (int64_t row = 0; row < n_rows; ++row) {
    const int s = int(row / H);
    uint8_t* out = r.slots[row];
    int32_t* slot_of = r.slot_of + row * K;
    const int32_t* now = sel + row * K;
    if (auto* held = all(s) ? reinterpret_cast<uint32_t*>(r.prev_sel[row]) : nullptr) {
      for (int j = 0; j < K; ++j) {
        const int32_t t = now[j];
        slot_of[j] = t;
        if (t < 0) continue;
        ++read[size_t(2 * row)];
        const uint32_t bit = 1u << (t & 31);
        if (held[t >> 5] & bit) continue;
        held[t >> 5] |= bit;
        ++read[size_t(2 * row + 1)];
        misses.push_back({int32_t(row), t, out + int64_t(t) * p.slot_bytes});
      }
      continue;
    }
    const int ks = r.kslots[s];
    std::fill(slot_of, slot_of + (K - ks), -1);
    read[size_t(2 * row)] =
        assign_slots(now + (K - ks), ks, r.prev_sel[row], r.prev_slot[row], slot_of + (K - ks), &miss);
    read[size_t(2 * row + 1)] = int64_t(miss.size());
    for (const int32_t j : miss)
      misses.push_back({int32_t(row), now[K - ks + j], out + int64_t(slot_of[K - ks + j]) * p.slot_bytes});
  }
  default_pool().parallel_for(int64_t(misses.size()), 8, [&](int64_t m0, int64_t m1, int) {
    std::vector<float> kbuf, vbuf;
    for (int64_t m = m0; m < m1; ++m) {
      const Miss& x = misses[size_t(m)];
      decode_token(p, r, x.row / H, x.row % H, x.t, x.slot, kbuf, vbuf);
    }
  });
  for (int64_t row = 0; row < n_rows && r.counters; ++row) {
    r.counters[row / H][0] += uint64_t(read[size_t(2 * row)]);
    r.counters[row / H][1] += uint64_t(read[size_t(2 * row + 1)]);
  }
  for (int64_t row = 0; row < n_rows; ++row) view_rows[row] = r.slots[row];
  view->rows = view_rows;
  view->tok_stride = p.slot_bytes;
  view->v_offset = int64_t(D) * 4;
  view->elt = KvElt::f32;
  view->idx = r.slot_of;
}

// cache=all at the start of decode: the prompt's tokens decoded into their
// slots, in order, and marked held.
void fetch_fill_cpu(const FetchParams& p, const FetchRows& r, const int64_t* fill_n) {
  const int H = p.n_kv_head;
  const int64_t n_rows = int64_t(p.n_seq) * H;
  if (p.raw) {  // raw entries are read in place: nothing to hold
    for (int64_t row = 0; row < n_rows; ++row) {
      const int s = int(row / H);
      if (!r.cache_all || !r.cache_all[s]) continue;
      auto* held = reinterpret_cast<uint32_t*>(r.prev_sel[row]);
      for (int64_t t = 0; t < fill_n[s]; ++t) held[t >> 5] |= 1u << (t & 31);
    }
    return;
  }
  for (int64_t row = 0; row < n_rows; ++row) {
    const int s = int(row / H), h = int(row % H);
    if (!r.cache_all || !r.cache_all[s]) continue;
    auto* held = reinterpret_cast<uint32_t*>(r.prev_sel[row]);
    default_pool().parallel_for(fill_n[s], 256, [&](int64_t t0, int64_t t1, int) {
      std::vector<float> kbuf, vbuf;
      for (int64_t t = t0; t < t1; ++t) decode_token(p, r, s, h, int32_t(t), r.slots[row] + t * p.slot_bytes, kbuf, vbuf);
    });
    for (int64_t t = 0; t < fill_n[s]; ++t) held[t >> 5] |= 1u << (t & 31);
  }
}

// The streamed prefill's read: tokens [t0, t1) decoded into dense rows.
void fetch_dense_cpu(const FetchParams& p, const FetchRows& r, int64_t t0, int64_t t1, float* k_out, float* v_out) {
  const int H = p.n_kv_head, D = p.head_dim;
  const int64_t W = int64_t(H) * D;
  KVT_CHECK(!p.values_only || r.prefill_kpre, "fetch_dense: shadowkv's prefill needs the pre-RoPE keys");
  KVT_CHECK(!p.layer_wide || p.fmt.dim == W, "fetch_dense: layer-wide records of {} values for {} KV dims",
            p.fmt.dim, W);
  const QuantSpec ks = with_scale(p.fmt.spec, p.seq_scales ? p.seq_scales[0] : p.k_scale);
  const QuantSpec vs = with_scale(p.fmt.spec, p.seq_scales ? p.seq_scales[1] : p.v_scale);
  default_pool().parallel_for(t1 - t0, 64, [&](int64_t i0, int64_t i1, int) {
    std::vector<float> slot(size_t(2 * D)), kbuf, vbuf;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = t0 + i;
      float* krow = k_out + i * W;
      float* vrow = v_out + i * W;
      if (p.values_only) {
        const float* kp = reinterpret_cast<const float*>(r.prefill_kpre) + t * W;
        std::copy_n(kp, W, krow);
        for (int h = 0; h < H; ++h) {
          dequantize(vs, r.host[0] + t * p.tok_bytes + int64_t(h) * p.entry_bytes, 1, D, vrow + int64_t(h) * D);
          rope_one(krow + int64_t(h) * D, D, t, p.inv_freq, p.interleaved);
        }
        continue;
      }
      if (p.layer_wide) {  // one record holds every head: decoded once
        const uint8_t* tok = r.host[0] + t * p.tok_bytes;
        dequantize(ks, tok, 1, int(W), krow);
        dequantize(vs, tok + p.fmt.bytes, 1, int(W), vrow);
        if (p.keys_prerope)
          for (int h = 0; h < H; ++h) rope_one(krow + int64_t(h) * D, D, t, p.inv_freq, p.interleaved);
        continue;
      }
      for (int h = 0; h < H; ++h) {
        decode_token(p, r, 0, h, int32_t(t), reinterpret_cast<uint8_t*>(slot.data()), kbuf, vbuf);
        std::copy_n(slot.data(), D, krow + int64_t(h) * D);
        std::copy_n(slot.data() + D, D, vrow + int64_t(h) * D);
      }
    }
  });
}

}  // namespace kvtier
