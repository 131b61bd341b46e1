#!/usr/bin/env bash
# Installs what kvtier needs on a fresh Debian 12 machine (root or sudo), the
# Python packages its tests use, and the default model. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
pkgs=(cmake g++ make pkg-config git ca-certificates python3 python3-pip
      nlohmann-json3-dev libcli11-dev libfmt-dev
      libopenblas-dev libpcre2-dev libgtest-dev libgmock-dev libbenchmark-dev
      liblzma-dev xz-utils libboost-dev
      clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Pinned Python packages for the server tests (the product itself is C++).
python3 -m pip install --quiet --disable-pip-version-check -r scripts/requirements-test.txt
./scripts/fetch_default_model.sh
./scripts/fetch_xgrammar.sh
