// libFuzzer target: the GGUF header parser on arbitrary bytes. Any input must
// either parse (and then every exposed byte must be readable) or throw
// kvtier::Error; anything else (crash, sanitizer report, other exception) is a bug.
#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "loader/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto g = kvtier::GgufFile::parse(data, size, "fuzz.gguf");
    volatile uint64_t sink = 0;
    for (const auto& key : g->keys()) {
      auto type = g->type_of(key);
      try {
        if (type == kvtier::GgufValueType::STRING) sink = sink + g->get_string(key)->size();
        if (type == kvtier::GgufValueType::ARRAY) {
          sink = sink + g->get_string_array(key).size();
        } else {
          sink = sink + (g->get_float(key).value_or(0.0) > 0.0);
        }
      } catch (const kvtier::Error&) {  // type mismatches are expected here
      }
      try {
        sink = sink + g->get_int_array(key).size() + g->get_float_array(key).size();
      } catch (const kvtier::Error&) {
      }
    }
    for (const auto& t : g->tensors())
      for (size_t i = 0; i < t.n_bytes; i += 64) sink = sink + t.data[i];
  } catch (const kvtier::Error&) {
  }
  return 0;
}
