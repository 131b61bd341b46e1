// gpu-bench harness: the kernel table against the measured limits, prefill,
// and the decode-step table per policy / context / batch.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "backend/cuda_device.h"
#include "gpu/gpu_bench.h"
#include "gpu/llama_gpu.h"
#include "ops/decode_attn/decode_attn_cuda.h"
#include "ops/flash_prefill/flash_prefill_cuda.h"
#include "ops/gather/gather_cuda.h"
#include "ops/index_score/index_score_cuda.h"
#include "ops/lowrank_k/lowrank_k_cuda.h"
#include "ops/topk/topk_cuda.h"

namespace kvtier::gpu {
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;
using nlohmann::json;

namespace {

// Median of `reps` timings (ms) of fn() on stream s, after 2 warm-ups.
template <class Fn>
double time_ms(cudaStream_t s, int reps, Fn&& fn) {
  fn();
  fn();
  std::vector<double> t;
  cuda::Event a, b;
  for (int i = 0; i < reps; ++i) {
    a.record(s);
    fn();
    b.record(s);
    b.synchronize();
    t.push_back(b.elapsed_ms_since(a));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Holds the stream for `ns` nanoseconds of GPU time.
__global__ void spin_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// One step with stage markers, queued behind a 200 ms spin so that the host
// has enqueued the whole step before the GPU starts it: the stage times are
// GPU time without host launch gaps (events cannot be timed inside graphs).
void time_stages(DecodeState& st, cudaStream_t s) {
  spin_kernel<<<1, 1, 0, s>>>(200'000'000ull);
  KVT_CUDA_LAUNCH_CHECK("spin_kernel");
  st.step(s, true);
}

// Median step (ms) when each decode step is one CUDA-graph launch: two graphs
// are captured (the step alternates between two selection buffers) and
// replayed in turn, so there is no per-kernel launch cost on the host.
double time_graph_steps(DecodeState& st, cudaStream_t s, int reps) {
  cudaGraph_t g[2] = {nullptr, nullptr};
  cudaGraphExec_t ge[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    KVT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    st.step(s, false);
    KVT_CUDA_CHECK(cudaStreamEndCapture(s, &g[i]));
    KVT_CUDA_CHECK(cudaGraphInstantiate(&ge[i], g[i], 0));
  }
  int which = 0;
  const double ms = time_ms(s, reps, [&] {
    KVT_CUDA_CHECK(cudaGraphLaunch(ge[which], s));
    which ^= 1;
  });
  for (int i = 0; i < 2; ++i) {
    KVT_CUDA_CHECK(cudaGraphExecDestroy(ge[i]));
    KVT_CUDA_CHECK(cudaGraphDestroy(g[i]));
  }
  return ms;
}

struct KernelRow {
  std::string name, unit;
  double ms, achieved, limit;
};

std::vector<int32_t> sorted_selection(int64_t rows, int64_t n, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> idx(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> pick;
    std::uniform_int_distribution<int32_t> u(0, int32_t(n - 1));
    std::vector<char> used(size_t(n), 0);
    while (int(pick.size()) < k) {
      int32_t t = u(rng);
      if (!used[size_t(t)]) {
        used[size_t(t)] = 1;
        pick.push_back(t);
      }
    }
    std::sort(pick.begin(), pick.end());
    std::copy(pick.begin(), pick.end(), idx.begin() + r * k);
  }
  return idx;
}

std::vector<KernelRow> kernel_table(cudaStream_t s) {
  std::vector<KernelRow> rows;
  const int64_t T = 131072, KV = 8, hd = 128;
  // Limits measured here.
  double hbm_tbs, pcie_gbs, gemm_tflops;
  {
    DeviceBuffer a(size_t(4) << 30), b(size_t(4) << 30);
    cuda::fill_random_bytes(a.data(), int64_t(a.bytes()), 1, s);
    const double ms = time_ms(s, 10, [&] { KVT_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), a.bytes(), cudaMemcpyDeviceToDevice, s)); });
    hbm_tbs = 2.0 * double(a.bytes()) / ms / 1e9;
    rows.push_back({"HBM copy d2d 4 GiB (read+write)", "TB/s", ms, hbm_tbs, 4.30});
  }
  {
    PinnedBuffer h(size_t(2) << 30);
    DeviceBuffer d(size_t(2) << 30);
    std::memset(h.host(), 1, h.bytes());
    const double ms = time_ms(s, 5, [&] { KVT_CUDA_CHECK(cudaMemcpyAsync(d.data(), h.host(), h.bytes(), cudaMemcpyHostToDevice, s)); });
    pcie_gbs = double(h.bytes()) / ms / 1e6;
    rows.push_back({"pinned host->GPU memcpy 2 GiB", "GB/s", ms, pcie_gbs, 54.7});
  }
  {
    const int64_t n = 8192;
    DeviceBuffer a(size_t(n * n * 2)), b(size_t(n * n * 2)), c(size_t(n * n * 2));
    cuda::fill_uniform_bf16(a.data(), n * n, 2, -1, 1, s);
    cuda::fill_uniform_bf16(b.data(), n * n, 3, -1, 1, s);
    cuda::Gemm g;
    const double ms = time_ms(s, 10, [&] { g.run(n, n, n, a.data(), b.data(), c.data(), s); });
    gemm_tflops = 2.0 * n * n * n / ms / 1e9;
    rows.push_back({"bf16 GEMM 8192^3 (cuBLASLt)", "TFLOP/s", ms, gemm_tflops, 790});
  }
  // Scoring: 128K tokens x 8 KV heads, higgs2 (34 B) and bf16 chunk-8 landmarks.
  {
    IndexScoreParams p;
    p.n_kv_head = int(KV);
    p.n_tok = T;
    p.row_stride = (T * kHiggs2RecordBytes + 15) / 16 * 16;
    p.scale_offset = T * 32;  // codes plane, then scales plane
    DeviceBuffer idx(size_t(KV * p.row_stride)), q(size_t(KV * 4 * hd * 4)), grid(4096), sc(size_t(KV * T * 4));
    cuda::fill_random_bytes(idx.data(), int64_t(idx.bytes()), 4, s);
    cuda::fill_uniform_f32(q.data<float>(), KV * 4 * hd, 5, -1, 1, s);
    cuda::fill_uniform_f32(grid.data<float>(), 1024, 6, -2, 2, s);
    for (int nq : {1, 4}) {
      p.n_q = nq;
      const double ms = time_ms(s, 20, [&] {
        cuda::index_score(IndexElt::higgs2, p, q.data<float>(), idx.data<uint8_t>(), grid.data<float>(), sc.data<float>(), s);
      });
      const double bytes = double(KV * T * (kHiggs2RecordBytes + 4));
      rows.push_back({fmt::format("score higgs2 128K x 8 heads, n_q={}", nq), "TB/s", ms, bytes / ms / 1e9, hbm_tbs});
    }
    IndexScoreParams pb = p;
    pb.n_q = 4;
    pb.n_tok = T / 8;
    pb.row_stride = pb.n_tok * 256;
    DeviceBuffer lm(size_t(KV * pb.row_stride));
    cuda::fill_uniform_bf16(lm.data(), KV * pb.n_tok * hd, 7, -1, 1, s);
    const double ms = time_ms(s, 20, [&] {
      cuda::index_score(IndexElt::bf16, pb, q.data<float>(), lm.data<uint8_t>(), nullptr, sc.data<float>(), s);
    });
    rows.push_back({"score bf16 chunk-8 landmarks 128K x 8, n_q=4", "TB/s", ms,
                    double(KV * pb.n_tok * (256 + 4)) / ms / 1e9, hbm_tbs});
    // top-k 4096 of 128K per head
    DeviceBuffer out(size_t(KV * 4096 * 4));
    cuda::fill_uniform_f32(sc.data<float>(), KV * T, 8, -1, 1, s);
    const double tk = time_ms(s, 20, [&] { cuda::topk(sc.data<float>(), KV, T, T, 4096, 0, out.data<int32_t>(), s); });
    rows.push_back({"top-4096 of 128K x 8 heads", "TB/s", tk, double(KV * T * 4) / tk / 1e9, hbm_tbs});
  }
  // Gather 4096 tokens x 8 heads from a 128K-token pinned host store.
  for (int64_t entry : {256, 512}) {
    const int k = 4096;
    PinnedBuffer host(size_t(KV * T * entry));
    std::memset(host.host(), 3, host.bytes());
    auto sel = sorted_selection(KV, T, k, 9);
    DeviceBuffer d_sel(sel.size() * 4), dst(size_t(KV * k * entry));
    KVT_CUDA_CHECK(cudaMemcpy(d_sel.data(), sel.data(), sel.size() * 4, cudaMemcpyHostToDevice));
    GatherParams gp;
    gp.n_rows = KV;
    gp.k = k;
    gp.entry_bytes = entry;
    gp.src_tok_stride = entry;
    gp.src_row_stride = T * entry;
    gp.dst_row_stride = k * entry;
    const double bytes = double(KV * k * entry);
    const double zc = time_ms(s, 20, [&] {
      cuda::gather(gp, host.device_ptr<uint8_t>(), d_sel.data<int32_t>(), nullptr, nullptr, dst.data<uint8_t>(), nullptr, s);
    });
    rows.push_back({fmt::format("gather zero-copy {} B entries x 32768", entry), "GB/s", zc, bytes / zc / 1e6, pcie_gbs});
    const double mc = time_ms(s, 5, [&] {
      cuda::gather_memcpy(gp, host.host<uint8_t>(), sel.data(), dst.data<uint8_t>(), s, nullptr);
    });
    rows.push_back({fmt::format("gather cudaMemcpyBatchAsync {} B entries x 32768", entry), "GB/s", mc, bytes / mc / 1e6,
                    pcie_gbs});
  }
  // ShadowKV's key rebuild: 2048 selected tokens x 8 heads from a rank-160
  // SVD of 128K pre-RoPE keys, RoPE included.
  {
    LowrankKParams p;
    p.n_kv_head = int(KV);
    p.head_dim = int(hd);
    p.rank = 160;
    p.k = 2048;
    p.n_ctx = T;
    p.a_seq_stride = T * p.rank;
    p.b_seq_stride = int64_t(p.rank) * KV * hd;
    p.out_row_stride = int64_t(p.k) * hd;
    DeviceBuffer a(size_t(p.a_seq_stride * 2)), bm(size_t(p.b_seq_stride * 2)), out(size_t(KV * p.k * hd * 2)),
        inv(size_t(hd / 2 * 4));
    cuda::fill_uniform_bf16(a.data(), p.a_seq_stride, 14, -1, 1, s);
    cuda::fill_uniform_bf16(bm.data(), p.b_seq_stride, 15, -0.1f, 0.1f, s);
    cuda::fill_uniform_f32(inv.data<float>(), hd / 2, 16, 0, 1, s);
    auto sel = sorted_selection(KV, T, p.k, 17);
    DeviceBuffer d_sel(sel.size() * 4);
    KVT_CUDA_CHECK(cudaMemcpy(d_sel.data(), sel.data(), sel.size() * 4, cudaMemcpyHostToDevice));
    const double ms = time_ms(s, 20, [&] {
      cuda::lowrank_k(p, a.data(), bm.data(), d_sel.data<int32_t>(), inv.data<float>(), out.data(), s);
    });
    const double flops = 2.0 * double(KV * p.k) * p.rank * double(hd);
    rows.push_back({"rebuild keys: rank-160 SVD, 2048 x 8 heads (+RoPE)", "TFLOP/s", ms, flops / ms / 1e9, gemm_tflops});
  }
  // Decode attention over 128K bf16 tokens, batch 1 (32 q heads / 8 KV heads).
  {
    DeviceBuffer kv(size_t(2 * KV * T * hd * 2)), q(size_t(32 * hd * 2));
    cuda::fill_uniform_bf16(kv.data(), 2 * KV * T * hd, 10, -1, 1, s);
    cuda::fill_uniform_bf16(q.data(), 32 * hd, 11, -1, 1, s);
    DecodeAttnParams p;
    p.n_head = 32;
    p.n_kv_head = int(KV);
    p.scale = 1.f / std::sqrt(128.f);
    p.row_stride = T * hd * 2;
    p.tok_stride = hd * 2;
    p.n_tok = T;
    p.n_split = cuda::decode_attn_splits(KV, T);
    DeviceBuffer po(size_t(p.n_split) * 32 * hd * 4), pl(size_t(p.n_split) * 32 * 4), out(32 * hd * 2);
    const uint8_t* k = kv.data<uint8_t>();
    const double ms = time_ms(s, 20, [&] {
      cuda::decode_attn(p, q.data(), k, k + KV * T * hd * 2, nullptr, po.data<float>(), pl.data<float>(), s);
      cuda::attn_merge(p.n_split, 32, 128, po.data<float>(), pl.data<float>(), out.data(), nullptr, nullptr, s);
    });
    rows.push_back({"decode attention 128K bf16, batch 1 (+merge)", "TB/s", ms, double(kv.bytes()) / ms / 1e9, hbm_tbs});
  }
  // Prefill attention 32K causal, 32/8 heads.
  {
    const int64_t n = 32768, QKV = (32 + 16) * hd;
    DeviceBuffer qkv(size_t(n * QKV * 2)), out(size_t(n * 32 * hd * 2));
    cuda::fill_uniform_bf16(qkv.data(), n * QKV, 12, -1, 1, s);
    cuda::FlashPrefillParams p;
    p.n_head = 32;
    p.n_kv_head = 8;
    p.scale = 1.f / std::sqrt(128.f);
    p.n_q = p.n_kv = n;
    p.q_tok_stride = p.kv_tok_stride = QKV;
    p.out_tok_stride = 32 * hd;
    auto* b = qkv.data<uint16_t>();
    const double ms = time_ms(s, 3, [&] { cuda::flash_prefill(p, b, b + 32 * hd, b + 40 * hd, out.data(), s); });
    const double flops = 4.0 * double(n) * double(n) / 2 * hd * 32;
    rows.push_back({"flash prefill attention 32K causal (mma.sync)", "TFLOP/s", ms, flops / ms / 1e9, gemm_tflops});
  }
  return rows;
}

}  // namespace

void run_gpu_bench(const GpuBenchOptions& o) {
  KVT_CHECK(cuda_device_count() > 0, "gpu-bench: {}", cuda_device_summary());
  fmt::print("device: {}\n", cuda_device_summary());
  json out;
  out["device"] = cuda_device_summary();
  cuda::Stream stream;
  cudaStream_t s = stream.get();
  if (o.kernels) {
    auto rows = kernel_table(s);
    fmt::print("\n{:<52} {:>9} {:>10} {:>8} {:>7}\n", "kernel", "ms", "achieved", "limit", "%");
    for (auto& r : rows) {
      fmt::print("{:<52} {:>9.4f} {:>8.2f} {:<3} {:>6.1f} {:>6.1f}%\n", r.name, r.ms, r.achieved, r.unit, r.limit,
                 100 * r.achieved / r.limit);
      out["kernels"].push_back({{"name", r.name}, {"ms", r.ms}, {"achieved", r.achieved}, {"unit", r.unit}, {"limit", r.limit}});
    }
  }
  LlamaShape shape;
  shape.n_layer = o.n_layer;
  shape.n_embd = o.n_embd;
  shape.n_head = o.n_head;
  shape.n_kv_head = o.n_kv_head;
  shape.head_dim = o.head_dim;
  shape.n_ff = o.n_ff;
  shape.n_vocab = o.n_vocab;
  LlamaGpu model(shape, 1234);
  fmt::print("\nmodel: {} layers, hidden {}, {} heads / {} KV heads, FFN {}, vocab {}: {:.2f} GB of bf16 weights\n",
             shape.n_layer, shape.n_embd, shape.n_head, shape.n_kv_head, shape.n_ff, shape.n_vocab,
             double(model.weight_bytes()) / 1e9);
  out["weights_gb"] = double(model.weight_bytes()) / 1e9;
  if (o.prefill_tokens > 0) {
    const double ms = time_prefill(model, o.prefill_tokens, s);
    const double T = o.prefill_tokens;
    const double per_layer_params = double(shape.n_embd) * ((shape.n_head + 2 * shape.n_kv_head) * shape.head_dim +
                                                            shape.n_head * shape.head_dim + 3.0 * shape.n_ff);
    const double flops = shape.n_layer * (2 * T * per_layer_params + 4.0 * T * T / 2 * shape.head_dim * shape.n_head) +
                         2.0 * shape.n_embd * shape.n_vocab;
    fmt::print("prefill {} tokens: {:.1f} ms, {:.0f} tok/s, {:.0f} TFLOP/s ({:.0f}% of 790)\n", o.prefill_tokens, ms,
               T / ms * 1e3, flops / ms / 1e9, flops / ms / 1e9 / 7.9);
    out["prefill"] = {{"tokens", o.prefill_tokens}, {"ms", ms}, {"tok_per_s", T / ms * 1e3}, {"tflops", flops / ms / 1e9}};
  }
  fmt::print("\n{:<12} {:>7} {:>5} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9} {:>8} {:>8} {:>9} {:>6}\n", "policy",
             "ctx", "batch", "step ms", "graph ms", "score", "select", "gather", "attn", "rest", "tok/s", "GPU GB", "host GB", "PCIe MB",
             "hit%");
  for (int ctx : o.contexts)
    for (int b : o.batches)
      for (const auto& pol : o.policies) {
        DecodeConfig dc = decode_preset(pol);
        dc.n_seq = b;
        dc.n_ctx = ctx;
        json row = {{"policy", pol}, {"context", ctx}, {"batch", b}};
        try {
          DecodeState st(model, dc, 77);
          for (int i = 0; i < 3; ++i) st.step(s, false);
          cuda::Event a, e;
          std::vector<double> t;
          for (int i = 0; i < o.n_steps; ++i) {
            a.record(s);
            st.step(s, false);
            e.record(s);
            e.synchronize();
            t.push_back(e.elapsed_ms_since(a));
          }
          std::sort(t.begin(), t.end());
          const double step_ms = t[t.size() / 2];
          const double graph_ms = time_graph_steps(st, s, o.n_steps);
          time_stages(st, s);
          const StageTimes tm = st.stage_times();
          const uint64_t pcie = st.last_step_pcie_bytes();
          // Reuse hits: selected entries not read over PCIe (yakv's FP8 K|V and
          // shadowkv's bf16 V are both 2·head_dim bytes; shadowkv has no reuse: 0 %).
          const double all_bytes = dc.policy == Policy::full ? 0.0
                                                             : double(st.top_k()) * b * shape.n_kv_head *
                                                                   (2.0 * shape.head_dim) * shape.n_layer;
          const double hit = all_bytes > 0 ? 100.0 * (1 - double(pcie) / all_bytes) : 0;
          fmt::print("{:<12} {:>7} {:>5} {:>9.3f} {:>9.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>9.1f} {:>8.2f} {:>8.2f} {:>9.1f} {:>6.1f}\n",
                     pol, ctx, b, step_ms, graph_ms, tm.score, tm.select, tm.gather, tm.attention, tm.rest, b / graph_ms * 1e3,
                     double(st.gpu_bytes() + model.weight_bytes()) / 1e9, double(st.host_bytes()) / 1e9,
                     double(pcie) / 1e6, hit);
          row.update({{"step_ms", step_ms}, {"graph_step_ms", graph_ms}, {"score_ms", tm.score}, {"select_ms", tm.select}, {"gather_ms", tm.gather},
                      {"attention_ms", tm.attention}, {"rest_ms", tm.rest}, {"tok_per_s", b / graph_ms * 1e3},
                      {"gpu_gb", double(st.gpu_bytes() + model.weight_bytes()) / 1e9},
                      {"host_gb", double(st.host_bytes()) / 1e9}, {"pcie_bytes_per_step", pcie}, {"reuse_hit_pct", hit},
                      {"top_k", st.top_k()}, {"stage_ms_with_events", tm.score + tm.select + tm.gather + tm.attention + tm.rest}});
        } catch (const LimitError& e) {
          fmt::print("{:<12} {:>7} {:>5}  does not fit: {}\n", pol, ctx, b, e.what());
          row["error"] = e.what();
          cudaGetLastError();
        }
        out["decode"].push_back(row);
        std::fflush(stdout);
      }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    KVT_CHECK(f.good(), "gpu-bench: cannot write {}", o.json_path);
    f << out.dump(2) << "\n";
  }
}

}  // namespace kvtier::gpu
