// libFuzzer target: the safetensors header parser on arbitrary bytes. Any input
// must either parse (and every tensor's bytes be readable) or throw kvtier::Error.
#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto st = kvtier::SafetensorsFile::parse(data, size, "fuzz.safetensors");
    volatile uint64_t sink = 0;
    for (const auto& t : st->tensors()) {
      sink = sink + uint64_t(t.n_elements()) + t.dtype.size();
      if (t.n_bytes > 0) sink = sink + t.data[0] + t.data[t.n_bytes - 1];
      sink = sink + (st->find(t.name) == &t);
    }
  } catch (const kvtier::Error&) {
  }
  return 0;
}
