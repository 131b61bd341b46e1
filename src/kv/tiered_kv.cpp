// TieredSeq (tiered_kv.h): its buffers and their growth, the formats and
// write parameters of its tiers, the start of decode, its accounting; and
// TieredKv over it. The prefill (appends, attention) is in
// tiered_prefill.cpp, ShadowKV's index in shadowkv_build.cpp.
#include "kv/tiered_kv.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/half.h"
#include "core/status.h"
#include "kv/decode_batch.h"
#include "ops/gather/fetch.h"
#include "ops/kv_append/kv_write.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

int64_t pad16(int64_t b) { return (b + 15) / 16 * 16; }
int act_bytes(DeviceKind d) { return d == DeviceKind::cuda ? 2 : 4; }

// Where upload_tables puts a grid's ‖c‖²/2 and its cell table, in floats.
size_t norms_at(const QuantSpec& s) { return (size_t(s.grid_size) * s.grid_dim + 3) / 4 * 4; }
size_t cells_at(const QuantSpec& s) { return norms_at(s) + (size_t(s.grid_size) + 3) / 4 * 4; }

// Uploads a HIGGS spec's grid (its points, their ‖c‖²/2, its cell table, each
// 16-byte aligned) and signs (none for other formats).
void upload_tables(const Device& dev, const QuantSpec& s, int dim, Buffer& grid, Buffer& signs) {
  if (s.kind != QuantKind::higgs) return;
  const HiggsGrid& g = higgs_grid_of(s);
  grid = dev.alloc((cells_at(s) + g.cells.size()) * 4);
  copy(dev.exec(), grid.data(), g.points.data(), g.points.size() * 4);
  copy(dev.exec(), grid.data<float>() + norms_at(s), g.half_norm2.data(), g.half_norm2.size() * 4);
  if (!g.cells.empty()) copy(dev.exec(), grid.data<float>() + cells_at(s), g.cells.data(), g.cells.size() * 4);
  if (s.random_signs) {
    const int G = resolved_group(s, dim);
    std::vector<float> sg(static_cast<size_t>(G));
    hadamard_signs(s.sign_seed, G, sg.data());
    signs = dev.alloc(sg.size() * 4);
    copy(dev.exec(), signs.data(), sg.data(), signs.bytes());
  }
  sync(dev.exec());  // the vectors above are freed on return
}

const float* half_norms(const QuantSpec& s, const Buffer& grid) {
  if (s.kind != QuantKind::higgs || !grid) return nullptr;
  return grid.data<float>() + norms_at(s);
}
const uint32_t* cell_table(const QuantSpec& s, const Buffer& grid) {
  if (s.kind != QuantKind::higgs || !grid || higgs_grid_of(s).cells.empty()) return nullptr;
  return reinterpret_cast<const uint32_t*>(grid.data<float>() + cells_at(s));
}

// A record format of spec s whose tables upload_tables put in grid and signs.
RecordFormat record_format(const QuantSpec& s, int dim, int64_t bytes, const Buffer& grid, const Buffer& signs) {
  RecordFormat f;
  f.spec = s;
  f.dim = dim;
  f.bytes = bytes;
  f.grid = grid.data<float>();
  f.signs = signs.data<float>();
  f.half_norm2 = half_norms(s, grid);
  f.cells = cell_table(s, grid);
  return f;
}

}  // namespace

TieredSeq::TieredSeq(const KvPlan& plan, const Device& dev) : plan_(plan), dev_(dev), x_(dev.exec()) {
  static std::atomic<uint64_t> next_uid{1};
  uid_ = next_uid.fetch_add(1);
  KVT_CHECK(!plan.dense && plan.device == dev.kind(), "tiered cache: plan for {} on {}", to_string(plan.policy),
            device_name(plan.device));
  const KvGeometry& g = plan.geometry;
  layers_.resize(size_t(g.n_layer));
  n_.assign(size_t(g.n_layer), 0);
  upload_tables(dev, plan.index_spec, g.head_dim, grid_, signs_);
  upload_tables(dev, plan.meta_spec, g.head_dim, meta_grid_, meta_signs_);
  upload_tables(dev, plan.host_spec, plan.host_dim, host_grid_, host_signs_);
  if (plan.index == IndexLayout::higgs2_planar && plan.index_spec.random_signs && !signs_) {
    std::vector<float> sg(static_cast<size_t>(g.head_dim));
    hadamard_signs(plan.index_spec.sign_seed, g.head_dim, sg.data());
    signs_ = dev.alloc(sg.size() * 4);
    copy(x_, signs_.data(), sg.data(), signs_.bytes());
    sync(x_);
  }
  KVT_CHECK(!g.rope_inv_freq.empty() || (!plan.policy.keys_prerope && plan.host != HostLayout::values_only),
            "kv policy {}: rebuilding post-RoPE keys needs the model's RoPE table (KvGeometry::rope_inv_freq)",
            to_string(plan.policy));
  if (!g.rope_inv_freq.empty()) {
    inv_freq_ = dev.alloc(g.rope_inv_freq.size() * 4);
    copy(x_, inv_freq_.data(), g.rope_inv_freq.data(), inv_freq_.bytes());
    sync(x_);
  }
  counters_ = dev.alloc(16);
  fill(x_, counters_.data(), 0, 16);
  scales_ = dev.alloc(size_t(g.n_layer) * 3 * 4);
  std::vector<float> ones(size_t(g.n_layer) * 3, 1.f);
  copy(x_, scales_.data(), ones.data(), scales_.bytes());
  sync(x_);
  res_slot_ = 2 * int64_t(g.head_dim) * kv_elt_bytes(plan.resident_elt);
  res_slots_ = int64_t(plan.sink) + plan.ring + plan.n_outlier_tok;
  for (TieredLayer& L : layers_) {
    L.resident = dev.alloc(size_t(std::max<int64_t>(1, g.n_kv_head * res_slots_ * res_slot_)));
    fill(x_, L.resident.data(), 0, L.resident.bytes());
  }
}

TieredSeq::~TieredSeq() {
  if (pref_layer_ < 0) return;
  try {
    sync(x_);  // a streamed prefill's read of the next layer may still be running on the side stream
  } catch (...) {
  }
}

RecordFormat TieredSeq::index_fmt() const {
  return record_format(plan_.index_spec, plan_.geometry.head_dim, plan_.index_rec_bytes, grid_, signs_);
}

RecordFormat TieredSeq::meta_fmt() const {
  if (plan_.index != IndexLayout::residual) return {};
  return record_format(plan_.meta_spec, plan_.geometry.head_dim, plan_.meta_rec_bytes, meta_grid_, meta_signs_);
}

RecordFormat TieredSeq::host_fmt() const {
  return record_format(plan_.host_spec, plan_.host_dim, plan_.host_rec_bytes, host_grid_, host_signs_);
}

const float* TieredSeq::query_signs() const {
  return plan_.index == IndexLayout::higgs2_planar ? signs_.data<float>() : nullptr;
}

HostWriteParams TieredSeq::host_write_params(int layer, int n_seq, int n_new, int64_t tok_stride) const {
  const KvGeometry& g = plan_.geometry;
  HostWriteParams p;
  p.n_seq = n_seq;
  p.n_new = n_new;
  p.n_kv_head = g.n_kv_head;
  p.head_dim = g.head_dim;
  p.layer_wide = plan_.host == HostLayout::layer_wide;
  p.values_only = plan_.host == HostLayout::values_only;
  p.keys_prerope = plan_.policy.keys_prerope;
  p.fmt = host_fmt();
  p.entry_bytes = plan_.host_entry_bytes;
  p.tok_bytes = plan_.host_tok_bytes;
  p.in_tok_stride = tok_stride;
  p.k_scale = layers_[size_t(layer)].k_scale;
  p.v_scale = layers_[size_t(layer)].v_scale;
  p.seq_scales = layer_scales(layer);
  return p;
}

IndexWriteParams TieredSeq::index_write_params(int layer, int n_seq, int n_new, int64_t tok_stride) const {
  const KvGeometry& g = plan_.geometry;
  IndexWriteParams p;
  p.n_seq = n_seq;
  p.n_new = n_new;
  p.n_kv_head = g.n_kv_head;
  p.head_dim = g.head_dim;
  p.layout = plan_.index == IndexLayout::higgs2_planar ? IndexRecLayout::planar_higgs2
             : plan_.index == IndexLayout::residual  ? IndexRecLayout::residual
                                                     : IndexRecLayout::records;
  p.chunk = plan_.chunk;
  p.unit = plan_.unit;
  p.fmt = index_fmt();
  p.meta = meta_fmt();
  p.sink = plan_.sink;
  p.ring = plan_.ring;
  p.res_elt = plan_.resident_elt;
  p.in_tok_stride = tok_stride;
  p.cos_stats = plan_.host == HostLayout::values_only && !decoding_;
  p.seq_scales = layer_scales(layer) + 2;
  return p;
}

void TieredSeq::reserve(int64_t n) {
  if (n > cap_) grow(n);
}

void TieredSeq::grow(int64_t need) {
  const KvGeometry& g = plan_.geometry;
  const int H = g.n_kv_head, D = g.head_dim, W = H * D;
  const int64_t cap = std::max<int64_t>({need, 2 * cap_, kTieredMinCapacity});
  const int64_t cap_chunks = cap / plan_.chunk + 1, cap_units = cap / plan_.unit + 1;
  int64_t p0_row = 0, p1_row = 0;
  if (plan_.index == IndexLayout::higgs2_planar) {
    p0_row = pad16(cap * 32);
    p1_row = pad16(cap * 2);
  } else {
    p0_row = pad16(cap_chunks * plan_.index_rec_bytes);
    if (plan_.index == IndexLayout::residual) p1_row = pad16(cap_units * plan_.meta_rec_bytes);
  }
  sync(x_);  // queued kernels may still use the old buffers
  if (!decoding_ && stream_) {  // rewritten layer by layer, nothing to keep: the next attention allocates them
    pref_layer_ = -1;
    for (StreamBuf& w : work_) w = StreamBuf();
  }
  // The index planes of every layer in one device allocation, and the store
  // too unless it is in the pinned pool (which carves its slabs itself):
  // cudaMalloc rounds each allocation up to 2 MiB pages (3.6 GB over 18
  // sequences at 128K as 96 buffers each). The old slabs live until the
  // copies out of them have run, so a growth holds both at once: the engine
  // reserves a sequence's whole context when it starts.
  auto up = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t p0_bytes = up(p0_row * H), p1_bytes = up(p1_row * H), host_bytes = up(cap * plan_.host_tok_bytes);
  const bool store_slab = store_on_gpu() || !x_.cuda();
  Buffer old_index = std::move(index_slab_), old_store = std::move(store_slab_);
  index_slab_ = dev_.alloc(size_t(g.n_layer * (p0_bytes + p1_bytes)));
  if (store_slab) store_slab_ = alloc_store(size_t(g.n_layer * host_bytes));
  for (int l = 0; l < g.n_layer; ++l) {
    TieredLayer& L = layers_[size_t(l)];
    const int64_t n = n_[size_t(l)];
    // b's rows (old_row bytes each) into nb's (new_row each), then b = nb.
    auto regrow_into = [&](Buffer& b, int64_t old_row, int64_t new_row, int64_t rows, Buffer nb) {
      if (b)
        for (int64_t r = 0; r < rows; ++r)
          copy(x_, nb.data<uint8_t>() + r * new_row, b.data<uint8_t>() + r * old_row, size_t(old_row));
      b = std::move(nb);
    };
    auto regrow_rows = [&](Buffer& b, int64_t old_row, int64_t new_row, int64_t rows) {
      regrow_into(b, old_row, new_row, rows, dev_.alloc(size_t(new_row * rows)));
    };
    const size_t at = size_t(l * (p0_bytes + p1_bytes));
    regrow_into(L.plane0, p0_row_, p0_row, H, Buffer::view(index_slab_, at, size_t(p0_row * H)));
    if (p1_row) regrow_into(L.plane1, p1_row_, p1_row, H, Buffer::view(index_slab_, at + p0_bytes, size_t(p1_row * H)));
    Buffer host = store_slab ? Buffer::view(store_slab_, size_t(l * host_bytes), size_t(cap * plan_.host_tok_bytes))
                             : alloc_store(size_t(cap * plan_.host_tok_bytes));
    if (L.host) copy(x_, host.data(), L.host.data(), size_t(n * plan_.host_tok_bytes));
    L.host = std::move(host);
    if (!decoding_) {
      if (prefill_chosen_ && !stream_) {  // a prompt under way keeps its copy (begin_prefill allocates it)
        Buffer dk = dev_.alloc(size_t(cap * W * act_bytes(dev_.kind()))), dv = dev_.alloc(dk.bytes());
        if (L.dense_k) {
          copy(x_, dk.data(), L.dense_k.data(), size_t(n * W * act_bytes(dev_.kind())));
          copy(x_, dv.data(), L.dense_v.data(), size_t(n * W * act_bytes(dev_.kind())));
        }
        L.dense_k = std::move(dk);
        L.dense_v = std::move(dv);
      }
      if (plan_.host == HostLayout::values_only) {
        regrow_rows(L.stats, cap_chunks_ * 4, cap_chunks * 4, H);
        Buffer kp = dev_.alloc_host(size_t(cap * W * act_bytes(dev_.kind())));
        if (L.kpre) copy(x_, kp.data(), L.kpre.data(), size_t(n * W * act_bytes(dev_.kind())));
        L.kpre = std::move(kp);
        if (!L.gram && dev_.kind() == DeviceKind::cuda) {
          L.gram = dev_.alloc(size_t(W) * W * 4);
          fill(x_, L.gram.data(), 0, L.gram.bytes());
        }
      }
    } else {
      if (plan_.host == HostLayout::values_only) {
        Buffer kp = alloc_store(size_t(std::max<int64_t>(1, cap - n_prompt_) * plan_.host_tok_bytes));
        if (L.kplane) copy(x_, kp.data(), L.kplane.data(), size_t((n - n_prompt_) * plan_.host_tok_bytes));
        L.kplane = std::move(kp);
      }
      if (cache_all_) {  // the held tokens keep their slots and bits
        const int64_t words = (cap + 31) / 32;
        regrow_rows(L.slots, slot_row_tokens() * plan_.slot_bytes, cap * plan_.slot_bytes, H);
        Buffer held = dev_.alloc(size_t(H * words * 4));
        fill(x_, held.data(), 0, held.bytes());
        for (int64_t r = 0; r < H; ++r)
          copy(x_, held.data<uint8_t>() + r * words * 4, L.prev_sel.data<uint8_t>() + r * sel_state_words() * 4,
               size_t(sel_state_words() * 4));
        L.prev_sel = std::move(held);
      }
    }
  }
  if (!decoding_ && prefill_chosen_ && stream_) upload_stream_tables();
  sync(x_);
  cap_ = cap;
  cap_chunks_ = cap_chunks;
  cap_units_ = cap_units;
  p0_row_ = p0_row;
  p1_row_ = p1_row;
  ++generation_;
}

FetchParams TieredSeq::fetch_params(int n_seq) const {
  const KvGeometry& g = plan_.geometry;
  FetchParams p;
  p.n_seq = n_seq;
  p.n_kv_head = g.n_kv_head;
  p.head_dim = g.head_dim;
  p.layer_wide = plan_.host == HostLayout::layer_wide;
  p.values_only = plan_.host == HostLayout::values_only;
  p.keys_prerope = plan_.policy.keys_prerope;
  p.fmt = host_fmt();
  p.entry_bytes = plan_.host_entry_bytes;
  p.tok_bytes = plan_.host_tok_bytes;
  p.inv_freq = inv_freq();
  p.interleaved = g.rope_interleaved;
  p.rank = plan_.rank;
  return p;
}

void TieredSeq::start_decode() {
  KVT_CHECK(!decoding_, "tiered cache: decode already started");
  const KvGeometry& g = plan_.geometry;
  n_prompt_ = n_[0];
  for (int l = 1; l < g.n_layer; ++l)
    KVT_CHECK(n_[size_t(l)] == n_prompt_, "tiered cache: layer {} holds {} tokens, layer 0 holds {}", l,
              n_[size_t(l)], n_prompt_);
  budget_ = kvtier::budget_tokens(plan_.policy, n_prompt_);
  const int kchunks = int(std::max<int64_t>(1, budget_ / plan_.chunk));
  kmax_tok_ = kchunks * plan_.chunk;
  if (stream_) {  // a read of the next chunk's layer 0 may be running on the side stream
    sync(x_);
    pref_layer_ = -1;
  }
  if (plan_.host == HostLayout::values_only) finish_shadowkv();
  decoding_ = true;
  const int H = g.n_kv_head;
  for (StreamBuf& w : work_) w = StreamBuf();
  for (TieredLayer& L : layers_) {
    L.dense_k = Buffer();
    L.dense_v = Buffer();
    L.kpre = Buffer();
    L.gram = Buffer();
    L.stats = Buffer();
  }
  choose_cache();
  for (TieredLayer& L : layers_) {
    L.slots = dev_.alloc(size_t(H) * slot_row_tokens() * plan_.slot_bytes);
    L.prev_sel = dev_.alloc(size_t(H) * sel_state_words() * 4);
    L.prev_slot = dev_.alloc(size_t(H) * kmax_tok_ * 4);
    fill(x_, L.prev_sel.data(), cache_all_ ? 0 : 0xff, L.prev_sel.bytes());  // cache=all: no token held yet
    fill(x_, L.prev_slot.data(), 0xff, L.prev_slot.bytes());
    if (plan_.policy.reselect > 1) {
      L.kept_sel = dev_.alloc(size_t(H) * kept_words() * 4);
      fill(x_, L.kept_sel.data(), 0xff, L.kept_sel.bytes());
    }
    if (plan_.host == HostLayout::values_only) {
      L.kplane = alloc_store(size_t(std::max<int64_t>(1, cap_ - n_prompt_) * plan_.host_tok_bytes));
    }
  }
  if (plan_.policy.reselect > 1) {
    reselect_at_ = dev_.alloc(16);  // tokens at the last pick; rescore: its candidate count
    fill(x_, reselect_at_.data(), 0, 16);
  }
  sync(x_);
  needs_fill_ = cache_all_;
  ++generation_;
}

bool choose_cache_all(CacheMode mode, bool gpu, int64_t all_bytes, int64_t free, int64_t total) {
  const int64_t margin = std::max<int64_t>(int64_t(1) << 30, total / 10);
  const bool fits = !gpu || all_bytes + margin <= free;
  switch (mode) {
    case CacheMode::step: return false;
    case CacheMode::all:
      KVT_CHECK(fits, "kv policy cache=all: the decoded K/V needs {:.2f} GB of GPU memory and {:.2f} GB are free "
                "(keeping {:.2f} GB); use cache=auto or cache=step",
                double(all_bytes) / 1e9, double(free) / 1e9, double(margin) / 1e9);
      return true;
    default: return gpu && 2 * all_bytes + margin <= free;
  }
}

// cache=all: every token's decoded K|V on the GPU (slot = token).
void TieredSeq::choose_cache() {
  if (plan_.in_place) {  // no slot cache: the attention reads the store
    cache_all_ = false;
    return;
  }
  const KvGeometry& g = plan_.geometry;
  const bool gpu = dev_.kind() == DeviceKind::cuda;
  const int64_t all_bytes = int64_t(g.n_layer) * g.n_kv_head * (cap_ * plan_.slot_bytes + (cap_ + 31) / 32 * 4);
  int64_t free_b = 0, total_b = 0;
  if (gpu) {
    const auto [f, t] = dev_.mem_info();
    free_b = int64_t(f), total_b = int64_t(t);
  }
  // A store in GPU memory is read there at device speed: decoding it again
  // into every token's slot would take 3.6x its memory (HIGGS4) for little.
  const CacheMode mode = plan_.policy.cache == CacheMode::auto_ && store_on_gpu() ? CacheMode::step
                                                                                  : plan_.policy.cache;
  cache_all_ = choose_cache_all(mode, gpu, all_bytes, free_b, total_b);
}

Buffer TieredSeq::alloc_store(size_t bytes) const {
  return store_on_gpu() ? dev_.alloc(bytes) : dev_.alloc_host(bytes);
}

KvMemory TieredSeq::memory() const {
  // What the sequence holds, counted from its state: records of the tokens
  // indexed and stored, the resident slots, the SVD factors, the slot cache.
  const KvGeometry& g = plan_.geometry;
  const int64_t H = g.n_kv_head;
  const KvFootprint rate = plan_footprint(plan_, 0);
  KvMemory m;
  m.prefill_streamed = stream_;
  m.gpu_bytes_per_token = rate.gpu_bytes_per_token;
  m.host_bytes_per_token = rate.host_bytes_per_token;
  for (int l = 0; l < g.n_layer; ++l) {
    const TieredLayer& L = layers_[size_t(l)];
    const int64_t n = n_[size_t(l)];
    m.gpu_bytes += n / plan_.unit * plan_.unit / plan_.chunk * plan_.index_rec_bytes * H;
    if (plan_.index == IndexLayout::residual) m.gpu_bytes += n / plan_.unit * plan_.meta_rec_bytes * H;
    m.gpu_bytes += H * res_slots_ * res_slot_;
    if (plan_.rank > 0) {
      m.gpu_bytes += 2 * int64_t(plan_.rank) * H * g.head_dim;                        // Vᵀ
      m.gpu_bytes += 2 * int64_t(plan_.rank) * (decoding_ ? n_prompt_ : n);           // U·S rows
    }
    if (decoding_)  // slots, selection state
      m.gpu_bytes += H * (slot_row_tokens() * plan_.slot_bytes + 4 * sel_state_words() + 4 * kmax_tok_ +
                          (plan_.policy.reselect > 1 ? 4 * kept_words() : 0));
    m.host_bytes += n * plan_.host_tok_bytes;
    if (plan_.host == HostLayout::values_only && decoding_) m.host_bytes += (n - n_prompt_) * plan_.host_tok_bytes;
    if (plan_.host_spec.kind == QuantKind::nvfp4) m.host_bytes += 8;  // the per-tensor scales
    (void)L;
  }
  if (plan_.policy.store == StoreMode::gpu) {  // the store is GPU memory (the CPU device: the GPU tier's RAM)
    m.gpu_bytes += m.host_bytes;
    m.host_bytes = 0;
  }
  return m;
}

KvStats TieredSeq::stats() const {
  unsigned long long c[2] = {0, 0};
  copy(x_, c, counters_.data(), 16);
  sync(x_);
  KvStats s;
  s.n_steps = 0;
  for (int64_t n : n_) s.n_steps += std::max<int64_t>(0, n - n_prompt_);
  s.n_selected = int64_t(c[0]);
  s.n_fetched = int64_t(c[1]);
  // Bytes over PCIe: a miss reads one entry (layer-wide: the whole record);
  // none when the store is in GPU memory.
  s.bytes_fetched = store_on_gpu() ? 0 : s.n_fetched * plan_.host_entry_bytes;
  return s;
}

// ---- TieredKv

TieredKv::TieredKv(const KvPlan& plan, const Device& dev) : seq_(std::make_unique<TieredSeq>(plan, dev)) {}
TieredKv::~TieredKv() = default;

void TieredKv::append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride, int n_tok) {
  if (!seq_->decoding()) return seq_->append(layer, k_pre, k, v, tok_stride, n_tok);
  KVT_CHECK(n_tok == 1, "tiered cache: a decode step appends one token, not {}", n_tok);
  batch_->append(layer, k_pre, k, v, tok_stride);
}

void TieredKv::attend(int layer, const void* q, int64_t q_stride, int n_tok, float scale, void* out) {
  if (!seq_->decoding()) return seq_->attend_prefill(layer, q, q_stride, n_tok, scale, out);
  KVT_CHECK(n_tok == 1, "tiered cache: a decode step attends with one token, not {}", n_tok);
  batch_->attend(layer, q, scale, out);
}

void TieredKv::begin_step(int n_tok) {
  if (!seq_->decoding()) return;
  KVT_CHECK(n_tok == 1, "tiered cache: a decode step takes one token, not {}", n_tok);
  batch_->begin_step();
}

uint64_t TieredKv::graph_token() const { return seq_->generation() * 1000003ull + batch_builds(); }

uint64_t TieredKv::batch_builds() const { return batch_ ? batch_->builds() : 0; }

void TieredKv::start_decode() {
  seq_->start_decode();
  batch_ = std::make_unique<DecodeBatch>(seq_->plan(), seq_->device());
  batch_->set_sequences({seq_.get()});
  batch_->prepare();  // cache=all: the prompt's K/V into the GPU slots now, not in the first step
}

}  // namespace kvtier
