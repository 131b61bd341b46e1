#!/usr/bin/env bash
# Packs the CUDA build's binaries and the shared libraries they need that a
# bare CUDA image lacks (Debian's fmt, OpenBLAS, PCRE2, ...) into
# .device/pack.tar.xz (git-ignored), for bench/gpu_run.sh on the GPU machine:
#   bench/pack_device.sh [BUILD_DIR]         here
#   tar -xJf .device/pack.tar.xz -C .device   there (gpu_run.sh does it)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-cuda}
ST=.device/stage$$
rm -rf "$ST" && mkdir -p "$ST/bin" "$ST/lib"
cp "$B/kvt_cuda_tests" "$B/tools/kvtier" "$ST"/bin/
for b in kvt_flash_prefill_bench kvt_moe_bench kvt_host_rows_bench kvt_score_bench kvt_gemm_bench; do [ -f "$B/src/ops/$b" ] && cp "$B/src/ops/$b" "$ST"/bin/; done
strip "$ST"/bin/*
for b in "$ST"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}' |
    grep -E 'libfmt|libopenblas|libblas|liblapack|libpcre2|libgfortran|libquadmath|libboost|liblzma|libgomp|libcpp-httplib|libbrotli' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$ST"/lib/; done
# BINS="kvtier kvt_cuda_tests" packs only those (the device tool's upload holds
# the working tree and the pack within 64 MiB; when both do not fit, pack each
# alone: PACK=.device/packT.tar.xz names the archive); xz -9e shrinks it further.
if [ -n "${BINS:-}" ]; then
  for b in "$ST"/bin/*; do case " $BINS " in *" $(basename "$b") "*) ;; *) rm "$b" ;; esac; done
fi
OUTP=${PACK:-.device/pack.tar.xz}
XZ_OPT=-9e tar -C "$ST" -cJf "$OUTP" bin lib
rm -rf "$ST"
ls -la "$OUTP"
