// write_tiny_moe_gguf OUT_DIR: the tiny MoE GGUFs of tests/tiny_moe_models.h
// as OUT_DIR/<name>.gguf (for scripts/gen_llama_cpp_moe_golden.py).
#include <cstdio>
#include <exception>
#include <filesystem>

#include "tiny_moe_models.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    std::filesystem::create_directories(argv[1]);
    for (const auto& name : kvtier::testing::tiny_moe_model_names()) {
      const std::string path = std::string(argv[1]) + "/" + name + ".gguf";
      kvtier::testing::write_tiny_moe_gguf(name, path);
      std::printf("%s %016llx\n", path.c_str(), (unsigned long long)kvtier::testing::file_fnv1a(path));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
