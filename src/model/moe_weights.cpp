// Binding of a MoE layer's experts: views into the memory-mapped source, one
// per expert and matrix, whatever the checkpoint's layout.
#include <fmt/format.h>

#include "core/status.h"
#include "model/model.h"

namespace kvtier {
namespace {

WeightView view_2d(const TensorRef& t) {
  KVT_CHECK(t.shape.size() == 2, "{}: expected a matrix, found {} dims", t.source, t.shape.size());
  WeightView w{t.type, t.data, t.shape[0], t.shape[1], ggml_row_bytes(t.type, t.shape[1])};
  KVT_CHECK(w.row_bytes * size_t(w.n_out) <= t.n_bytes, "{}: {} bytes, expected {}", t.source, t.n_bytes,
            w.row_bytes * size_t(w.n_out));
  return w;
}

// Expert e of a stacked [n_expert, rows, cols] tensor.
WeightView view_slice(const TensorRef& t, int64_t e) {
  KVT_CHECK(t.shape.size() == 3 && e < t.shape[0], "{}: expected [n_expert > {}, rows, cols]", t.source, e);
  const size_t row_bytes = ggml_row_bytes(t.type, t.shape[2]);
  const size_t expert_bytes = row_bytes * size_t(t.shape[1]);
  KVT_CHECK(expert_bytes * size_t(t.shape[0]) <= t.n_bytes, "{}: {} bytes, expected {}", t.source, t.n_bytes,
            expert_bytes * size_t(t.shape[0]));
  return WeightView{t.type, t.data + size_t(e) * expert_bytes, t.shape[1], t.shape[2], row_bytes};
}

}  // namespace

MoeWeights view_experts(const ModelSource& src, int layer) {
  const ModelConfig& c = src.config;
  auto name = [layer](const std::string& s) { return fmt::format("blk.{}.{}", layer, s); };
  MoeWeights w;
  w.router = view_2d(src.tensor(name("ffn_gate_inp.weight")));
  const char* mats[] = {"ffn_gate", "ffn_up", "ffn_down"};
  std::vector<WeightView>* dst[] = {&w.gate, &w.up, &w.down};
  for (int m = 0; m < 3; ++m) {
    const TensorRef* stacked = src.find(name(fmt::format("{}_exps.weight", mats[m])));
    for (int e = 0; e < c.n_expert; ++e)
      dst[m]->push_back(stacked ? view_slice(*stacked, e)
                                : view_2d(src.tensor(name(fmt::format("{}.{}.weight", mats[m], e)))));
  }
  for (int e = 0; e < c.n_expert; ++e)
    KVT_CHECK(w.gate[size_t(e)].n_out == c.n_ff_expert && w.gate[size_t(e)].n_in == c.n_embd &&
                  w.up[size_t(e)].n_out == c.n_ff_expert && w.up[size_t(e)].n_in == c.n_embd &&
                  w.down[size_t(e)].n_out == c.n_embd && w.down[size_t(e)].n_in == c.n_ff_expert,
              "{}: layer {} expert {} shapes do not match the config ({} x {})", src.path, layer, e, c.n_ff_expert,
              c.n_embd);
  return w;
}

MoeConfig moe_config(const ModelConfig& c) {
  MoeConfig m;
  m.n_embd = c.n_embd;
  m.n_ff = c.n_ff_expert;
  m.n_expert = c.n_expert;
  m.n_expert_used = c.n_expert_used;
  m.norm_topk = c.expert_norm_topk;
  m.scale = c.expert_weights_scale;
  return m;
}

}  // namespace kvtier
