// kvtier: one binary, many subcommands (run, serve, bench, score, analyze, memory...).
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <new>

#include "command.h"
#include "core/status.h"

namespace kvtier::tools {

std::vector<std::pair<int, CommandSetup>>& command_registry() {
  static std::vector<std::pair<int, CommandSetup>> registry;
  return registry;
}

Registration::Registration(int order, CommandSetup setup) {
  command_registry().emplace_back(order, std::move(setup));
}

int& command_exit_code() {
  static int code = 0;
  return code;
}

namespace {

int out_of_memory(const CLI::App& app, const char* what) {
  const auto* sub = app.get_subcommands().empty() ? nullptr : app.get_subcommands().front();
  fmt::print(stderr,
             "error: out of memory ({}) in `kvtier {}`: the model, the context (-c), the prompt, "
             "--prefill-chunk or the KV policy needs more memory than this machine can give; try a smaller "
             "-c, --prefill-chunk or prompt, or a policy that keeps less in memory (see `kvtier memory`)\n",
             what, sub ? sub->get_name() : "");
  return 1;
}

}  // namespace
}  // namespace kvtier::tools

int main(int argc, char** argv) {
  using namespace kvtier::tools;
  CLI::App app{"kvtier: long-context LLM inference with a tiered, offloaded KV cache"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvtier 0.1.0");
  auto& reg = command_registry();
  std::stable_sort(reg.begin(), reg.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [order, setup] : reg) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kvtier::OutOfMemoryError& e) {
    return out_of_memory(app, e.what());
  } catch (const kvtier::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    return out_of_memory(app, "std::bad_alloc");
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return command_exit_code();
}
