#!/usr/bin/env bash
# Fetches the C++ sources of xgrammar (structured generation: JSON Schema and
# grammars compiled to per-token masks; Apache-2.0) from its PyPI source
# distribution, the only source reachable here, verifies its SHA-256 and
# unpacks what the C++ library needs into third_party/xgrammar/. The build
# compiles it as a static library (third_party/CMakeLists.txt); nothing of
# Python is used at run time. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.2.8
sha=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
dest=third_party/xgrammar
stamp="$dest/.kvtier-xgrammar-$version"
[ -f "$stamp" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# pip prepares the sdist's metadata (a minute: it installs the build backend
# in an isolated environment); --no-binary keeps the wheel, which has no C++
# library, out.
python3 -m pip download --quiet --no-deps --disable-pip-version-check --no-binary xgrammar \
  -d "$tmp" "xgrammar==$version"
tarball="$tmp/xgrammar-$version.tar.gz"
echo "$sha  $tarball" | sha256sum -c --quiet
rm -rf "$dest"
mkdir -p "$dest"
top="xgrammar-$version"
tar -xzf "$tarball" -C "$tmp" "$top/cpp" "$top/include" "$top/3rdparty/picojson/picojson.h" \
  "$top/3rdparty/dlpack/include" "$top/LICENSE" "$top/NOTICE"
cp -r "$tmp/$top/." "$dest/"
touch "$stamp"
echo "xgrammar $version: $dest"
