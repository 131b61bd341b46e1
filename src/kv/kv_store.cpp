#include "kv/kv_store.h"

#include "kv/policy.h"
#include "kv/full_kv.h"
#include "kv/tiered_store.h"

namespace kvtier {

std::unique_ptr<KvStore> make_kv_store(const std::string& policy, const KvGeometry& geometry) {
  PolicyConfig p = parse_policy(policy);
  if (p.index == IndexKind::none) return std::make_unique<FullKvStore>(p, geometry);
  return std::make_unique<TieredKvStore>(p, geometry);
}

}  // namespace kvtier
