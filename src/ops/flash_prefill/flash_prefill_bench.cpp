// Flash-prefill attention at Llama-3.1-8B shapes: 32 query heads, 8 KV heads,
// head_dim 128, q|k|v interleaved per token as the model's QKV projection
// writes them, causal with n_q = n_kv. For each kernel (outer loop, so that a
// kernel that fails cannot hide the rows printed before it) and each length:
// the median and minimum of CUDA-event timings with the L2 flushed before
// every repetition, TFLOP/s against a given peak, the rel-L2 error against an
// f64 CPU reference on three sampled query rows (first, middle, last; all
// heads), and against the first kernel listed on the first, middle and last
// 128 rows. Speed belongs here, not in the tests.
//
// usage: kvt_flash_prefill_bench [--lengths 8192,32768,131072]
//            [--kernels mma_sync,wgmma,wgmma_serial] [--reps 5] [--peak 790] [--json out.json]
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/cuda_device.h"
#include "ops/bench_args.h"
#include "ops/bench_timing_cuda.h"
#include "core/half.h"
#include "ops/flash_prefill/flash_prefill_cuda.h"

namespace kvtier::cuda {
namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHd = 128;
constexpr int64_t kQW = int64_t(kHeads) * kHd, kKvW = int64_t(kKvHeads) * kHd, kRowW = kQW + 2 * kKvW;
constexpr int64_t kSampleRows = 128;

struct Options {
  std::vector<int64_t> lengths = {8192, 32768, 131072};
  std::vector<FlashPrefillKernel> kernels = {FlashPrefillKernel::mma_sync, FlashPrefillKernel::wgmma,
                                             FlashPrefillKernel::wgmma_serial};
  int reps = 5;
  double peak_tflops = 790;
  std::string json_path;
};

FlashPrefillKernel parse_kernel(const std::string& s) {
  for (auto k : {FlashPrefillKernel::automatic, FlashPrefillKernel::mma_sync, FlashPrefillKernel::wgmma,
                 FlashPrefillKernel::wgmma_serial})
    if (s == flash_prefill_kernel_name(k)) return k;
  fail("unknown kernel '{}' (automatic, mma_sync, wgmma, wgmma_serial)", s);
}

Options parse(int argc, char** argv) {
  Options o;
  for_each_option(argc, argv, [&](const std::string& a, const std::string& val) {
    if (a == "--lengths") {
      o.lengths.clear();
      for (auto& x : split_list(val)) o.lengths.push_back(std::stoll(x));
    } else if (a == "--kernels") {
      o.kernels.clear();
      for (auto& x : split_list(val)) o.kernels.push_back(parse_kernel(x));
    } else if (a == "--reps") {
      o.reps = std::stoi(val);
    } else if (a == "--peak") {
      o.peak_tflops = std::stod(val);
    } else if (a == "--json") {
      o.json_path = val;
    } else {
      fail("unknown option {} (--lengths, --kernels, --reps, --peak, --json)", a);
    }
  });
  KVT_CHECK(o.reps >= 1 && !o.lengths.empty() && !o.kernels.empty(), "nothing to time");
  for (int64_t n : o.lengths) KVT_CHECK(n >= kSampleRows * 3, "length {} below {}", n, kSampleRows * 3);
  return o;
}

// The rows the checks look at: three blocks of kSampleRows.
std::vector<int64_t> sample_starts(int64_t n) { return {0, n / 2, n - kSampleRows}; }

// out rows of the sample blocks, [3 * kSampleRows, kQW] as f32.
std::vector<float> sample_rows(const DeviceBuffer& out, int64_t n) {
  std::vector<float> v;
  std::vector<uint16_t> h(size_t(kSampleRows * kQW));
  for (int64_t r0 : sample_starts(n)) {
    KVT_CUDA_CHECK(cudaMemcpy(h.data(), out.data<uint16_t>() + r0 * kQW, h.size() * 2, cudaMemcpyDeviceToHost));
    for (uint16_t x : h) v.push_back(bf16_to_f32(x));
  }
  return v;
}

// f64 reference of query rows {0, n/2, n-1}, all heads: [3, kQW].
std::vector<double> reference_rows(const DeviceBuffer& qkv, int64_t n, float scale) {
  std::vector<uint16_t> kv(size_t(n * 2 * kKvW));  // [n, k | v] of every token
  KVT_CUDA_CHECK(cudaMemcpy2D(kv.data(), size_t(2 * kKvW * 2), qkv.data<uint16_t>() + kQW, size_t(kRowW * 2),
                              size_t(2 * kKvW * 2), size_t(n), cudaMemcpyDeviceToHost));
  const int64_t rows[3] = {0, n / 2, n - 1};
  std::vector<uint16_t> q(size_t(3 * kQW));
  for (int i = 0; i < 3; ++i)
    KVT_CUDA_CHECK(cudaMemcpy(q.data() + i * kQW, qkv.data<uint16_t>() + rows[i] * kRowW, size_t(kQW * 2),
                              cudaMemcpyDeviceToHost));
  std::vector<double> ref(size_t(3 * kQW));
  std::atomic<int> next{0};
  auto work = [&] {
    std::vector<double> s(static_cast<size_t>(n)), acc(static_cast<size_t>(kHd));
    for (int task; (task = next.fetch_add(1)) < 3 * kHeads;) {
      const int i = task / kHeads, h = task % kHeads, g = h / (kHeads / kKvHeads);
      const uint16_t* qh = &q[size_t(i * kQW + h * kHd)];
      const int64_t n_vis = rows[i] + 1;
      double mx = -INFINITY;
      for (int64_t j = 0; j < n_vis; ++j) {
        const uint16_t* kj = &kv[size_t(j * 2 * kKvW + g * kHd)];
        double dot = 0;
        for (int d = 0; d < kHd; ++d) dot += double(bf16_to_f32(qh[d])) * bf16_to_f32(kj[d]);
        s[size_t(j)] = dot * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n_vis; ++j) {
        const double p = std::exp(s[size_t(j)] - mx);
        sum += p;
        const uint16_t* vj = &kv[size_t(j * 2 * kKvW + kKvW + g * kHd)];
        for (int d = 0; d < kHd; ++d) acc[size_t(d)] += p * bf16_to_f32(vj[d]);
      }
      for (int d = 0; d < kHd; ++d) ref[size_t(i * kQW + h * kHd + d)] = acc[size_t(d)] / sum;
    }
  };
  std::vector<std::thread> pool;
  const int n_threads = int(std::max(1u, std::min(32u, std::thread::hardware_concurrency())));
  for (int t = 0; t < n_threads; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  return ref;
}

// ‖a − b‖ / ‖b‖, infinity when a has a value that is not finite.
template <class A, class B>
double rel_err(const A& a, const B& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(double(a[i]))) return INFINITY;
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

int run(const Options& o) {
  KVT_CHECK(cuda_device_count() > 0, "{}", cuda_device_summary());
  fmt::print("device: {}\n", cuda_device_summary());
  fmt::print("shapes: {} query heads, {} KV heads, head_dim {}, fused QKV rows of {} elements, causal n_q = n_kv\n",
             kHeads, kKvHeads, kHd, kRowW);
  fmt::print("timing: median (min) of {} CUDA-event timings after a warm-up, L2 flushed before each\n\n", o.reps);
  fmt::print("{:<13} {:>7} {:>10} {:>10} {:>8} {:>7} {:>11} {:>11}  {}\n", "kernel", "tokens", "median ms", "min ms",
             "TFLOP/s", "% peak", "err vs f64", "err vs 1st", "verdict");
  std::fflush(stdout);
  nlohmann::json js;
  js["device"] = cuda_device_summary();
  js["peak_tflops"] = o.peak_tflops;
  Stream stream;
  cudaStream_t s = stream.get();
  DeviceBuffer flush(size_t(256) << 20);  // > the 60 MB L2
  std::map<int64_t, std::vector<double>> refs;       // reference rows per length
  std::map<int64_t, std::vector<float>> first_rows;  // the first kernel's sampled rows per length
  int bad = 0;
  for (size_t ki = 0; ki < o.kernels.size(); ++ki) {
    const FlashPrefillKernel kern = o.kernels[ki];
    const char* name = flash_prefill_kernel_name(kern);
    if (!flash_prefill_kernel_available(kern, kHd)) {
      fmt::print("{:<13} not available on this device/build\n", name);
      continue;
    }
    for (int64_t n : o.lengths) {
      DeviceBuffer qkv(size_t(n * kRowW * 2)), out(size_t(n * kQW * 2));
      fill_uniform_bf16(qkv.data(), n * kRowW, 1234 + uint64_t(n), -1.f, 1.f, s);
      KVT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, out.bytes(), s));  // poison: unwritten rows show as NaN
      FlashPrefillParams p;
      p.n_head = kHeads;
      p.n_kv_head = kKvHeads;
      p.head_dim = kHd;
      p.scale = 1.f / std::sqrt(float(kHd));
      p.n_q = p.n_kv = n;
      p.q_tok_stride = p.kv_tok_stride = kRowW;
      p.out_tok_stride = kQW;
      p.kernel = kern;
      const auto* b = qkv.data<uint16_t>();
      auto launch = [&] { flash_prefill(p, b, b + kQW, b + kQW + kKvW, out.data(), s); };
      launch();  // warm-up: module load, attributes
      KVT_CUDA_CHECK(cudaStreamSynchronize(s));
      const std::vector<double> t = time_launches_ms(s, o.reps, flush.data(), flush.bytes(), launch);
      const double med = t[t.size() / 2];
      const double pairs = double(n) * double(n + 1) / 2;  // visible (query, key) pairs
      const double tflops = 4.0 * kHd * kHeads * pairs / (med * 1e-3) / 1e12;

      if (!refs.count(n)) refs[n] = reference_rows(qkv, n, p.scale);
      auto rows = sample_rows(out, n);
      std::vector<float> three(size_t(3 * kQW));  // the rows the reference has: 0, n/2, n-1
      std::copy_n(rows.begin(), kQW, three.begin());
      std::copy_n(rows.begin() + kSampleRows * kQW, kQW, three.begin() + kQW);
      std::copy_n(rows.end() - kQW, kQW, three.begin() + 2 * kQW);
      const double err_ref = rel_err(three, refs[n]);
      double err_first = 0;
      if (!first_rows.count(n))
        first_rows[n] = rows;
      else
        err_first = rel_err(rows, first_rows[n]);
      const bool ok = err_ref < 1e-2 && err_first < 1e-2;
      bad += !ok;
      fmt::print("{:<13} {:>7} {:>10.3f} {:>10.3f} {:>8.1f} {:>6.1f}% {:>11.2e} {:>11.2e}  {}\n", name, n, med, t[0],
                 tflops, 100 * tflops / o.peak_tflops, err_ref, err_first, ok ? "ok" : "WRONG");
      std::fflush(stdout);
      js["rows"].push_back({{"kernel", name}, {"tokens", n}, {"median_ms", med}, {"min_ms", t[0]}, {"tflops", tflops},
                            {"pct_peak", 100 * tflops / o.peak_tflops}, {"err_vs_f64", err_ref},
                            {"err_vs_first", err_first}, {"times_ms", t}});
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    KVT_CHECK(f.good(), "cannot write {}", o.json_path);
    f << js.dump(2) << "\n";
  }
  if (bad) fmt::print("\n{} row(s) WRONG\n", bad);
  return bad ? 1 : 0;
}

}  // namespace
}  // namespace kvtier::cuda

int main(int argc, char** argv) {
  try {
    return kvtier::cuda::run(kvtier::cuda::parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
