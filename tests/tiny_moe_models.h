// Tiny random mixture-of-experts GGUF models with a minimal byte-level
// vocabulary, written identically by the llama.cpp parity test and by
// write_tiny_moe_gguf (the tool scripts/gen_llama_cpp_moe_golden.py runs to
// get the same files for llama.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::testing {

// The models' names, in a fixed order.
std::vector<std::string> tiny_moe_model_names();
// Writes model `name` to `path` (deterministic bytes). Throws for an unknown name.
void write_tiny_moe_gguf(const std::string& name, const std::string& path);
// FNV-1a 64 of a file's bytes, to check that the test and the golden saw the same file.
uint64_t file_fnv1a(const std::string& path);

}  // namespace kvtier::testing
