// kv_write and fetch_rows on the GPU against their CPU specifications, for
// every host-tier format and index layout: the records a GPU writes are the
// CPU's (byte for byte but for counted nearest-point ties), the resident
// slots are exact, and the K|V the slot cache hands to attention are the
// CPU's decoded values to bf16 rounding, with the same hit/miss counts over
// steps whose selections overlap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "backend/cuda_test_util.h"
#include "ops/gather/fetch.h"
#include "ops/kv_append/kv_write.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {
using namespace cuda::testing;

int64_t pad16(int64_t b) { return (b + 15) / 16 * 16; }

struct Tables {  // a HIGGS spec's grid and signs on the device
  cuda::DeviceBuffer grid, signs;
  RecordFormat fmt(const QuantSpec& s, int dim) {
    RecordFormat f{s, dim, int64_t(bytes_per_vector(s, dim))};
    if (s.kind == QuantKind::higgs) {
      grid = to_device(higgs_grid_of(s).points);
      f.grid = grid.data<float>();
      if (s.random_signs) {
        std::vector<float> sg(size_t(resolved_group(s, dim)));
        hadamard_signs(s.sign_seed, int(sg.size()), sg.data());
        signs = to_device(sg);
        f.signs = signs.data<float>();
      }
    }
    return f;
  }
};

std::vector<float> bf16_values(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(d(rng)));
  return v;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

struct HostCase {
  const char* spec;
  bool layer_wide = false, values_only = false, prerope = false;
  int head_dim = 128;
  // fetch_dense in one pass of 32 tokens per SM: more misses per row than the
  // read-and-decode kernel has warps for it, so a warp reads the next miss
  // while it decodes one (at 128K decode every warp takes about two).
  bool many_misses = false;
};

class HostTierCuda : public ::testing::TestWithParam<HostCase> {};

TEST_P(HostTierCuda, WritesTheCpuRecordsAndFetchesItsValues) {
  KVT_REQUIRE_GPU();
  const HostCase c = GetParam();
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  std::mt19937 rng(17);
  const int dense_pass = c.many_misses ? 32 * cuda::device_info().n_sm : 64;
  const int H = 4, D = c.head_dim, W = H * D, n_seq = 2, n_tok = c.many_misses ? dense_pass + 100 : 300;
  QuantSpec spec = parse_quant_spec(c.spec);
  if (spec.kind == QuantKind::nvfp4) spec.tensor_scale = 0.004f;
  const int dim = c.layer_wide ? W : D;
  Tables tab;
  HostWriteParams hp;
  hp.n_seq = n_seq;
  hp.n_new = n_tok;
  hp.n_kv_head = H;
  hp.head_dim = D;
  hp.layer_wide = c.layer_wide;
  hp.values_only = c.values_only;
  hp.keys_prerope = c.prerope;
  hp.fmt = tab.fmt(spec, dim);
  hp.entry_bytes = pad16((c.values_only ? 1 : 2) * hp.fmt.bytes);
  hp.tok_bytes = c.layer_wide ? hp.entry_bytes : H * hp.entry_bytes;
  hp.in_tok_stride = W;
  const std::vector<float> scales{0.004f, 0.005f, 0.003f, 0.006f};  // [n_seq][2]
  hp.seq_scales = scales.data();
  const auto k = bf16_values(rng, size_t(n_seq) * n_tok * W), kp = bf16_values(rng, k.size()),
             v = bf16_values(rng, k.size());
  const std::vector<int64_t> pos0{0, 0}, key_first{-1, 100};
  // CPU tier.
  std::vector<std::vector<uint8_t>> cpu_host(n_seq, std::vector<uint8_t>(size_t(n_tok) * hp.tok_bytes, 0)),
      cpu_kp(n_seq, std::vector<uint8_t>(size_t(n_tok) * hp.tok_bytes, 0));
  std::vector<uint8_t*> ch{cpu_host[0].data(), cpu_host[1].data()}, ck{cpu_kp[0].data(), cpu_kp[1].data()};
  host_write_cpu(hp, k.data(), kp.data(), v.data(), pos0.data(), ch.data(), ck.data(), key_first.data());
  // GPU tier: pinned host memory written through its mapped address.
  std::vector<Buffer> gh, gk;
  std::vector<uint8_t*> ghp, gkp;
  for (int s = 0; s < n_seq; ++s) {
    gh.push_back(dev.alloc_host(cpu_host[0].size()));
    gk.push_back(dev.alloc_host(cpu_kp[0].size()));
    std::memset(gh.back().host_ptr(), 0, gh.back().bytes());
    std::memset(gk.back().host_ptr(), 0, gk.back().bytes());
    ghp.push_back(gh.back().data<uint8_t>());
    gkp.push_back(gk.back().data<uint8_t>());
  }
  auto d_ghp = to_device(ghp), d_gkp = to_device(gkp), d_pos0 = to_device(pos0), d_kf = to_device(key_first),
       d_scales = to_device(scales);
  auto d_k = to_device(to_bf16(k)), d_kp = to_device(to_bf16(kp)), d_v = to_device(to_bf16(v));
  HostWriteParams hg = hp;
  hg.seq_scales = d_scales.data<float>();
  host_write(x, hg, d_k.data(), d_kp.data(), d_v.data(), d_pos0.data<int64_t>(), d_ghp.data<uint8_t* const>(),
             d_gkp.data<uint8_t* const>(), d_kf.data<int64_t>());
  sync(x);
  int64_t diff = 0;
  for (int s = 0; s < n_seq; ++s)
    for (size_t i = 0; i < cpu_host[size_t(s)].size(); ++i) {
      diff += gh[size_t(s)].host_ptr<uint8_t>()[i] != cpu_host[size_t(s)][i];
      diff += gk[size_t(s)].host_ptr<uint8_t>()[i] != cpu_kp[size_t(s)][i];
    }
  // HIGGS codes may differ at nearest-point ties (f32 rounding of the rotation): rare.
  EXPECT_LE(diff, int64_t(cpu_host[0].size()) / 2000) << c.spec << ": " << diff << " bytes differ";

  // Fetch over 3 steps from the CPU-written tier (both devices read the same records).
  for (int s = 0; s < n_seq; ++s) std::memcpy(gh[size_t(s)].host_ptr(), cpu_host[size_t(s)].data(), cpu_host[0].size());
  for (int s = 0; s < n_seq; ++s) std::memcpy(gk[size_t(s)].host_ptr(), cpu_kp[size_t(s)].data(), cpu_kp[0].size());
  const int K = 40;
  const std::vector<int32_t> kslots{40, 24};
  FetchParams fp;
  fp.n_seq = n_seq;
  fp.n_kv_head = H;
  fp.head_dim = D;
  fp.kmax = K;
  fp.layer_wide = c.layer_wide;
  fp.values_only = c.values_only;
  fp.keys_prerope = c.prerope;
  fp.fmt = hp.fmt;
  fp.entry_bytes = hp.entry_bytes;
  fp.tok_bytes = hp.tok_bytes;
  fp.seq_scales = scales.data();
  const bool raw = !c.layer_wide && !c.values_only && !c.prerope &&
                   (spec.kind == QuantKind::bf16 || spec.kind == QuantKind::fp8);
  std::vector<float> inv(size_t(D / 2));
  for (int i = 0; i < D / 2; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * i / D));
  auto d_inv = to_device(inv);
  fp.inv_freq = inv.data();
  // shadowkv's SVD rebuild of keys below key_first: A [n_tok, rank], B [rank, W] bf16.
  const int rank = 16;
  fp.rank = rank;
  const auto a16 = to_bf16(bf16_values(rng, size_t(n_tok) * rank)), b16 = to_bf16(bf16_values(rng, size_t(rank) * W));
  auto d_a = to_device(a16), d_b = to_device(b16);
  const int64_t rows = int64_t(n_seq) * H;
  // CPU side.
  FetchParams pc = fp;
  pc.raw = raw;
  pc.elt = raw ? (spec.kind == QuantKind::fp8 ? KvElt::fp8 : KvElt::bf16) : KvElt::f32;
  pc.slot_bytes = 2 * int64_t(D) * kv_elt_bytes(pc.elt);
  std::vector<int32_t> c_prev(size_t(rows) * K, -1), c_prev_slot(size_t(rows) * K, -1), c_slot_of(size_t(rows) * K);
  std::vector<std::vector<uint8_t>> c_scratch(size_t(rows), std::vector<uint8_t>(size_t(K) * pc.slot_bytes));
  std::vector<uint8_t*> c_slots;
  std::vector<int32_t*> c_ps, c_pslot;
  for (int64_t r = 0; r < rows; ++r) {
    c_slots.push_back(c_scratch[size_t(r)].data());
    c_ps.push_back(c_prev.data() + r * K);
    c_pslot.push_back(c_prev_slot.data() + r * K);
  }
  unsigned long long c_cnt[2][2] = {{0, 0}, {0, 0}};
  std::vector<unsigned long long*> c_cntp{c_cnt[0], c_cnt[1]};
  const std::vector<const uint16_t*> c_a{a16.data(), a16.data()}, c_b{b16.data(), b16.data()};
  FetchRows cr;
  cr.host = ch.data();
  cr.kplane = ck.data();
  cr.key_first = key_first.data();
  cr.svd_a = c_a.data();
  cr.svd_b = c_b.data();
  cr.kslots = kslots.data();
  cr.slots = c_slots.data();
  cr.prev_sel = c_ps.data();
  cr.prev_slot = c_pslot.data();
  cr.slot_of = c_slot_of.data();
  cr.counters = c_cntp.data();
  // GPU side.
  FetchParams pg = fp;
  pg.raw = raw;
  pg.elt = raw && spec.kind == QuantKind::fp8 ? KvElt::fp8 : KvElt::bf16;
  pg.slot_bytes = 2 * int64_t(D) * kv_elt_bytes(pg.elt);
  pg.seq_scales = d_scales.data<float>();
  pg.inv_freq = d_inv.data<float>();
  std::vector<cuda::DeviceBuffer> g_slots;
  std::vector<uint8_t*> g_slot_p;
  cuda::DeviceBuffer g_prev(size_t(rows) * K * 4), g_prev_slot(size_t(rows) * K * 4), g_slot_of(size_t(rows) * K * 4);
  KVT_CUDA_CHECK(cudaMemset(g_prev.data(), 0xff, g_prev.bytes()));
  KVT_CUDA_CHECK(cudaMemset(g_prev_slot.data(), 0xff, g_prev_slot.bytes()));
  std::vector<int32_t*> g_ps, g_pslot;
  for (int64_t r = 0; r < rows; ++r) {
    g_slots.emplace_back(size_t(K) * pg.slot_bytes);
    g_slot_p.push_back(g_slots.back().data<uint8_t>());
    g_ps.push_back(g_prev.data<int32_t>() + r * K);
    g_pslot.push_back(g_prev_slot.data<int32_t>() + r * K);
  }
  cuda::DeviceBuffer g_cnt(32);
  KVT_CUDA_CHECK(cudaMemset(g_cnt.data(), 0, 32));
  std::vector<unsigned long long*> g_cntp{g_cnt.data<unsigned long long>(), g_cnt.data<unsigned long long>() + 2};
  const std::vector<const uint16_t*> g_a{d_a.data<uint16_t>(), d_a.data<uint16_t>()},
      g_b{d_b.data<uint16_t>(), d_b.data<uint16_t>()};
  auto d_gslots = to_device(g_slot_p), d_gps = to_device(g_ps), d_gpslot = to_device(g_pslot),
       d_gcnt = to_device(g_cntp), d_ga = to_device(g_a), d_gb = to_device(g_b), d_kslots = to_device(kslots);
  cuda::DeviceBuffer scratch(size_t(fetch_scratch_bytes(x, pg)));
  FetchRows gr;
  gr.host = d_ghp.data<uint8_t* const>();
  gr.kplane = d_gkp.data<uint8_t* const>();
  gr.key_first = d_kf.data<int64_t>();
  gr.svd_a = d_ga.data<const uint16_t* const>();
  gr.svd_b = d_gb.data<const uint16_t* const>();
  gr.kslots = d_kslots.data<int32_t>();
  gr.slots = d_gslots.data<uint8_t* const>();
  gr.prev_sel = d_gps.data<int32_t* const>();
  gr.prev_slot = d_gpslot.data<int32_t* const>();
  gr.slot_of = g_slot_of.data<int32_t>();
  gr.scratch = scratch.data();
  gr.counters = d_gcnt.data<unsigned long long* const>();
  std::vector<const uint8_t*> view_rows(static_cast<size_t>(rows));
  for (int step = 0; step < 3; ++step) {
    // Ascending selections, right-aligned with −1 before, overlapping the last step's.
    std::vector<int32_t> sel(size_t(rows) * K, -1);
    for (int64_t r = 0; r < rows; ++r) {
      const int ks = kslots[size_t(r / H)];
      std::vector<int32_t> t;
      for (int32_t i = 0; i < n_tok && int(t.size()) < ks - 3; i += 1 + int32_t(rng() % 9)) t.push_back((i + 5 * step) % n_tok);
      std::sort(t.begin(), t.end());
      t.erase(std::unique(t.begin(), t.end()), t.end());
      std::copy(t.begin(), t.end(), sel.begin() + r * K + (K - int64_t(t.size())));
    }
    FetchView cv, gv;
    fetch_rows_cpu(pc, sel.data(), cr, view_rows.data(), &cv);
    auto d_sel = to_device(sel);
    fetch_rows(x, pg, d_sel.data<int32_t>(), gr, nullptr, &gv);
    sync(x);
    const auto slot_of = to_host<int32_t>(g_slot_of, sel.size());
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const auto g_row = to_host<uint8_t>(g_slots[size_t(r)], size_t(K) * pg.slot_bytes);
      for (int j = 0; j < K; ++j) {
        const int32_t t = sel[size_t(r * K + j)];
        ASSERT_EQ(t < 0, slot_of[size_t(r * K + j)] < 0) << r << " " << j;
        if (t < 0) continue;
        const int64_t ci = cv.idx[r * K + j];
        if (!raw) {
          ASSERT_EQ(ci, slot_of[size_t(r * K + j)]) << "the CPU's slot cache assigns as the GPU's";
        }
        const uint8_t* ce = cv.rows[r] + ci * cv.tok_stride;
        const uint8_t* ge = g_row.data() + int64_t(slot_of[size_t(r * K + j)]) * pg.slot_bytes;
        for (int w = 0; w < 2; ++w)
          for (int d = 0; d < D; ++d) {
            const uint8_t* cp = ce + (w ? cv.v_offset : 0);
            const float cval = cv.elt == KvElt::f32 ? reinterpret_cast<const float*>(cp)[d]
                               : cv.elt == KvElt::bf16 ? bf16_to_f32(reinterpret_cast<const uint16_t*>(cp)[d])
                                                       : e4m3_to_f32(cp[d]);
            const uint8_t* gp = ge + (w ? gv.v_offset : 0);
            const float gval = gv.elt == KvElt::bf16 ? bf16_to_f32(reinterpret_cast<const uint16_t*>(gp)[d])
                                                     : e4m3_to_f32(gp[d]);
            worst = std::max(worst, double(std::abs(gval - cval)) / (1e-3 + std::abs(cval)));
          }
      }
    }
    EXPECT_LT(worst, 1.2e-2) << c.spec << " step " << step;
  }
  unsigned long long g_c[4];
  KVT_CUDA_CHECK(cudaMemcpy(g_c, g_cnt.data(), 32, cudaMemcpyDeviceToHost));
  EXPECT_EQ(g_c[0], c_cnt[0][0]);
  EXPECT_EQ(g_c[1], c_cnt[0][1]);
  EXPECT_EQ(g_c[2], c_cnt[1][0]);
  EXPECT_EQ(g_c[3], c_cnt[1][1]);
  EXPECT_LT(c_cnt[0][1], c_cnt[0][0]) << "the steps overlap: some hits expected";

  // fetch_dense (the streamed prefill's read): sequence 0's tokens [5, n_tok)
  // as dense rows, in passes of dense_pass tokens; shadowkv's keys from its pre-RoPE copy.
  const int64_t t0 = 5, n = n_tok - t0;
  const std::vector<float> kpre_f(kp.begin(), kp.begin() + int64_t(n_tok) * W);
  Buffer g_kpre = dev.alloc_host(kpre_f.size() * 2);
  for (size_t i = 0; i < kpre_f.size(); ++i) g_kpre.host_ptr<uint16_t>()[i] = f32_to_bf16(kpre_f[i]);
  FetchParams dc = pc;
  dc.n_seq = 1;
  dc.kmax = dense_pass;
  FetchRows dcr = cr;
  dcr.prefill_kpre = reinterpret_cast<const uint8_t*>(kpre_f.data());
  std::vector<float> ck_out(size_t(n) * W), cv_out(size_t(n) * W);
  fetch_dense_cpu(dc, dcr, t0, n_tok, ck_out.data(), cv_out.data());
  FetchParams dg = pg;
  dg.n_seq = 1;
  dg.kmax = dense_pass;
  cuda::DeviceBuffer d_scratch(size_t(fetch_dense_scratch_bytes(x, dg)));
  FetchRows dgr = gr;
  dgr.scratch = d_scratch.data();
  dgr.prefill_kpre = g_kpre.data<uint8_t>();
  cuda::DeviceBuffer gk_out(size_t(n) * W * 2), gv_out(size_t(n) * W * 2);
  fetch_dense(x, dg, dgr, t0, n_tok, gk_out.data(), gv_out.data());
  sync(x);
  const auto gk16 = to_host<uint16_t>(gk_out, size_t(n) * W), gv16 = to_host<uint16_t>(gv_out, size_t(n) * W);
  double worst_dense = 0, mass = 0;
  for (size_t i = 0; i < ck_out.size(); ++i) {
    worst_dense = std::max(worst_dense, double(std::abs(bf16_to_f32(gk16[i]) - ck_out[i])) / (1e-3 + std::abs(ck_out[i])));
    worst_dense = std::max(worst_dense, double(std::abs(bf16_to_f32(gv16[i]) - cv_out[i])) / (1e-3 + std::abs(cv_out[i])));
    mass += std::abs(ck_out[i]) + std::abs(cv_out[i]);
  }
  EXPECT_LT(worst_dense, 1.2e-2) << c.spec << ": fetch_dense";
  // The same range copied by the copy engine from the tier's CPU address, then decoded.
  dgr.dense_host = gh[0].host_ptr<uint8_t>();
  cuda::DeviceBuffer gk2(size_t(n) * W * 2), gv2(size_t(n) * W * 2);
  fetch_dense(x, dg, dgr, t0, n_tok, gk2.data(), gv2.data());
  sync(x);
  EXPECT_EQ(to_host<uint16_t>(gk2, size_t(n) * W), gk16) << c.spec << ": fetch_dense by copy, keys";
  EXPECT_EQ(to_host<uint16_t>(gv2, size_t(n) * W), gv16) << c.spec << ": fetch_dense by copy, values";
  EXPECT_GT(mass, 0.1 * double(ck_out.size())) << "the dense rows hold values";
}

INSTANTIATE_TEST_SUITE_P(
    Formats, HostTierCuda,
    ::testing::Values(HostCase{"bf16"}, HostCase{"fp8"}, HostCase{"f32"}, HostCase{"higgs4:g128"},
                      HostCase{"higgs4:g64:rs"}, HostCase{"nvfp4"}, HostCase{"int4:g32"},
                      HostCase{"higgs4", true}, HostCase{"bf16", false, true}, HostCase{"fp8", false, true},
                      HostCase{"higgs4:g128", false, false, true}, HostCase{"bf16", false, false, true},
                      HostCase{"bf16", false, false, false, 64}, HostCase{"higgs4:g64", false, false, false, 64},
                      HostCase{"fp8", false, false, false, 256},
                      HostCase{"higgs4:g128", false, false, true, 128, true}));

struct IndexCase {
  const char* spec;  // "planar" (higgs2 codes; "planar:U4": U4 codes) or a records format; "residual"
  int chunk = 1, m = 1;
  int head_dim = 128;
  bool cos_stats = true;  // chunk > 1: also ShadowKV's cosine stats (HIGGS records without them: the warp kernel)
};

class IndexWriteCuda : public ::testing::TestWithParam<IndexCase> {};

TEST_P(IndexWriteCuda, WritesTheCpuRecords) {
  KVT_REQUIRE_GPU();
  const IndexCase c = GetParam();
  const std::string name = c.spec;
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  std::mt19937 rng(23);
  const int H = 2, D = c.head_dim, W = H * D, n_seq = 2;
  const bool planar = name.starts_with("planar"), residual = name == "residual";
  const int unit = c.chunk * c.m, ring = std::max(16, unit - 1), sink = 0;
  Tables t0, t1;
  IndexWriteParams ip;
  ip.n_kv_head = H;
  ip.head_dim = D;
  ip.layout = planar ? IndexRecLayout::planar_higgs2 : residual ? IndexRecLayout::residual : IndexRecLayout::records;
  ip.chunk = c.chunk;
  ip.unit = unit;
  ip.fmt = t0.fmt(parse_quant_spec(name == "planar:U4" ? "higgs:U4:g128" : planar ? "higgs2:g128" : residual ? "1bit" : c.spec), D);
  if (residual) ip.meta = t1.fmt(parse_quant_spec("higgs4"), D);
  ip.sink = sink;
  ip.ring = ring;
  ip.in_tok_stride = W;
  ip.cos_stats = c.chunk > 1 && c.cos_stats;
  const int n_total = 400;
  const int64_t n_chunks = n_total / c.chunk + 1, n_units = n_total / unit + 1;
  const int64_t rb = ip.fmt.bytes, mb = residual ? ip.meta.bytes : 0;
  const int64_t rows = int64_t(n_seq) * H;
  // CPU stores: records (planar: the AoS higgs2 records), meta, resident ring (bf16), stats.
  std::vector<std::vector<uint8_t>> c0(rows, std::vector<uint8_t>(size_t(n_chunks * rb), 0)),
      c1(rows, std::vector<uint8_t>(size_t(std::max<int64_t>(1, n_units * mb)), 0)),
      cres(rows, std::vector<uint8_t>(size_t(ring + sink) * 4 * D, 0));
  std::vector<std::vector<float>> cst(rows, std::vector<float>(size_t(n_chunks), 0.f));
  std::vector<uint8_t*> c0p, c1p, cresp;
  std::vector<float*> cstp;
  for (int64_t r = 0; r < rows; ++r) {
    c0p.push_back(c0[size_t(r)].data());
    c1p.push_back(c1[size_t(r)].data());
    cresp.push_back(cres[size_t(r)].data());
    cstp.push_back(cst[size_t(r)].data());
  }
  std::vector<cuda::DeviceBuffer> g0, g1, gres, gst;
  std::vector<uint8_t*> g0p, g1p, gresp;
  std::vector<float*> gstp;
  for (int64_t r = 0; r < rows; ++r) {
    g0.emplace_back(planar ? size_t(n_total) * 32 + 64 : c0[0].size());
    g1.emplace_back(planar ? size_t(n_total) * 2 + 64 : c1[0].size());
    gres.emplace_back(cres[0].size());
    gst.emplace_back(cst[0].size() * 4);
    poison(g0.back());
    KVT_CUDA_CHECK(cudaMemset(gres.back().data(), 0, gres.back().bytes()));
    g0p.push_back(g0.back().data<uint8_t>());
    g1p.push_back(g1.back().data<uint8_t>());
    gresp.push_back(gres.back().data<uint8_t>());
    gstp.push_back(gst.back().data<float>());
  }
  auto d0 = to_device(g0p), d1 = to_device(g1p), dres = to_device(gresp), dst = to_device(gstp);
  int64_t n_done = 0;
  for (int n_new : {1, 37, 128, 1, 1, 100, 132}) {  // appends of many sizes, straddling units
    ip.n_seq = n_seq;
    ip.n_new = n_new;
    const auto k = bf16_values(rng, size_t(n_seq) * n_new * W);
    const std::vector<int64_t> pos0(size_t(n_seq), n_done);
    if (!planar) index_write_cpu(ip, k.data(), pos0.data(), c0p.data(), c1p.data(), cresp.data(), cstp.data());
    else {  // planar: the CPU's higgs2 records of every key
      for (int s = 0; s < n_seq; ++s)
        for (int i = 0; i < n_new; ++i)
          for (int h = 0; h < H; ++h)
            quantize(ip.fmt.spec, k.data() + (int64_t(s) * n_new + i) * W + int64_t(h) * D, 1, D,
                     c0[size_t(s * H + h)].data() + (n_done + i) * rb);
    }
    ResidentWriteParams rp{n_seq, n_new, H, D, sink, ring, W, KvElt::bf16};
    resident_write_cpu(rp, k.data(), k.data(), pos0.data(), cresp.data());
    auto dk = to_device(to_bf16(k)), dpos = to_device(pos0);
    index_write(x, ip, dk.data(), dpos.data<int64_t>(), d0.data<uint8_t* const>(), d1.data<uint8_t* const>(),
                dres.data<uint8_t* const>(), ip.cos_stats ? dst.data<float* const>() : nullptr);
    resident_write(x, rp, dk.data(), dk.data(), dpos.data<int64_t>(), dres.data<uint8_t* const>());
    sync(x);
    n_done += n_new;
  }
  int64_t diff = 0, total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_EQ(to_host<uint8_t>(gres[size_t(r)], cres[0].size()), cres[size_t(r)]) << "resident ring, row " << r;
    const int64_t n_rec = n_done / unit * unit / c.chunk;
    if (planar) {
      const auto codes = to_host<uint8_t>(g0[size_t(r)], size_t(n_done) * 32);
      const auto sc = to_host<uint8_t>(g1[size_t(r)], size_t(n_done) * 2);
      for (int64_t t = 0; t < n_done; ++t) {
        for (int b = 0; b < 32; ++b) diff += codes[size_t(t * 32 + b)] != c0[size_t(r)][size_t(t * rb + b)];
        for (int b = 0; b < 2; ++b) diff += sc[size_t(t * 2 + b)] != c0[size_t(r)][size_t(t * rb + 32 + b)];
        total += 34;
      }
    } else {
      const auto got = to_host<uint8_t>(g0[size_t(r)], size_t(n_rec * rb));
      for (int64_t i = 0; i < n_rec * rb; ++i) diff += got[size_t(i)] != c0[size_t(r)][size_t(i)];
      total += n_rec * rb;
      if (residual) {
        const auto gm = to_host<uint8_t>(g1[size_t(r)], size_t(n_rec / c.m * mb));
        for (int64_t i = 0; i < n_rec / c.m * mb; ++i) diff += gm[size_t(i)] != c1[size_t(r)][size_t(i)];
      }
      if (ip.cos_stats) {
        const auto gs = to_host<float>(gst[size_t(r)], size_t(n_rec));
        for (int64_t i = 0; i < n_rec; ++i) ASSERT_NEAR(gs[size_t(i)], cst[size_t(r)][size_t(i)], 1e-5) << i;
      }
    }
  }
  EXPECT_LE(diff, total / 1000 + 2) << name << ": " << diff << " of " << total << " bytes differ";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, IndexWriteCuda,
    ::testing::Values(IndexCase{"planar"}, IndexCase{"planar:U4"}, IndexCase{"bf16", 8}, IndexCase{"fp8", 1}, IndexCase{"higgs1:rs", 1},
                      IndexCase{"int4:g32", 4}, IndexCase{"1bit", 1}, IndexCase{"fp8s", 2},
                      IndexCase{"residual", 1, 8}, IndexCase{"residual", 2, 4}, IndexCase{"higgs2:g64", 1, 1, 64},
                      IndexCase{"bf16", 8, 1, 64}, IndexCase{"higgs2", 1, 1, 256},
                      IndexCase{"higgs1", 1}, IndexCase{"higgs1", 4, 1, 128, false}, IndexCase{"higgs4:rs", 8, 1, 64, false},
                      IndexCase{"higgs1", 4}));

}  // namespace
}  // namespace kvtier
