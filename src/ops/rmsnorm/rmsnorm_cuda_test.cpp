#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/rmsnorm/rmsnorm_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

TEST(RmsnormCuda, FusedAddMatchesReference) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(3);
  for (int dim : {64, 576, 4096, 8192})
    for (bool with_delta : {false, true}) {
      const int64_t n = 5;
      auto x = random_bf16(size_t(n * dim), rng, -3.f, 3.f), d = random_bf16(size_t(n * dim), rng);
      auto w = random_bf16(size_t(dim), rng, 0.5f, 1.5f);
      std::vector<float> xs(x.size());
      for (size_t i = 0; i < x.size(); ++i)
        xs[i] = with_delta ? bf16_to_f32(f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(d[i]))) : bf16_to_f32(x[i]);
      auto wf = bf16_to_f32_vec(w);
      std::vector<float> ref(x.size());
      rmsnorm_ref(xs.data(), wf.data(), n, dim, 1e-5f, ref.data());
      auto dx = to_device(x), dd = to_device(d), dw = to_device(w);
      DeviceBuffer dy(x.size() * 2);
      poison(dy);
      add_rmsnorm(dx.data(), with_delta ? dd.data() : nullptr, dw.data(), n, dim, 1e-5f, dy.data(), nullptr);
      auto y = bf16_to_f32_vec(to_host<uint16_t>(dy, x.size()));
      auto xo = bf16_to_f32_vec(to_host<uint16_t>(dx, x.size()));
      EXPECT_LT(rel_l2(y.data(), ref.data(), y.size()), 5e-3) << dim;
      EXPECT_EQ(rel_l2(xo.data(), xs.data(), xs.size()), 0.0) << "residual stream";
    }
}

}  // namespace
}  // namespace kvtier::cuda
