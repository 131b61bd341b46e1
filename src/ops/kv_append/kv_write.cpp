// kv_write's dispatcher (kv_write.h).
#include <vector>

#include "core/status.h"
#include "ops/index_score/index_rows.h"
#include "ops/kv_append/kv_write.h"
#ifdef KVT_CUDA
#include "ops/kv_append/kv_write_cuda.h"
#endif

namespace kvtier {

void resident_write(const Exec& x, const ResidentWriteParams& p, const void* k, const void* v, const int64_t* pos0,
                    uint8_t* const* rows) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::resident_write(x, p, k, v, pos0, rows);
#endif
  KVT_CHECK(!x.cuda(), "resident_write: built without CUDA");
  note_cpu_decode_op();
  resident_write_cpu(p, static_cast<const float*>(k), static_cast<const float*>(v), pos0, rows);
}

void host_write(const Exec& x, const HostWriteParams& p, const void* k, const void* k_pre, const void* v,
                const int64_t* pos0, uint8_t* const* host, uint8_t* const* kplane, const int64_t* key_first) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::host_write(x, p, k, k_pre, v, pos0, host, kplane, key_first);
#endif
  KVT_CHECK(!x.cuda(), "host_write: built without CUDA");
  note_cpu_decode_op();
  host_write_cpu(p, static_cast<const float*>(k), static_cast<const float*>(k_pre), static_cast<const float*>(v), pos0,
                 host, kplane, key_first);
}

void index_write(const Exec& x, const IndexWriteParams& p, const void* k, const int64_t* pos0, uint8_t* const* plane0,
                 uint8_t* const* plane1, uint8_t* const* resident, float* const* stats) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::index_write(x, p, k, pos0, plane0, plane1, resident, stats);
#endif
  KVT_CHECK(!x.cuda(), "index_write: built without CUDA");
  note_cpu_decode_op();
  index_write_cpu(p, static_cast<const float*>(k), pos0, plane0, plane1, resident, stats);
}

void round_rows(const Exec& x, const RecordFormat& fmt, void* rows, int64_t n, int64_t stride, const int64_t* pos) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::round_rows(x, fmt, rows, n, stride, pos);
#endif
  KVT_CHECK(!x.cuda(), "round_rows: built without CUDA");
  std::vector<uint8_t> rec(size_t(fmt.bytes));
  for (int64_t i = 0; i < n; ++i) {
    float* r = static_cast<float*>(rows) + ((pos ? *pos : 0) + i) * stride;
    quantize(fmt.spec, r, 1, fmt.dim, rec.data());
    dequantize(fmt.spec, rec.data(), 1, fmt.dim, r);
  }
}

float nvfp4_scale_of(const Exec& x, const void* data, int64_t n) {
#ifdef KVT_CUDA
  if (x.cuda()) {
    Buffer amax(DeviceKind::cuda, MemKind::device, 4);
    fill(x, amax.data(), 0, 4);
    cuda::amax_bf16(x, data, n, amax.data<float>());
    float a = 0;
    copy(x, &a, amax.data(), 4);
    sync(x);
    return a > 0 ? a / (448.f * 6.f) : 1.f;
  }
#endif
  KVT_CHECK(!x.cuda(), "nvfp4_scale_of: built without CUDA");
  return nvfp4_tensor_scale(static_cast<const float*>(data), n);
}

}  // namespace kvtier
