#!/usr/bin/env bash
# cuda118.sh: a CUDA 11.8 toolchain (nvcc that targets sm_70, V100) in a cache directory, beside the system's CUDA.
#
# CUDA 13 cannot compile for sm_70. This script fetches, verifies and unpacks, without installing anything
# system-wide:
#   - Debian 12's non-free nvidia-cuda-toolkit 11.8 .deb (nvcc, cicc, ptxas, nvlink, fatbinary, cuobjdump),
#     through a private apt configuration (its own lists and cache under the cache directory) that reads the
#     system's Debian 12 mirror with the non-free component, signed by the Debian archive keyring: apt checks the
#     .deb against the signed index and this script checks the sha256 again;
#   - from PyPI, pinned versions with pinned sha256 (pip --require-hashes): nvidia-cuda-runtime-cu11 and
#     nvidia-cuda-nvcc-cu11 (headers, libcudart.so.11.0, libdevice), nvidia-cublas-cu11 (cuBLAS / cuBLASLt 11) and
#     nvidia-nccl-cu11 (NCCL built for CUDA 11);
# and assembles them as a toolkit root ($dir/toolkit: bin, nvvm, include, lib64) and an NCCL root ($dir/nccl).
# The host compiler is g++-11 or clang++-14 (nvcc 11.8 rejects gcc 12); when neither is there, clang-14 is
# installed from Debian main with apt (sudo when not root), as scripts/install_deps.sh does.
#
#   bash scripts/cuda118.sh            # prints the env file to source; fast when the cache is complete
#   source "$(bash scripts/cuda118.sh)"
#   cmake -S . -B build-sm70 -G Ninja -DCMAKE_CUDA_ARCHITECTURES=70   # CUDACXX, CUDAHOSTCXX, NCCL_ROOT from the env file
#
# The cache: $MGRL_CUDA118_DIR, default ${XDG_CACHE_HOME:-$HOME/.cache}/mgrl/cuda-11.8 (about 1 GB on disk; building
# it downloads 0.7 GB, in about 20 s here; a complete cache is reused at once).
# The mirror: the URI of the system's Debian 12 (bookworm) apt source; $MGRL_CUDA118_MIRROR overrides it.
# The toolkit is non-free software under NVIDIA's licence: it is fetched into the cache here, never redistributed
# by mgrl. Every failure (no mirror, a download or a checksum) ends the script with a message and exit code 1.
set -euo pipefail

dir=${MGRL_CUDA118_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mgrl/cuda-11.8}
say() { echo "cuda118: $*" >&2; }
die() { echo "cuda118: error: $*" >&2; exit 1; }

# What is fetched. The wheels' sha256 are those PyPI publishes for these files (immutable); the .deb's come from
# Debian's signed index at fetch time (its version may move with a Debian 12 point release; 11.8.* is required).
deb_package=nvidia-cuda-toolkit
deb_upstream=11.8.
wheels=(
  "nvidia-cuda-runtime-cu11==11.8.89 --hash=sha256:92d04069a987e1fbc9213f8376d265df0f7bb42617d44f5eda1f496acea7f2d1"
  "nvidia-cuda-nvcc-cu11==11.8.89 --hash=sha256:f8e1e995166c884f2f5bf94975d7abb89175363b8712f7f81cd38d0df1b2cd85"
  "nvidia-cublas-cu11==11.11.3.6 --hash=sha256:60252822adea5d0b10cd990a7dc7bedf7435f30ae40083c7a624a85a43225abc"
  "nvidia-nccl-cu11==2.21.5 --hash=sha256:49d8350629c7888701d1fd200934942671cb5c728f49acc5a0b3a768820bed29"
)
# The stamp names everything above: a change here rebuilds the cache.
stamp_text="$deb_package $deb_upstream ${wheels[*]} layout 1"

# The host compiler: $MGRL_CUDA118_HOST_CXX, else g++-11, else clang++-14 (full path on stdout).
host_cxx() {
  if [ -n "${MGRL_CUDA118_HOST_CXX:-}" ]; then
    command -v "$MGRL_CUDA118_HOST_CXX" || die "MGRL_CUDA118_HOST_CXX=$MGRL_CUDA118_HOST_CXX is not on PATH"
    return 0
  fi
  for c in g++-11 clang++-14; do
    if command -v "$c" >/dev/null; then command -v "$c"; return 0; fi
  done
  return 1
}

write_env() {
  local cxx=$1 cc
  case "$cxx" in *clang++-14) cc=${cxx%clang++-14}clang-14 ;; *g++-11) cc=${cxx%g++-11}gcc-11 ;; *) cc="" ;; esac
  {
    echo "# $dir/env.sh: written by scripts/cuda118.sh; source it before configuring a CUDA 11.8 build."
    echo "export MGRL_CUDA118_HOME='$dir/toolkit'"
    echo "export CUDACXX='$dir/toolkit/bin/nvcc'"
    echo "export CUDAHOSTCXX='$cxx'"
    echo "export CUDAToolkit_ROOT='$dir/toolkit'"
    echo "export NCCL_ROOT='$dir/nccl'"
    echo "export MGRL_CUDA118_CXX='$cxx'"
    echo "export MGRL_CUDA118_CC='$cc'"
  } > "$dir/env.sh"
}

# ---- fast path: a complete cache ----
if [ -f "$dir/complete" ] && [ "$(cat "$dir/complete")" = "$stamp_text" ] && [ -x "$dir/toolkit/bin/nvcc" ]; then
  cxx=$(host_cxx) || die "the cache is complete but no host compiler (g++-11 or clang++-14) is on PATH"
  write_env "$cxx"
  echo "$dir/env.sh"
  exit 0
fi

# ---- the host compiler ----
if ! cxx=$(host_cxx); then
  command -v apt-get >/dev/null || die "nvcc 11.8 needs g++-11 or clang++-14 as host compiler; install one"
  sudo=""; [ "$(id -u)" != 0 ] && sudo=sudo
  say "installing clang-14 (nvcc 11.8's host compiler) with apt"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends clang-14 >/dev/null
  cxx=$(host_cxx) || die "clang-14 was installed but clang++-14 is not on PATH"
fi

rm -rf "$dir/complete" "$dir/toolkit" "$dir/nccl" "$dir/unpack"
mkdir -p "$dir/downloads" "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/apt/etc"

# ---- the .deb through a private apt configuration ----
mirror=${MGRL_CUDA118_MIRROR:-}
if [ -z "$mirror" ]; then
  # The first URI of an apt source (one-line or deb822) whose suites include bookworm itself.
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
             awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i ~ /:\/\//) { if ($(i+1) == "bookworm") { print $i; exit } break } }' || true)
  if [ -z "$mirror" ]; then
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
      /^URIs:/ { uri = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") found = 1 }
      /^[[:space:]]*$/ { if (found && uri != "") { print uri; exit } uri = ""; found = 0 }
      END { if (found && uri != "") print uri }' | head -n 1 || true)
  fi
fi
[ -n "$mirror" ] || die "no Debian 12 (bookworm) apt source found in /etc/apt; set MGRL_CUDA118_MIRROR to a Debian mirror URI"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || die "$keyring is missing (Debian's package debian-archive-keyring): it verifies the mirror's index"
echo "deb [signed-by=$keyring] $mirror bookworm non-free" > "$dir/apt/etc/sources.list"
apt_opts=(-o "Dir::Etc::sourcelist=$dir/apt/etc/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State=$dir/apt"
          -o "Dir::State::lists=$dir/apt/lists" -o Dir::State::status=/dev/null -o "Dir::Cache=$dir/apt/cache"
          -o APT::Sandbox::User=root -o Debug::NoLocking=1 -o Acquire::Retries=3)
say "apt index of $mirror bookworm non-free (private lists in $dir/apt)"
apt-get "${apt_opts[@]}" -qq --error-on=any update > "$dir/apt/update.log" 2>&1 ||
  { cat "$dir/apt/update.log" >&2; die "apt-get update of $mirror bookworm non-free failed (is the mirror reachable?)"; }
record=$(apt-cache "${apt_opts[@]}" show --no-all-versions "$deb_package" 2>/dev/null || true)
version=$(awk '/^Version:/ { print $2; exit }' <<< "$record")
sha=$(awk '/^SHA256:/ { print $2; exit }' <<< "$record")
[ -n "$version" ] && [ -n "$sha" ] || die "$deb_package is not in $mirror bookworm non-free"
case "$version" in "$deb_upstream"*) ;; *) die "$deb_package is $version there, not CUDA ${deb_upstream}x" ;; esac
deb="$dir/downloads/${deb_package}_${version//:/%3a}_amd64.deb"
if [ ! -f "$deb" ] || [ "$(sha256sum "$deb" | cut -d' ' -f1)" != "$sha" ]; then
  say "downloading $deb_package $version"
  rm -f "$deb"
  (cd "$dir/downloads" && apt-get "${apt_opts[@]}" -qq download "$deb_package=$version" > "$dir/apt/download.log" 2>&1) ||
    { cat "$dir/apt/download.log" >&2; die "downloading $deb_package $version failed"; }
fi
[ "$(sha256sum "$deb" | cut -d' ' -f1)" = "$sha" ] || die "$deb does not have the sha256 of Debian's signed index ($sha)"

# ---- the wheels, by pip with pinned hashes ----
pip=(python3 -m pip)
if ! "${pip[@]}" --version >/dev/null 2>&1; then
  [ -x "$dir/venv/bin/pip" ] || python3 -m venv "$dir/venv" || die "no pip, and python3 -m venv failed (Debian: python3-venv)"
  pip=("$dir/venv/bin/pip")
fi
printf '%s\n' "${wheels[@]}" > "$dir/downloads/requirements.txt"
say "downloading the CUDA 11 wheels (pip, sha256 checked)"
"${pip[@]}" download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.11 \
  --require-hashes -r "$dir/downloads/requirements.txt" -d "$dir/downloads" >&2 ||
  die "pip could not download the CUDA 11 wheels (is PyPI reachable?)"

# ---- unpack and assemble ----
say "unpacking into $dir"
u="$dir/unpack"
mkdir -p "$u/deb" "$u/whl"
dpkg-deb -x "$deb" "$u/deb"
for w in "$dir"/downloads/nvidia_*.whl; do
  python3 -m zipfile -e "$w" "$u/whl" || die "could not unpack $w"
done
t="$dir/toolkit"
ntk="$u/deb/usr/lib/nvidia-cuda-toolkit"
mkdir -p "$t/bin/crt" "$t/nvvm/bin" "$t/nvvm/lib64" "$t/lib64" "$t/include"
mv "$ntk/bin/nvcc" "$ntk/bin/cicc" "$t/bin/"
mv "$t/bin/cicc" "$t/nvvm/bin/"
mv "$ntk/bin/crt/link.stub" "$ntk/bin/crt/prelink.stub" "$t/bin/crt/"
for b in ptxas fatbinary nvlink cudafe++ bin2c cuobjdump nvdisasm nvprune cu++filt; do mv "$u/deb/usr/bin/$b" "$t/bin/"; done
mv "$u/whl/nvidia/cuda_nvcc/nvvm/libdevice" "$t/nvvm/"
mv "$u/whl/nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so" "$t/nvvm/lib64/"
mv "$u/whl/nvidia/cuda_nvcc/nvvm/include" "$t/nvvm/"
for pkg in cuda_runtime cuda_nvcc cublas; do
  cp -a "$u/whl/nvidia/$pkg/include/." "$t/include/"
done
mv "$u/whl/nvidia/cuda_runtime/lib/libcudart.so.11.0" "$u/whl/nvidia/cublas/lib/libcublas.so.11" \
   "$u/whl/nvidia/cublas/lib/libcublasLt.so.11" "$t/lib64/"
ln -s libcudart.so.11.0 "$t/lib64/libcudart.so"
ln -s libcublas.so.11 "$t/lib64/libcublas.so"
ln -s libcublasLt.so.11 "$t/lib64/libcublasLt.so"
find "$t/include" -name '__init__.py' -delete
mkdir -p "$dir/nccl/lib" "$dir/nccl/include"
mv "$u/whl/nvidia/nccl/lib/libnccl.so.2" "$dir/nccl/lib/"
ln -s libnccl.so.2 "$dir/nccl/lib/libnccl.so"
mv "$u/whl/nvidia/nccl/include/nccl.h" "$u/whl/nvidia/nccl/include/nccl_net.h" "$dir/nccl/include/"
# nvcc reads nvcc.profile beside itself: where cicc, libdevice, the headers and the libraries of this root are.
cat > "$t/bin/nvcc.profile" <<'EOF'
# nvcc.profile of mgrl's CUDA 11.8 cache (scripts/cuda118.sh): every path is relative to this bin/ directory.
TOP = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES += "-I$(TOP)/include" $(_SPACE_)
LIBRARIES =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS +=
PTXAS_FLAGS +=
EOF
rm -rf "$u"
rm -f "$dir"/downloads/*.whl "$dir"/downloads/*.deb  # unpacked: the cache keeps the toolkit, not the archives

# ---- check: nvcc compiles for sm_70 with the host compiler ----
chk="$dir/check"
mkdir -p "$chk"
cat > "$chk/check.cu" <<'EOF'
// check.cu: cuda118.sh's smoke test: a kernel with fp16 arithmetic, compiled for sm_70.
#include <cuda_fp16.h>
__global__ void axpy(int n, __half a, const __half* x, __half* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __hfma(a, x[i], y[i]);
}
EOF
"$t/bin/nvcc" -ccbin "$cxx" -std=c++17 -arch=sm_70 -c "$chk/check.cu" -o "$chk/check.o" > "$chk/log" 2>&1 ||
  { cat "$chk/log" >&2; die "nvcc 11.8 could not compile a kernel for sm_70 with $cxx"; }
"$t/bin/cuobjdump" --list-elf "$chk/check.o" | grep -q sm_70 || die "nvcc 11.8 produced no sm_70 code"
echo "$stamp_text" > "$dir/complete"
write_env "$cxx"
say "CUDA $("$t/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'): $t/bin/nvcc, host compiler $cxx, NCCL $dir/nccl"
echo "$dir/env.sh"
