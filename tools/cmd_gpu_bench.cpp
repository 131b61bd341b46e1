// `kvtier gpu-bench`: random-weight Llama-shaped model on the GPU; kernel
// table, prefill, decode step per policy (see src/gpu/gpu_bench.h).
#include "command.h"
#include "gpu/gpu_bench.h"

namespace kvtier::tools {
namespace {

Registration reg(60, [](CLI::App& app) {
  auto opts = std::make_shared<gpu::GpuBenchOptions>();
  auto* cmd = app.add_subcommand("gpu-bench", "GPU decode/prefill benchmark on a random-weight Llama-3.1-8B-shaped model");
  cmd->add_option("--layers", opts->n_layer, "decoder layers (32 = Llama-3.1-8B)")->check(CLI::Range(1, 128));
  cmd->add_option("--contexts", opts->contexts, "context lengths in tokens")->delimiter(',');
  cmd->add_option("--batches", opts->batches, "batch sizes")->delimiter(',');
  cmd->add_option("--policies", opts->policies, "full, shadowkv, yakv, yakv-noreuse")->delimiter(',');
  cmd->add_option("--prefill", opts->prefill_tokens, "prefill tokens to time (0 = skip)");
  cmd->add_option("--steps", opts->n_steps, "timed decode steps per configuration")->check(CLI::Range(1, 1000));
  cmd->add_flag("!--no-kernels", opts->kernels, "skip the kernel table");
  cmd->add_option("--json", opts->json_path, "write results as JSON");
  cmd->callback([opts] { gpu::run_gpu_bench(*opts); });
});

}  // namespace
}  // namespace kvtier::tools
