#!/usr/bin/env bash
# volta_build.sh: the V100 (sm_70) build job (scripts/test.sh runs it after the main suite): builds mgrl's CUDA code
# for sm_70 with the CUDA 11.8 toolchain of scripts/cuda118.sh (CUDA 13, the system's, cannot target sm_70), links
# the mgrl binary against cuBLAS 11 and NCCL for CUDA 11, and checks it:
#   - cuobjdump (11.8) finds one sm_70 ELF (cubin: SASS) for every kernels/cuda/*.cu that was compiled, and no
#     other architecture, and the cubins hold the kernels of each op family (rmsnorm, rope, attention, flash
#     attention and its Volta kernels, LoRA, AdamW, sampling, ...);
#   - it loads libcudart.so.11.0, cuBLAS 11 and NCCL (for CUDA 11) from the cache, and no newer CUDA's libraries;
#   - `mgrl info` runs (on the CPU here) and reports the sm_70 build and NCCL 2.x (the CUDA 11 build).
# Nothing is skipped: a failure to fetch the toolchain, configure, compile, link or check fails the job with a message.
# Build directory: build-sm70/ (or $MGRL_VOLTA_DIR); the C++ parts are compiled by nvcc's host compiler too. Built:
# mgrl and the GPU test programs test_ops_cuda and test_model_cuda (not run: no GPU here). The plain C++ files compile
# at -O0 here: this job checks the CUDA code (compiled as in Release: nvcc's device code is optimized whatever the host
# level) and the link; mgrl's host C++ is compiled and tested at -O3 by the main build (with clang++-14,
# config_schema.cpp takes 28.4 s at -O3 and 1.9 s at -O0; the host objects' CPU time fell from 450 s to 238 s, the
# job from 280-333 s to 214 s on the 2-core CI machine). A cluster's own sm_70 build (docs/cluster.md) is an
# ordinary Release build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MGRL_VOLTA_DIR:-$root/build-sm70}
fail() { echo "volta_build: FAILED: $*" >&2; exit 1; }

start=$(date +%s)
env_file=$(bash "$root/scripts/cuda118.sh") || fail "scripts/cuda118.sh could not provide the CUDA 11.8 toolchain (above)"
# shellcheck disable=SC1090
source "$env_file"
mkdir -p "$build"
CC=$MGRL_CUDA118_CC CXX=$MGRL_CUDA118_CXX cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMGRL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=70 -DMGRL_BUILD_TESTS=ON -DMGRL_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG" \
  > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; fail "configuring the sm_70 build"; }
grep -q "CUDA backend ON (architectures: 70)" "$build/configure.log" ||
  { cat "$build/configure.log"; fail "CMake did not configure the CUDA backend for sm_70"; }
# mgrl and the GPU test programs (what `ctest -L gpu` runs on a V100; here they are only built), nothing else.
cmake --build "$build" --parallel "$(nproc)" --target mgrl test_ops_cuda test_model_cuda > "$build/build.log" 2>&1 ||
  { grep -E -B2 -A8 "error|FAILED" "$build/build.log" | head -n 80; fail "building mgrl for sm_70 with CUDA 11.8"; }

# ---- the binary holds sm_70 SASS, and only that, for every CUDA source ----
cuobjdump="$MGRL_CUDA118_HOME/bin/cuobjdump"
# The CUDA objects of this configuration (build.ninja; stale objects of removed sources do not count).
objects=$(grep -c '^build kernels/CMakeFiles/mgrl_kernels\.dir/cuda/[^:]*\.cu\.o:' "$build/build.ninja" || true)
elfs=$("$cuobjdump" --list-elf "$build/mgrl") || fail "cuobjdump --list-elf could not read $build/mgrl"
n_elf=$(grep -c '\.cubin' <<< "$elfs" || true)
n_sm70=$(grep -c 'sm_70\.cubin' <<< "$elfs" || true)
[ "$objects" -gt 0 ] || fail "no CUDA objects in $build/kernels"
[ "$n_elf" = "$objects" ] && [ "$n_sm70" = "$objects" ] ||
  { echo "$elfs"; fail "mgrl holds $n_elf ELF images ($n_sm70 for sm_70) for $objects CUDA objects"; }
# The kernels (entry functions) of the sm_70 cubins: their symbol tables (disassembling them all takes a minute).
sass=$("$cuobjdump" -symbols "$build/mgrl" | awk '/STO_ENTRY/ { print $NF }') ||
  fail "cuobjdump -symbols could not read $build/mgrl"
missing=()
for k in embedding_forward_kernel rmsnorm_forward_kernel rope_kernel attention_forward_kernel fa_forward_kernel \
         fa_dq_kernel fa_dkv_kernel sm70_forward_kernel sm70_dq_kernel sm70_dkv_kernel swiglu_forward_kernel lora_addmm_kernel lm_head_lse_kernel sample_kernel \
         kv_store_kernel adamw_kernel dropout_kernel residual_kernel f32_to_storage_kernel; do
  grep -q "$k" <<< "$sass" || missing+=("$k")
done
[ ${#missing[@]} -eq 0 ] || fail "no sm_70 SASS for ${missing[*]}"
n_kernels=$(wc -l <<< "$sass")

# ---- it links the CUDA 11 libraries of the cache (shared cudart, cuBLAS 11, NCCL for CUDA 11), not CUDA 13's ----
grep -A3 "^build mgrl:" "$build/build.ninja" | grep -q -- "-lcudart_static" &&
  fail "mgrl links -lcudart_static, which the CUDA 11.8 cache does not have (another toolkit's would be used)"
libs=$(ldd "$build/mgrl") || fail "ldd could not read $build/mgrl"
for lib in libcudart.so.11.0 libcublas.so.11 libcublasLt.so.11 libnccl.so.2; do
  grep -q "$lib => $(dirname "$MGRL_CUDA118_HOME")/" <<< "$libs" ||
    { echo "$libs"; fail "mgrl does not load $lib from the CUDA 11.8 cache"; }
done
grep -q "libcudart.so.1[2-9]\|libcublas.so.1[2-9]" <<< "$libs" && { echo "$libs"; fail "mgrl loads a newer CUDA's libraries"; }

# ---- the binary runs (CPU backend here) and says what it was built with ----
info=$("$build/mgrl" info --runtime.backend=cpu 2>&1) || { echo "$info"; fail "mgrl info (sm_70 build) failed"; }
grep -q "architectures 70)" <<< "$info" || { echo "$info"; fail "mgrl info does not report the sm_70 build"; }
grep -q "^NCCL: 2\." <<< "$info" || { echo "$info"; fail "mgrl info reports no NCCL 2.x"; }
echo "volta_build: mgrl for sm_70 with CUDA 11.8 ($(basename "$CUDAHOSTCXX") host compiler, NCCL" \
     "$(sed -n 's/^NCCL: //p' <<< "$info")): $objects CUDA objects, $n_kernels kernels with sm_70 SASS," \
     "$(( $(date +%s) - start )) s"
