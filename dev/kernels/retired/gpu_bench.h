// `kvtier gpu-bench`: a random-weight Llama-shaped model built directly on the
// GPU, timed for prefill and for the decode step of the `full`, `shadowkv`
// and `yakv` policies (per-stage CUDA-event breakdown, bytes over PCIe,
// memory), plus a kernel table against the measured hardware limits.
#pragma once
#include <string>
#include <vector>

namespace kvtier::gpu {

struct GpuBenchOptions {
  int n_layer = 32;          // Llama-3.1-8B: 32; fewer to save time (per-layer costs scale)
  int n_embd = 4096;
  int n_head = 32;
  int n_kv_head = 8;
  int head_dim = 128;
  int n_ff = 14336;
  int n_vocab = 128256;
  std::vector<int> contexts = {131072, 32768, 65536};  // tokens
  std::vector<int> batches = {1};
  std::vector<std::string> policies = {"full", "yakv", "shadowkv"};
  int prefill_tokens = 32768;  // 0: skip the prefill measurement
  int n_steps = 8;             // timed decode steps per configuration (median reported)
  bool kernels = true;         // also the kernel table
  std::string json_path;       // write all results here when not empty
};

// Prints the tables to stdout; throws kvtier::Error (LimitError when a
// configuration does not fit) on failure; without CUDA always throws.
void run_gpu_bench(const GpuBenchOptions& opts);

}  // namespace kvtier::gpu
