#!/usr/bin/env bash
# volta_ptx_build.sh: mgrl's Volta code built with CUDA 11.8 for compute_70 as PTX only, to run on a newer GPU (H100)
# whose driver JIT-compiles it (issue 21 item 4: the sm_70 kernels, fp16 storage and loss scaling on a GPU at hand).
#
# The GPU machine has CUDA 13 (driver, cuBLAS 13, NCCL) and none of CUDA 11.8's libraries, and 64 MiB can be carried
# there, so this build differs from scripts/volta_build.sh's in what it links:
#   - kernels: nvcc 11.8 (scripts/cuda118.sh), CMAKE_CUDA_ARCHITECTURES=70-virtual: one compute_70 PTX image per
#     CUDA source, no SASS; on an sm_90 GPU the driver JIT-compiles them. The tiled mma.sync attention is compiled out
#     at compute_70 (its __CUDA_ARCH__ guards; flash_attention_applies reads ptxVersion 70 and declines), so fp16
#     attention takes the Volta kernels of flash_attention_sm70.cu, as on a V100.
#   - CUDA runtime: the shared libcudart.so.11.0 of the 11.8 cache (what nvcc 11.8's objects register their
#     kernels with), copied to BUILD/cudart11/ (mode 755: the device bundle packs the build's executable ELF files,
#     and excludes libcudart only among the libraries it finds with ldd) and on the binaries' RUNPATH;
#   - cuBLAS: the system's cuBLAS 13 (/usr/local/cuda, or $MGRL_PTX_CUBLAS_DIR), called through 11.8's headers
#     (those of the runtime the rest of the code is compiled with; CUDA 13's cuda_runtime.h must not meet cudart 11).
#     That is sound only if every cuBLAS function mgrl calls has the same prototype in both versions' headers and
#     every cuBLAS/CUDA enumerator it uses the same value: checked here, from the symbols the binaries import.
#     cuBLAS 13 and NCCL carry their own CUDA runtime (no libcudart dependency); both runtimes share the driver's
#     primary context, so pointers and streams pass between them;
#   - NCCL: the system's (/usr/local/cuda/lib64/libnccl.so.2, the normal build's), its nccl.h alone on the include
#     path (a shim directory: /usr/local/cuda/include also holds CUDA 13's runtime headers).
# Checks (each failure ends the script with a message, exit 1): every binary with device code holds compute_70 PTX
# images only (mgrl one for each CUDA object) and no ELF (SASS) image; the PTX of the attention kernels has no mma.sync m16n8 / ldmatrix
# and the Volta kernels' wmma m16n16k16; ldd finds libcudart.so.11.0 in BUILD/cudart11, cuBLAS 13 and the system NCCL,
# and nothing of CUDA 11's cuBLAS/NCCL; the cuBLAS API check above; `mgrl info` runs (CPU here).
# Built: mgrl, the executables `ctest -L gpu` runs (read from ctest), perf/bench_attention.
#   bash scripts/volta_ptx_build.sh                     # BUILD = build-volta-ptx/ (or $MGRL_VOLTA_PTX_DIR)
#   bash ../shared/hooks/device-bundle.sh build-volta-ptx   # then .device/ to carry; docs/performance.md has the rest
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MGRL_VOLTA_PTX_DIR:-$root/build-volta-ptx}
cublas_dir=${MGRL_PTX_CUBLAS_DIR:-/usr/local/cuda/lib64}
nccl_lib=${MGRL_PTX_NCCL_LIBRARY:-/usr/local/cuda/lib64/libnccl.so.2}
nccl_h=${MGRL_PTX_NCCL_HEADER:-/usr/local/cuda/include/nccl.h}
cublas_h13=${MGRL_PTX_CUBLAS_INCLUDE:-$(dirname "$cublas_dir")/include}
fail() { echo "volta_ptx_build: FAILED: $*" >&2; exit 1; }

start=$(date +%s)
for f in "$cublas_dir/libcublas.so.13" "$cublas_dir/libcublasLt.so.13" "$nccl_lib" "$nccl_h" "$cublas_h13/cublas_api.h"; do
  [ -e "$f" ] || fail "$f is missing (the system's CUDA 13 cuBLAS and NCCL this build links)"
done
env_file=$(bash "$root/scripts/cuda118.sh") || fail "scripts/cuda118.sh could not provide the CUDA 11.8 toolchain (above)"
# shellcheck disable=SC1090
source "$env_file"
cudart="$MGRL_CUDA118_HOME/lib64/libcudart.so.11.0"
[ -f "$cudart" ] || fail "$cudart is missing from the CUDA 11.8 cache"

mkdir -p "$build/cudart11" "$build/nccl-include"
install -m 755 "$cudart" "$build/cudart11/libcudart.so.11.0"
ln -sf "$nccl_h" "$build/nccl-include/nccl.h"
CC=$MGRL_CUDA118_CC CXX=$MGRL_CUDA118_CXX cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMGRL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=70-virtual -DMGRL_BUILD_TESTS=ON -DMGRL_BUILD_BENCH=ON \
  -DCUDA_cublas_LIBRARY="$cublas_dir/libcublas.so.13" -DCUDA_cublasLt_LIBRARY="$cublas_dir/libcublasLt.so.13" \
  -DNCCL_INCLUDE_DIR="$build/nccl-include" -DNCCL_LIBRARY="$nccl_lib" -DCMAKE_BUILD_RPATH="$build/cudart11" \
  > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; fail "configuring the compute_70 PTX build"; }
grep -q "CUDA backend ON (architectures: 70-virtual)" "$build/configure.log" ||
  { cat "$build/configure.log"; fail "CMake did not configure the CUDA backend for compute_70 (PTX only)"; }

# ---- what to build: mgrl, every executable of the build that a `ctest -L gpu` test names, bench_attention ----
exes=$(sed -n 's/^build \([^:$]*\): \(CXX\|CUDA\)_EXECUTABLE_LINKER.*/\1/p' "$build/build.ninja" | sort -u)
# The gpu tests' commands, as CMake wrote them (resolved paths) into the CTestTestfile.cmake files.
mapfile -t gpu_names < <(cd "$build" && ctest -L gpu -N | sed -n 's/^ *Test *#[0-9]*: //p')
[ ${#gpu_names[@]} -gt 0 ] || fail "ctest lists no gpu tests in $build"
gpu_tests=$(for n in "${gpu_names[@]}"; do
              find "$build" -name CTestTestfile.cmake -exec grep -hF "add_test([=[$n]=] " {} +; done)
[ "$(wc -l <<< "$gpu_tests")" -ge ${#gpu_names[@]} ] || fail "not every gpu test's command is in $build's CTestTestfile.cmake files"
targets=(mgrl perf/bench_attention)
for e in $exes; do
  grep -q "$build/$e[\" ]" <<< "$gpu_tests" && targets+=("$e")
done
mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]}" > "$build/build.log" 2>&1 ||
  { grep -E -B2 -A8 "error|FAILED" "$build/build.log" | head -n 80; fail "building ${targets[*]} with CUDA 11.8"; }

# ---- device code: compute_70 PTX only (no SASS: the driver must JIT it) ----
cuobjdump="$MGRL_CUDA118_HOME/bin/cuobjdump"
objects=$(grep -c '^build kernels/CMakeFiles/mgrl_kernels\.dir/cuda/[^:]*\.cu\.o:' "$build/build.ninja" || true)
[ "$objects" -gt 0 ] || fail "no CUDA objects in $build/kernels"
with_code=()
for t in "${targets[@]}"; do
  ptx=$("$cuobjdump" --list-ptx "$build/$t" 2>&1 || true)
  n_ptx=$(grep -c '\.ptx' <<< "$ptx" || true)
  [ "$n_ptx" -eq 0 ] && continue  # no device code (check_train, test_comm, ...)
  with_code+=("$t")
  n_70=$(grep -c 'sm_70\.ptx' <<< "$ptx" || true)
  # mgrl links every CUDA object; the others the objects of the static library they use, and their own.
  [ "$n_70" = "$n_ptx" ] && { [ "$t" != mgrl ] || [ "$n_ptx" = "$objects" ]; } ||
    { echo "$ptx"; fail "$t holds $n_ptx PTX images ($n_70 for compute_70); mgrl must hold $objects (its CUDA objects)"; }
  elf=$("$cuobjdump" --list-elf "$build/$t" 2>&1 || true)
  grep -q '\.cubin' <<< "$elf" && { echo "$elf"; fail "$t holds SASS (ELF images): it must be PTX only"; }
done
for t in mgrl tests/test_ops_cuda tests/test_model_cuda perf/bench_attention; do
  [[ " ${with_code[*]} " == *" $t "* ]] || fail "$t was not built or holds no device code"
done
# The attention kernels' PTX: the Volta kernels (wmma m16n16k16, HMMA on sm_70) are there, the sm_75/sm_80 instruction
# forms (mma.sync m16n8k8/k16, ldmatrix) are not (compiled out: the tiled kernels trap and are never chosen).
ptx_text=$("$cuobjdump" -ptx "$build/mgrl") || fail "cuobjdump -ptx could not read $build/mgrl"
for k in sm70_forward_kernel sm70_dq_kernel sm70_dkv_kernel fa_forward_kernel rmsnorm_forward_kernel adamw_kernel \
         lora_addmm_kernel sample_kernel f32_to_storage_kernel; do
  grep -qE "^(\.visible )?\.entry .*$k" <<< "$ptx_text" || fail "no compute_70 PTX entry for $k in $build/mgrl"
done
grep -q 'wmma\.mma\.sync\.aligned\..*m16n16k16\.f32\.f32' <<< "$ptx_text" ||
  fail "the PTX of mgrl has no wmma m16n16k16 with fp32 accumulation (the Volta attention's tensor-core op)"
grep -qE 'mma\.sync\.aligned\.m16n8|ldmatrix' <<< "$ptx_text" && fail "the compute_70 PTX holds sm_75+ instructions (mma m16n8 or ldmatrix)"
ptx_isa=$(sed -n 's/^\.version //p' <<< "$ptx_text" | sort -u | paste -sd, -)

# ---- libraries: cudart 11 from BUILD/cudart11, cuBLAS 13 and NCCL of the system, nothing else of CUDA's ----
for t in "${targets[@]}"; do
  for mode in rpath ld_library_path; do
    if [ $mode = rpath ]; then libs=$(ldd "$build/$t") || fail "ldd could not read $build/$t"
    else libs=$(LD_LIBRARY_PATH="$build/cudart11" ldd "$build/$t") || fail "ldd could not read $build/$t"; fi
    grep -q "libcudart.so.11.0 => $build/cudart11/libcudart.so.11.0" <<< "$libs" ||
      { echo "$libs"; fail "$t ($mode) does not load libcudart.so.11.0 from $build/cudart11"; }
    grep -qE "libcudart\.so\.1[2-9]|libcublas(Lt)?\.so\.1[0-2]|$(dirname "$MGRL_CUDA118_HOME")" <<< "$libs" &&
      { echo "$libs"; fail "$t ($mode) loads another CUDA runtime, cuBLAS 11/12 or a library of the CUDA 11.8 cache"; }
  done
  if grep -q "libcublas" <<< "$libs"; then
    grep -q "libcublas.so.13 => $cublas_dir/libcublas.so.13" <<< "$libs" &&
      grep -q "libcublasLt.so.13 => $cublas_dir/libcublasLt.so.13" <<< "$libs" ||
      { echo "$libs"; fail "$t does not load cuBLAS 13 from $cublas_dir"; }
  fi
  if grep -q "libnccl" <<< "$libs"; then
    grep -q "libnccl.so.2 => $(readlink -f "$nccl_lib")\|libnccl.so.2 => $nccl_lib" <<< "$libs" ||
      { echo "$libs"; fail "$t does not load the system's NCCL ($nccl_lib)"; }
  fi
done
libs=$(ldd "$build/mgrl")
grep -q "libcublas.so.13" <<< "$libs" && grep -q "libnccl.so.2" <<< "$libs" || fail "mgrl does not link cuBLAS 13 and NCCL"

# ---- cuBLAS 13 behind 11.8's headers: the same prototypes and enumerator values for everything mgrl uses ----
chk="$build/cublas-abi"
mkdir -p "$chk"
mapfile -t funcs < <(for t in "${targets[@]}"; do nm -D --undefined-only "$build/$t"; done |
                       awk '{ print $NF }' | sed 's/@.*//' | grep '^cublas' | sort -u)
[ ${#funcs[@]} -gt 0 ] || fail "the binaries import no cuBLAS function (nm -D)"
defined=$(nm -D --defined-only "$cublas_dir/libcublas.so.13" | awk '{ print $NF }' | sed 's/@.*//')
for f in "${funcs[@]}"; do grep -qx "$f" <<< "$defined" || fail "libcublas.so.13 does not define $f"; done
mapfile -t enums < <(grep -rhoE '\b(CUBLAS|CUDA_R)_[A-Z0-9_]+' "$root/kernels" "$root/src" |
                       grep -vE '^CUBLAS_(CHECK|CHECK_[A-Z_]*)$' | sort -u)
# The prototypes, as clang reads them in C (C++ adds inline overloads that are not what the binaries import).
clang=""
for c in "$MGRL_CUDA118_CC" clang-14 clang; do
  [ -n "$c" ] && [[ "$("$c" --version 2>/dev/null || true)" == *"clang version"* ]] && { clang=$c; break; }
done
[ -n "$clang" ] || fail "the cuBLAS API check needs clang (clang-14, as scripts/cuda118.sh installs)"
printf '#include <cublas_v2.h>\n' > "$chk/include.c"
for v in 11 13; do
  inc=$MGRL_CUDA118_HOME/include; [ $v = 13 ] && inc=$cublas_h13
  : > "$chk/proto$v.txt"
  for f in "${funcs[@]}"; do
    p=$("$clang" -x c -fsyntax-only -I"$inc" -Xclang -ast-dump -Xclang -ast-dump-filter -Xclang "$f" "$chk/include.c" |
          grep -E "FunctionDecl .* $f '" | head -n 1 | sed "s/.* $f '/'/") || true
    [ -n "$p" ] || fail "no declaration of $f in $inc's cublas_v2.h"
    echo "$f $p" >> "$chk/proto$v.txt"
  done
done
diff "$chk/proto11.txt" "$chk/proto13.txt" > "$chk/diff.txt" ||
  { cat "$chk/diff.txt"; fail "cuBLAS 11.8's and 13's headers declare a function mgrl calls differently (above)"; }
# The types those prototypes name (their sizes) and the enumerators mgrl passes (their values), in both versions.
mapfile -t types < <(sed "s/^[^ ]* //" "$chk/proto11.txt" | grep -oE '[A-Za-z_][A-Za-z_0-9]*' |
                       grep -vxE 'const|void|struct|enum|union|volatile|restrict' | sort -u)
{
  echo "/* cublas_abi.c: written by scripts/volta_ptx_build.sh: sizes and enumerators mgrl relies on. */"
  echo "#include <cublas_v2.h>"
  echo "#include <stdio.h>"
  echo "int main(void) {"
  for t in "${types[@]}"; do echo "  printf(\"sizeof(%s) %zu\\n\", \"$t\", sizeof($t));"; done
  for e in "${enums[@]}"; do echo "  printf(\"%s %lld\\n\", \"$e\", (long long)($e));"; done
  echo "  return 0;"
  echo "}"
} > "$chk/cublas_abi.c"
for v in 11 13; do
  inc=$MGRL_CUDA118_HOME/include; [ $v = 13 ] && inc=$cublas_h13
  "$clang" -x c -I"$inc" "$chk/cublas_abi.c" -o "$chk/abi$v" > "$chk/compile$v.log" 2>&1 ||
    { cat "$chk/compile$v.log"; fail "compiling the cuBLAS enumerator check against $inc"; }
  "$chk/abi$v" > "$chk/abi$v.txt" || fail "the cuBLAS enumerator check ($v) failed to run"
done
diff "$chk/abi11.txt" "$chk/abi13.txt" > "$chk/diff.txt" ||
  { cat "$chk/diff.txt"; fail "cuBLAS 11.8's and 13's headers differ in a type size or enumerator mgrl uses (above)"; }
rm -f "$chk/abi11" "$chk/abi13"  # (executables: the device bundle would pack them)

# ---- the binary runs (CPU backend here) and says what it was built with ----
info=$("$build/mgrl" info --runtime.backend=cpu 2>&1) || { echo "$info"; fail "mgrl info (compute_70 PTX build) failed"; }
grep -q "architectures 70-virtual)" <<< "$info" || { echo "$info"; fail "mgrl info does not report the compute_70 PTX build"; }
grep -q "^NCCL: 2\." <<< "$info" || { echo "$info"; fail "mgrl info reports no NCCL 2.x"; }
echo "volta_ptx_build: ${#targets[@]} executables (${#with_code[@]} with device code: compute_70 PTX, ISA $ptx_isa," \
     "no SASS), $objects CUDA objects, cudart 11 in $build/cudart11, cuBLAS 13 ($cublas_dir, ${#funcs[@]} functions" \
     "and ${#enums[@]} enumerators alike in 11.8's and 13's headers), NCCL $(sed -n 's/^NCCL: //p' <<< "$info");" \
     "$(( $(date +%s) - start )) s"
