// Writes seed corpora for the fuzz targets: small valid files from the test
// model writer (fuzz/seeds/<target>/, committed). Rebuild them with:
//   cmake --build build-fuzz --target fuzz_seeds && build-fuzz/fuzz_seeds fuzz/seeds
#include <filesystem>
#include <fstream>
#include <string>

#include "loader/test_model_writer.h"

using namespace kvtier;

static void save(const std::filesystem::path& p, const std::vector<uint8_t>& b) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

int main(int argc, char** argv) {
  std::filesystem::path root = argc > 1 ? argv[1] : "fuzz/seeds";
  std::vector<float> v(64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.125f - 4.0f;
  std::vector<WriterTensor> gt = {make_tensor("a", GgmlType::Q4_1, {2, 32}, v),
                                  make_tensor("b", GgmlType::F32, {4}, {1, 2, 3, 4})};
  GgufMetadata meta = {
      {"general.architecture", GgufMetaValue::str("llama")},
      {"llama.block_count", GgufMetaValue::u32(2)},
      {"f", GgufMetaValue::f32(0.5f)},
      {"toks", GgufMetaValue::str_array({"a", "bc"})},
      {"ids", GgufMetaValue::i32_array({1, 2, 3})},
      {"nest", GgufMetaValue::array(GgufValueType::ARRAY, {GgufMetaValue::i32_array({1})})},
      {"flag", GgufMetaValue::boolean(true)},
  };
  save(root / "gguf" / "v3.gguf", encode_gguf(meta, gt));
  save(root / "gguf" / "v2_align64.gguf", encode_gguf(meta, gt, {2, 64}));
  save(root / "gguf" / "empty.gguf", encode_gguf({}, {}));
  std::vector<WriterTensor> st = {make_tensor("x", GgmlType::F32, {2, 2}, {1, 2, 3, 4}),
                                  make_tensor("y", GgmlType::BF16, {3}, {1, 2, 3}),
                                  make_tensor("z", GgmlType::F16, {}, {5})};
  save(root / "safetensors" / "small.safetensors", encode_safetensors(st, {{"format", "pt"}}));
  save(root / "safetensors" / "empty.safetensors", encode_safetensors({}));
  return 0;
}
