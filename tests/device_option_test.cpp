// EngineOptions::device on a machine (or build) without CUDA: a clear error,
// never a crash. The GPU path itself is tested by src/model/model_cuda_test.cpp.
// And the CPU's thread count (-t) reaching the prefill GEMMs.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda_device.h"
#include "kvtier/engine.h"
#include "ops/matmul/matmul.h"

namespace kvtier {
namespace {

const std::string kModel = std::string(KVT_SOURCE_DIR) + "/tests/fixtures/hf_tiny_qwen2";

TEST(DeviceOption, ThreadsReachOpenBlas) {
  set_blas_threads(2);
  if (blas_threads() != 2) GTEST_SKIP() << "OpenBLAS runs at most " << blas_threads() << " thread(s) here";
  EngineOptions o;
  o.model_path = kModel;
  o.n_threads = 1;
  auto e = Engine::load(o);
  EXPECT_EQ(blas_threads(), 1) << "-t 1 left the prefill GEMMs on more threads";
}

TEST(DeviceOption, UnknownDeviceIsRefused) {
  EngineOptions o;
  o.model_path = kModel;
  o.device = "tpu";
  try {
    Engine::load(o);
    FAIL() << "device tpu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"tpu\""), std::string::npos) << e.what();
  }
}

TEST(DeviceOption, CudaWithoutCudaSaysWhy) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present (covered by the cuda tests)";
  EngineOptions o;
  o.model_path = kModel;
  o.device = "cuda";
  try {
    Engine::load(o);
    FAIL() << "--device cuda accepted without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("built without CUDA") != std::string::npos || msg.find("no CUDA device") != std::string::npos)
        << msg;
  }
}

TEST(DeviceOption, CpuIsTheDefault) {
  EngineOptions o;
  EXPECT_EQ(o.device, "cpu");
}

}  // namespace
}  // namespace kvtier
