// quant_dev.cuh on the GPU against the CPU quantizer, on quant_dev_check.h's
// grid (every kind, groups, dims 64…1024 and layer-wide 8192, random signs,
// every HIGGS width and more grids): records byte-identical (device memory,
// and mapped pinned host memory at an odd offset), dequantized values
// identical, scores within 1e-5·‖q‖·‖x̂‖. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "backend/cuda_test_util.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_dev_check.h"
#include "ops/quant/quant_dev_test_kernels.h"

namespace kvtier::cuda {
namespace {
using namespace quant_dev_testing;
using namespace testing;

constexpr uint8_t kGuard = 0xa5;
constexpr int kGuardBytes = 16;

// Records at p.offset in device memory or mapped pinned host memory, guard
// bytes around them.
class RecordBuffer {
 public:
  RecordBuffer(const Placement& p, size_t bytes) : offset_(size_t(p.offset)), bytes_(bytes) {
    const size_t total = offset_ + bytes + kGuardBytes;
    if (p.mapped_host) {
      pinned_ = PinnedBuffer(total);
      std::memset(pinned_.host(), kGuard, total);
    } else {
      device_ = DeviceBuffer(total);
      KVT_CUDA_CHECK(cudaMemset(device_.data(), kGuard, total));
    }
  }
  uint8_t* records() const { return base() + offset_; }
  void upload(const std::vector<uint8_t>& rec) {
    if (pinned_.bytes()) std::memcpy(pinned_.host<uint8_t>() + offset_, rec.data(), rec.size());
    else KVT_CUDA_CHECK(cudaMemcpy(records(), rec.data(), rec.size(), cudaMemcpyHostToDevice));
  }
  // The records, and whether the guard bytes are intact (after the device finished).
  std::vector<uint8_t> download(bool& guards_ok) const {
    KVT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> all(offset_ + bytes_ + kGuardBytes);
    if (pinned_.bytes()) std::memcpy(all.data(), pinned_.host(), all.size());
    else KVT_CUDA_CHECK(cudaMemcpy(all.data(), device_.data(), all.size(), cudaMemcpyDeviceToHost));
    guards_ok = true;
    for (size_t i = 0; i < offset_; ++i) guards_ok &= all[i] == kGuard;
    for (size_t i = all.size() - kGuardBytes; i < all.size(); ++i) guards_ok &= all[i] == kGuard;
    return {all.begin() + long(offset_), all.end() - kGuardBytes};
  }

 private:
  uint8_t* base() const { return pinned_.bytes() ? pinned_.device_ptr<uint8_t>() : device_.data<uint8_t>(); }
  size_t offset_, bytes_;
  DeviceBuffer device_;
  PinnedBuffer pinned_;
};

class GpuRunner : public Runner {
 public:
  DevFormat format(const QuantSpec& s, int dim, const std::vector<float>* grid = nullptr) override {
    RecordFormat r;
    r.spec = s;
    r.dim = dim;
    r.bytes = int64_t(bytes_per_vector(s, dim));
    if (s.kind == QuantKind::higgs) {
      if (grid) {
        custom_.push_back(to_device(*grid));
        r.grid = custom_.back().data<float>();
      } else {
        auto key = std::make_pair(s.uniform_levels ? -s.grid_dim : s.grid_dim, s.grid_size);  // U<n> apart from EDEN1-n
        const HiggsGrid& hg = higgs_grid_of(s);
        if (!grids_.count(key)) grids_.emplace(key, to_device(hg.points));
        r.grid = grids_.at(key).data<float>();
        if (!hg.cells.empty()) {  // d = 2: the search by cells
          if (!cells_.count(key)) cells_.emplace(key, to_device(hg.cells));
          r.cells = cells_.at(key).data<uint32_t>();
        }
      }
      if (s.random_signs) {
        const int G = resolved_group(s, dim);
        std::vector<float> sg(static_cast<size_t>(G));
        hadamard_signs(s.sign_seed, G, sg.data());
        signs_.push_back(to_device(sg));
        r.signs = signs_.back().data<float>();
      }
    }
    return make_dev_format(r);
  }

  std::vector<uint8_t> quantize(const DevFormat& f, const std::vector<float>& x, int64_t n_vec, const Placement& p,
                                bool& guards_ok) override {
    DeviceBuffer dx = to_device(x);  // in place: destroyed
    DeviceBuffer scratch(!p.in_place && (dev_needs_scratch(f) || p.warp) ? x.size() * 4 : 0);
    RecordBuffer out(p, size_t(n_vec * f.bytes));
    float* sc = p.in_place ? dx.data<float>() : scratch.bytes() ? scratch.data<float>() : nullptr;
    quant_dev_quantize(f, dx.data<float>(), n_vec, out.records(), sc, p.stage_grid, p.warp);
    return out.download(guards_ok);
  }

  std::vector<float> dequantize(const DevFormat& f, const std::vector<uint8_t>& rec, int64_t n_vec,
                                const Placement& p) override {
    RecordBuffer in(p, rec.size());
    in.upload(rec);
    DeviceBuffer y(size_t(n_vec) * size_t(f.dim) * 4);
    poison(y);
    quant_dev_dequantize(f, in.records(), n_vec, y.data<float>());
    return to_host<float>(y, size_t(n_vec) * size_t(f.dim));
  }

  std::vector<float> score(const DevFormat& f, const std::vector<float>& q, int n_q, const std::vector<uint8_t>& rec,
                           int64_t n_vec, bool rotated, const Placement& p) override {
    RecordBuffer in(p, rec.size());
    in.upload(rec);
    DeviceBuffer dq = to_device(q);
    const size_t n = size_t(n_q) * size_t(n_vec);
    DeviceBuffer scratch(!rotated && dev_needs_scratch(f) ? n * size_t(f.dim) * 4 : 0);
    DeviceBuffer out(n * 4);
    poison(out);
    quant_dev_score(f, dq.data<float>(), n_q, in.records(), n_vec, rotated,
                    scratch.bytes() ? scratch.data<float>() : nullptr, out.data<float>());
    return to_host<float>(out, n);
  }

  // Beyond the shared two: one warp per record, out of place in device memory
  // and in place with the grid staged in mapped host memory.
  std::vector<Placement> placements(bool higgs) const override {
    std::vector<Placement> p = Runner::placements(higgs);
    Placement w{false, 1, false, false, true};
    p.push_back(w);
    if (higgs) p.push_back(Placement{true, 2, true, true, true});
    return p;
  }

  std::vector<float> rotate(const DevFormat& f, const std::vector<float>& q, int n_q) override {
    DeviceBuffer dq = to_device(q), out(q.size() * 4);
    poison(out);
    quant_dev_rotate(f, dq.data<float>(), n_q, out.data<float>());
    return to_host<float>(out, q.size());
  }

 private:
  std::map<std::pair<int, int>, DeviceBuffer> grids_;
  std::map<std::pair<int, int>, DeviceBuffer> cells_;
  std::vector<DeviceBuffer> signs_, custom_;
};

class QuantDevCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantDevCuda, MatchesTheCpuQuantizer) {
  KVT_REQUIRE_GPU();
  GpuRunner run;
  check_family(run, GetParam(), 256);
}

TEST(QuantDevCudaTies, GoToTheLowestIndex) {
  KVT_REQUIRE_GPU();
  GpuRunner run;
  check_tie_rule(run);
}

INSTANTIATE_TEST_SUITE_P(Families, QuantDevCuda, ::testing::ValuesIn(case_families()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvtier::cuda
