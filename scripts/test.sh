#!/usr/bin/env bash
# Builds kvtier and runs the whole test suite: the CTest suite (C++ unit,
# parity and end-to-end tests; the server's Python tests), then each
# library's C++ suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
# CUDA tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${KVT_SKIP_INSTALL:-0}" = 1 ] || ./scripts/install_deps.sh
jobs=${JOBS:-$(nproc)}
./scripts/build.sh
(cd build && ctest --output-on-failure -j"$jobs" --timeout 1500)
if [ "${KVT_SKIP_SANITIZE:-0}" != 1 ]; then
  # Sanitized build: CPU code only (nvcc does not take the sanitizer flags),
  # the suites of KVT_SANITIZE_SUITES (CMakeLists.txt), xgrammar linked from
  # the release build. -g1 keeps the line tables the sanitizers' stack traces
  # need and drops the rest of the debug info, which slows compiling and
  # linking; -O2 keeps the numerics of the release build.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DKVT_SANITIZE=ON -DKVT_CUDA=OFF -DKVT_BENCHES=OFF \
    -DKVT_XGRAMMAR_PREBUILT="$PWD/build/third_party/libkvt_xgrammar.a" >/dev/null
  cmake --build build-asan -j"$jobs" --target kvt_sanitize_suites
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j"$jobs" --timeout 1500 -L cpu)
fi
