#include "ops/attention/prefill_attention.h"

#include "core/status.h"
#ifdef KVT_CUDA
#include "ops/flash_prefill/flash_prefill_cuda.h"
#endif

namespace kvtier {

void prefill_attention(const Exec& x, const AttentionParams& p, const void* q, int64_t q_stride, int64_t n_q,
                       const void* k, const void* v, int64_t kv_stride, int64_t n_kv, void* out, int64_t out_stride) {
#ifdef KVT_CUDA
  if (x.cuda()) {
    cuda::FlashPrefillParams fp;
    fp.n_head = p.n_head;
    fp.n_kv_head = p.n_kv_head;
    fp.head_dim = p.head_dim;
    fp.scale = p.scale;
    fp.n_q = n_q;
    fp.n_kv = n_kv;
    fp.q_tok_stride = q_stride;
    fp.kv_tok_stride = kv_stride;
    fp.out_tok_stride = out_stride;
    cuda::flash_prefill(fp, q, k, v, out, static_cast<cudaStream_t>(x.stream));
    return;
  }
#endif
  KVT_CHECK(!x.cuda(), "prefill_attention: built without CUDA");
  KVT_CHECK(q_stride == int64_t(p.n_head) * p.head_dim && kv_stride == int64_t(p.n_kv_head) * p.head_dim &&
                out_stride == q_stride,
            "prefill_attention (CPU): rows must be dense (q {} kv {} out {})", q_stride, kv_stride, out_stride);
  attention_causal(p, static_cast<const float*>(q), int(n_q), static_cast<const float*>(k),
                   static_cast<const float*>(v), n_kv, static_cast<float*>(out));
}

}  // namespace kvtier
