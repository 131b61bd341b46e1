// Kernel-lab driver: the same harness as `kvtier gpu-bench` without the rest
// of the CLI (built by hand when the full tree does not link; see NOTES.md).
// usage: gpu_bench_main LAYERS CONTEXTS BATCHES POLICIES PREFILL STEPS KERNELS(0/1) JSON
#include <fmt/format.h>

#include <cstdlib>
#include <sstream>

#include "core/status.h"
#include "gpu/gpu_bench.h"

template <class T>
std::vector<T> split(const char* s) {
  std::vector<T> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if constexpr (std::is_same_v<T, int>) v.push_back(std::stoi(item));
    else v.push_back(item);
  }
  return v;
}

int main(int argc, char** argv) {
  if (argc != 9) {
    fmt::print(stderr, "usage: {} LAYERS CONTEXTS BATCHES POLICIES PREFILL STEPS KERNELS JSON\n", argv[0]);
    return 2;
  }
  kvtier::gpu::GpuBenchOptions o;
  o.n_layer = std::atoi(argv[1]);
  o.contexts = split<int>(argv[2]);
  o.batches = split<int>(argv[3]);
  o.policies = split<std::string>(argv[4]);
  o.prefill_tokens = std::atoi(argv[5]);
  o.n_steps = std::atoi(argv[6]);
  o.kernels = std::atoi(argv[7]) != 0;
  o.json_path = argv[8];
  try {
    kvtier::gpu::run_gpu_bench(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
