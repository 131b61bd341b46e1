#include "kv/kv_store.h"

#include "core/status.h"
#include "kv/policy.h"
#include "kv/full_kv.h"
#include "kv/tiered_store.h"

namespace kvtier {

const KvGeometry& checked_geometry(const KvGeometry& g) {
  KVT_CHECK(g.n_layer > 0 && g.n_head > 0 && g.n_kv_head > 0 && g.head_dim > 0 && g.n_head % g.n_kv_head == 0,
            "kv store: geometry n_layer={} n_head={} n_kv_head={} head_dim={} is not valid "
            "(positive, n_head a multiple of n_kv_head)",
            g.n_layer, g.n_head, g.n_kv_head, g.head_dim);
  return g;
}

std::unique_ptr<KvStore> make_kv_store(const std::string& policy, const KvGeometry& geometry) {
  PolicyConfig p = parse_policy(policy);
  if (p.index == IndexKind::none) return std::make_unique<FullKvStore>(p, geometry);
  return std::make_unique<TieredKvStore>(p, geometry);
}

}  // namespace kvtier
