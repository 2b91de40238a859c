#!/usr/bin/env bash
# gpu_program.sh: the whole GPU programme of issue 19 in one call on a GPU machine, every log under $OUT.
#
# Here:   MGRL_CUDA_ARCHS=90 MGRL_BUILD_DIR=build-gpu bash scripts/build.sh
#         bash ../shared/hooks/device-bundle.sh build-gpu
# There:  source .device/env.sh && bash perf/gpu_program.sh [STAGE ...]       (carry [".device"], and ".whl" for trl:
#         bash perf/fetch_trl_wheels.sh here first)
#
# Stages (default: all, in this order): info ctest sanitize_runs sanitize attention norm train_ab train gen gen_sync
#   gen_merge gen_fused sampler grpo grpo15 scaling ncu
#   info       nvidia-smi, mgrl info on the CUDA backend, the measured copy bandwidth
#   ctest      ctest -L gpu, then tests/test_ops_cuda and test_model_cuda verbosely (each comparison's error)
#   sanitize   compute-sanitizer memcheck, racecheck, synccheck, initcheck over the gpu tests ($SANITIZE_TESTS,
#              default test_model_cuda test_ops_cuda; tools: $SANITIZE_TOOLS)
#   sanitize_runs  the same tools over 2 steps each of SFT, GRPO, distill and DPO with sync_ref_model (full fine-tuning)
#              (the Qwen2 test fixture, CUDA backend; distill's teacher: tests/data/distill/teachers/qwen2_wide,
#              quantized to NF4 at load)
#   attention  perf/bench_attention (tiled vs naive) and perf/bench_attention_torch.py (torch sdpa flash)
#   norm       perf/bench_norm (RMSNorm forward, dx, residual + norm in GB/s beside a copy) as built and with
#              MGRL_FUSED_NORM=0
#   attention_sm70  (not in the default list) perf/bench_attention with MGRL_CUDA_ATTENTION=sm70: the Volta wmma
#              kernels against the mma.sync ones on this GPU, every shape in fp16
#   volta      (not in the default list; issue 21 item 4) the CUDA 11.8 compute_70 PTX-only build of
#              scripts/volta_ptx_build.sh ($MGRL_VOLTA_PTX_DIR, default build-volta-ptx), JIT-compiled by this GPU's
#              driver, in four stages that also run alone: volta_info (mgrl info, the libraries loaded, the JIT's
#              cost: first and second call), volta_sft (gpu.sft_fp16_tracks_bf16 verbosely: 100 fp16 steps with
#              loss scaling against bf16, both from this build; the metrics to $OUT/volta_sft_*), volta_attention
#              (bench_attention with MGRL_CUDA_ATTENTION=sm70, every shape fp16, from this build and, when carried,
#              the normal sm_90 build's: $OUT/volta_attention.md, PTX sm70 against sm_90 tiled), volta_ctest
#              (ctest -L gpu but gpu.sft_fp16_tracks_bf16; the attention tests verbosely: which kernels ran).
#              docs/performance.md ("The Volta code on an H100") has the recipe.
#   train      perf/train_vs_hf.py at the Qwen2.5 0.5B, 1.5B (batch 8 x 1024) and 7B (4 x 1024) shapes
#   train05, train15, train7   the same at one shape
#   train_concat  mgrl alone at 0.5B with MGRL_LORA_CONCAT off and on (in `first`)
#   train_ab   mgrl alone at 0.5B: as built, then MGRL_FUSED_LM_HEAD=0, then MGRL_LORA_GROUPS=0, then
#              MGRL_CUBLASLT_BIAS=0, then MGRL_FUSED_NORM=0 (changes of 2026-11-25, never run on a GPU before: their
#              effect on the step)
#   gen        perf/gen_vs_hf.py at the 0.5B shape, batch 1, 8, 64, 256
#   sampler    perf/bench_sample (Ops::sample at a 152k vocabulary, batch 1-256, greedy / T 1 / top-p / top-k) with
#              the radix thresholds (as built), with MGRL_RADIX_SAMPLER=0 (the 32-pass bit-by-bit search) and with
#              MGRL_SAMPLER_SPLIT=1 (rows cut into chunks: greedy and T 1 rows): $OUT/bench_sample.txt
#   gen_sync   mgrl alone at batch 1 and 64 with generate.sync_interval = 1 (a host round trip per decode step) and
#              with the default (8): $OUT/gen_sync1.md and $OUT/gen_sync8.md; then the default with MGRL_FUSED_NORM=0
#              (the residual adds and norms unfused): $OUT/gen_sync8_no_fused_norm.md
#   gen_merge  mgrl alone at batch 1 and 64 with a LoRA adapter, generate.merge_lora = off (the LoRA kernels in every
#              decode step) and on (the adapter merged into the weights; never run on a GPU before):
#              $OUT/gen_merge_off.md, $OUT/gen_merge_on.md; then perf/merge_mismatch.py (greedy and sampled, merged
#              against unmerged, an adapter with B ~ normal(0, 0.01)): $OUT/merge_mismatch.md
#   gen_fused  the decode step's fused ops (issue 19 item 3; never run on a GPU before): perf/bench_gemv (the GEMV and
#              RoPE + KV store kernels against the separate ops, us and GB/s): $OUT/bench_gemv.txt; then mgrl alone at
#              batch 1, 8 and 64 as built and with MGRL_DECODE_FUSED=0: $OUT/gen_fused_on.md, $OUT/gen_fused_off.md
#   grpo       perf/grpo_vs_trl.py at the 0.5B shape (needs the trl wheels carried in .whl)
#   grpo15     a 1.5B-shaped GRPO run of 50 steps (mgrl only), its phase table
#   grpo_ab    (not in the default list) mgrl alone at the grpo stage's 0.5B shape, 4 steps, as built and with
#              MGRL_SCORED_ROWS=0 (the LM head on every row, prompts included): $OUT/grpo_ab_{on,no_scored_rows}.md
#   scaling    perf/scaling at 1 rank on the CUDA backend
#   ncu        ncu, every launch timed alone, tables by kernel (perf/ncu_table.py): one SFT step at 0.5B (batch 8 x
#              1024; $OUT/ncu_train.md) and one decode step at batch 1 and 64 (5 new tokens minus 1, over 4;
#              $OUT/ncu_decode_b{1,64}.md) (also alone: ncu_train, ncu_decode)
#   large      (not in the default list; issue 23's targets) perf/bench_nf4 (NF4 dequantize + cuBLAS against the bf16
#              GEMM at 7B/70B shapes; target >= 0.70), then perf/large_step.sh: a Llama-3.1-70B-shaped QLoRA SFT at
#              batch 1 x 2048 with recompute at $LARGE_LAYERS layers (default "8 80"), mgrl plan against the measured
#              peak: $OUT/large.md
#   gen_pdl    (not in the default list) mgrl alone at batch 1, 8, 64 as built, with MGRL_PDL=1, with
#              MGRL_DECODE_NORM_FOLD=1, and with both, MGRL_SAMPLER_SPLIT=1 and MGRL_GATE_UP_STACKED=1:
#              $OUT/gen_pdl_{off,pdl,fold,all}.md
#   first      (a preset, not a stage) the programme for a session's first call when device time is short (15
#              minutes a session: one call of at most 600 s after a start of 1-2 minutes): info, ctest_quick (ctest -L
#              gpu alone, 3 at a time), train05, grpo (carry ".whl"), gen, gen_pdl, sampler, train15, under a
#              deadline of 540 s (what does not fit is skipped and said). The first five took 251 s on the H200 of
#              2026-11-27 (second session).
#   initcheck  (not in the default list) tests/gpu/test_gemm_cuda's instances one by one under initcheck (does the
#              tool see the writes of the cuBLAS GEMM whose output lora_fold_kernel reads?), then the gpu tests and 2
#              steps of SFT and GRPO under initcheck with MGRL_CUDA_LORA=fused; reports counted by kernel:
#              $OUT/initcheck.md
#   racecheck  (not in the default list) racecheck over the ops with shared-memory kernels and the fused decode test:
#              $OUT/racecheck.md
#   second     (a preset) for a second call: ncu_decode (one decode step's kernels at batch 1 and 64), initcheck,
#              racecheck, ncu_train, train15 (memcheck and synccheck were clean on 2026-11-27); deadline 540 s.
# Each stage has a time budget (GPU_STAGE_TIMEOUT_<stage> seconds overrides it), cut to what is left of the whole
# call's deadline (GPU_DEADLINE seconds from the start; a stage that would get under 20 s is skipped, said in the
# summary) so that the call ends with its results packed before the device tool's limit. The device tool returns at
# most 8 files from $OUT: stages write their tables into a results folder, and $OUT gets three files, re-packed after
# every stage (so a call cut short still returns what ran): summary.txt (a line per stage), results.md (every result
# file, each under its name) and logs.tgz (every log and result file).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dev_out=${OUT:-$root/gpu_out}
mkdir -p "$dev_out"
logs=$(mktemp -d /tmp/gpu_logs.XXXX)
# The stages write their tables to $OUT, which is this results folder inside the logs.
OUT=$logs/results
mkdir -p "$OUT"
t_start=$SECONDS
build=${MGRL_BUILD_DIR:-$root/build-gpu}
mgrl=$build/mgrl
models=$root/tests/data/models
export PYTHONUNBUFFERED=1

pack() {
  cp "$OUT/summary.txt" "$dev_out/summary.txt" 2>/dev/null
  local f
  for f in "$OUT"/*; do
    [ -f "$f" ] && [ "$(basename "$f")" != summary.txt ] && case $f in *.md|*.txt|*.jsonl) printf '=== %s ===\n' "$(basename "$f")"; cat "$f"; echo ;; esac
  done > "$dev_out/results.md"
  tar -czf "$dev_out/logs.tgz" -C "$logs" . 2>/dev/null
}
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
# run_stage NAME DEFAULT_SECONDS COMMAND...: runs the command under a time limit, log in $logs/NAME.log.
run_stage() {
  local name=$1 secs=$2; shift 2
  local var="GPU_STAGE_TIMEOUT_$name"; secs=${!var:-$secs}
  if [ -n "${GPU_DEADLINE:-}" ]; then
    local left=$((GPU_DEADLINE - (SECONDS - t_start) - 15))  # 15 s for the last pack
    if [ "$left" -lt 20 ]; then note "stage $name: skipped (the call's deadline: ${GPU_DEADLINE} s)"; pack; return 0; fi
    [ "$left" -lt "$secs" ] && secs=$left
  fi
  local t0=$SECONDS
  echo "=== $name (limit ${secs} s) ==="
  timeout --kill-after=10 "$secs" bash -o pipefail -c "$*" > "$logs/$name.log" 2>&1
  local rc=$?
  note "stage $name: rc $rc, $((SECONDS - t0)) s"
  tail -n 40 "$logs/$name.log"
  pack
  return 0
}

# Whole-program inputs on the Qwen2 fixture: 2 SFT steps and 2 GRPO steps on the CUDA backend.
SFT_SMALL="$mgrl sft --runtime.backend=cuda --model.path=$models/qwen2_bias_tied --model.tokenizer=$root/inputs/quickstart \
 --data.input=$root/tests/data/sft/train.jsonl --train.batch_size=4 --train.max_steps=2 --lora.r=4 --lora.alpha=8 \
 --checkpoint.resume=none --log.dir=/tmp/gp_sft --checkpoint.dir=/tmp/gp_sft/ck"
DISTILL_SMALL="$mgrl distill --runtime.backend=cuda --model.path=$models/qwen2_bias_tied \
 --model.tokenizer=$root/inputs/quickstart --data.input=$root/tests/data/sft/train.jsonl \
 --eval.input=$root/tests/data/sft/heldout.jsonl --distill.teacher=$root/tests/data/distill/teachers/qwen2_wide \
 --train.batch_size=4 --train.max_steps=2 --lora.r=4 --lora.alpha=8 --distill.max_prompt_length=16 \
 --distill.max_completion_length=8 --distill.beta=0.5 --distill.teacher_quantize=nf4 --checkpoint.resume=none \
 --log.dir=/tmp/gp_distill \
 --checkpoint.dir=/tmp/gp_distill/ck"
# TR-DPO on the GPU: full fine-tuning (bf16 weights, fp32 master copy), the reference mixed after each step
DPO_SYNC_SMALL="$mgrl dpo --runtime.backend=cuda --model.path=$models/qwen2_bias_tied \
 --model.tokenizer=$root/inputs/quickstart --data.input=$root/tests/data/dpo_cli/train.jsonl --train.batch_size=4 \
 --train.max_steps=2 --train.full_finetune=true --dpo.sync_ref_model=true --dpo.ref_model_sync_steps=1 \
 --checkpoint.resume=none --log.dir=/tmp/gp_dpo --checkpoint.dir=/tmp/gp_dpo/ck"
GRPO_SMALL="$mgrl $root/tests/data/grpo_cli/grpo.toml --runtime.backend=cuda --model.path=$models/qwen2_bias_tied \
 --model.tokenizer=$root/inputs/quickstart --data.input=$root/tests/data/sft/train.jsonl --train.max_steps=2 \
 --log.dir=/tmp/gp_grpo --checkpoint.dir=/tmp/gp_grpo/ck"

stage_info() {
  run_stage info 120 "nvidia-smi; $mgrl info --runtime.backend=cuda; python3 -c \"
import torch
x = torch.empty(2**30, dtype=torch.uint8, device='cuda'); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
ts = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); y.copy_(x); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
ts.sort(); print('device copy bandwidth (read + write): %.0f GB/s' % (2 * 2**30 / (ts[5] * 1e-3) / 1e9))
\""
}
stage_ctest() {
  run_stage ctest 900 "cd $build && ctest -L gpu --output-on-failure --timeout 600; \
    echo '--- test_ops_cuda verbose'; $build/tests/test_ops_cuda; echo '--- test_model_cuda verbose'; $build/tests/test_model_cuda"
}
# ctest -L gpu alone (its failures printed), without stage ctest's verbose re-runs, 120 s a test (a hang in a
# never-run kernel must not eat the call), 3 tests at a time (54 s on the H200 of 2026-11-27): for a short call.
stage_ctest_quick() {
  run_stage ctest_quick 360 "cd $build && ctest -L gpu -j ${CTEST_PARALLEL_LEVEL:-3} --output-on-failure --timeout 120"
  grep -E "tests passed|\*\*\*(Failed|Timeout|Exception)|Skipped|Not Run" "$logs/ctest_quick.log" |
    sed 's/^/  ctest_quick: /' | tee -a "$OUT/summary.txt"
}
stage_sanitize_runs() {
  local t
  for t in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
    run_stage "sanrun_$t" 600 "rm -rf /tmp/gp_sft /tmp/gp_grpo /tmp/gp_distill /tmp/gp_dpo; echo '--- sft 2 steps'; \
      compute-sanitizer --tool $t --error-exitcode 99 --print-limit 20 $SFT_SMALL; echo \"rc \$?\"; \
      echo '--- grpo 2 steps'; compute-sanitizer --tool $t --error-exitcode 99 --print-limit 20 $GRPO_SMALL; echo \"rc \$?\"; \
      echo '--- distill 2 steps'; compute-sanitizer --tool $t --error-exitcode 99 --print-limit 20 $DISTILL_SMALL; echo \"rc \$?\"; \
      echo '--- dpo sync_ref_model 2 steps'; compute-sanitizer --tool $t --error-exitcode 99 --print-limit 20 $DPO_SYNC_SMALL; echo \"rc \$?\""
  done
}
stage_sanitize() {
  local t
  for t in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
    run_stage "san_$t" 600 "for b in ${SANITIZE_TESTS:-test_model_cuda test_ops_cuda}; do echo \"--- \$b\"; \
      compute-sanitizer --tool $t --error-exitcode 99 --print-limit 20 $build/tests/\$b --gtest_brief=1; echo \"rc \$?\"; done"
  done
}
stage_attention() {
  run_stage attention 300 "$build/perf/bench_attention 20; python3 $root/perf/bench_attention_torch.py --reps 20"
}
# The RMSNorm kernels in GB/s beside a copy, as built (row groups, the fused residual + norm) and with
# MGRL_FUSED_NORM=0 (the kernels of before): $OUT/bench_norm{,_unfused}.txt.
stage_norm() {
  run_stage norm 300 "$build/perf/bench_norm 20 | tee $OUT/bench_norm.txt && \
    MGRL_FUSED_NORM=0 $build/perf/bench_norm 20 | tee $OUT/bench_norm_unfused.txt"
}
stage_attention_sm70() {
  run_stage attention_sm70 300 "MGRL_CUDA_ATTENTION=sm70 $build/perf/bench_attention 20"
}
# Issue 21 item 4: the Volta code paths (sm70 attention, fp16 storage and loss scaling) from a compute_70 PTX-only build.
# volta_ready NAME: whether the build is here (else one line in the summary, and gpu_program.sh exits 1); sets vb and
# venv (cudart 11 of the build, also on its binaries' RUNPATH; a JIT cache of its own, large enough for every kernel).
volta_ready() {
  vb=${MGRL_VOLTA_PTX_DIR:-$root/build-volta-ptx}
  venv="export LD_LIBRARY_PATH=$vb/cudart11\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} CUDA_CACHE_PATH=/tmp/volta_jit \
    CUDA_CACHE_MAXSIZE=4294967296;"
  local f missing=()
  for f in mgrl cudart11/libcudart.so.11.0 tests/test_ops_cuda tests/test_model_cuda tests/check_train \
           perf/bench_attention CTestTestfile.cmake; do
    [ -e "$vb/$f" ] || missing+=("$f")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  note "stage $1: FAILED before it ran: $vb lacks ${missing[*]} (the compute_70 PTX build: bash" \
       "scripts/volta_ptx_build.sh, then the device bundle of it; docs/performance.md, 'The Volta code on an H100')"
  setup_failed=1
  return 1
}
# mgrl info on the CUDA backend twice: the first call pays the driver's JIT of every kernel (cudart 11 loads modules
# eagerly), the second finds them in the JIT cache.
stage_volta_info() {
  volta_ready volta_info || return 0
  run_stage volta_info 180 "$venv rm -rf /tmp/volta_jit; nvidia-smi -L; ldd $vb/mgrl | grep -E 'cudart|cublas|nccl'; \
    for i in 1 2; do t0=\$(date +%s%N); $vb/mgrl info --runtime.backend=cuda; rc=\$?; \
      echo \"mgrl info call \$i: rc \$rc, \$(( (\$(date +%s%N) - t0) / 1000000 )) ms (JIT cache: \$(du -sh /tmp/volta_jit 2>/dev/null | cut -f1))\"; done"
  grep -E "^(rank|build|backend|CUDA|NCCL):? |mgrl info call|^mgrl: error" "$logs/volta_info.log" | head -n 12 |
    sed 's/^/  volta_info: /' | tee -a "$OUT/summary.txt"
}
# gpu.sft_fp16_tracks_bf16 verbosely: 100 LoRA steps in fp16 with dynamic loss scaling against bf16 (this build both).
stage_volta_sft() {
  volta_ready volta_sft || return 0
  run_stage volta_sft 180 "$venv cd $vb && ctest -R '^gpu[.]sft_fp16_tracks_bf16\$' -V --timeout 170; rc=\$?; \
    for r in bf16 fp16; do cp $vb/tests/sft/fp16/\$r/metrics.jsonl $OUT/volta_sft_\$r.metrics.jsonl; \
      cp $vb/tests/sft/fp16/\$r/job_summary.txt $OUT/volta_sft_\$r.job_summary.txt; done; exit \$rc"
  grep -E "check_train: .*steps compared|^[0-9]+: loss scaling: |% tests passed|Skipped|Failed" "$logs/volta_sft.log" |
    grep -v "Test command" | sed 's/^[0-9]*: //; s/^/  volta_sft: /' | tee -a "$OUT/summary.txt"
}
# bench_attention with MGRL_CUDA_ATTENTION=sm70 (every shape in fp16) from the PTX build, and from the normal sm_90
# build when it is here (in $MGRL_BUILD_DIR, or carried as .carry/bench_attention_sm90.tar.xz): that one times the
# Volta kernels compiled for sm_90 and the mma.sync (tiled) kernels; $OUT/volta_attention.md puts them side by side.
stage_volta_attention() {
  volta_ready volta_attention || return 0
  local sm90=${MGRL_SM90_BENCH:-$build/perf/bench_attention}
  if [ ! -x "$sm90" ] && [ -f "$root/.carry/bench_attention_sm90.tar.xz" ]; then
    mkdir -p /tmp/volta_sm90 && tar -xJf "$root/.carry/bench_attention_sm90.tar.xz" -C /tmp/volta_sm90 &&
      sm90=/tmp/volta_sm90/bench_attention
  fi
  local with_sm90="echo 'no sm_90 bench_attention ($sm90): the tiled comparison is left out'"
  [ -x "$sm90" ] && with_sm90="echo '--- the sm_90 build (Volta kernels compiled for sm_90, and tiled)'; \
    MGRL_CUDA_ATTENTION=sm70 $sm90 20 | tee $OUT/volta_bench_sm90.txt"
  rm -f "$OUT/volta_bench_ptx.txt" "$OUT/volta_bench_sm90.txt"
  run_stage volta_attention 150 "echo '--- the compute_70 PTX build (Volta kernels, JIT-compiled)'; \
    ($venv MGRL_CUDA_ATTENTION=sm70 $vb/perf/bench_attention 20) | tee $OUT/volta_bench_ptx.txt; $with_sm90"
  volta_attention_table "$OUT/volta_bench_ptx.txt" "$OUT/volta_bench_sm90.txt" > "$OUT/volta_attention.md"
  sed 's/^/  volta_attention: /' "$OUT/volta_attention.md" | tee -a "$OUT/summary.txt"
}
# ctest -L gpu but gpu.sft_fp16_tracks_bf16 (volta_sft runs it), then the attention tests verbosely: their first line
# says which kernels ran ("sm70 (built for 70-virtual)").
stage_volta_ctest() {
  volta_ready volta_ctest || return 0
  run_stage volta_ctest 540 "$venv cd $vb && ctest -L gpu -E '^gpu[.]sft_fp16_tracks_bf16\$' --output-on-failure --timeout 300; \
    rc=\$?; echo '--- the attention tests, verbosely (which kernels ran)'; $vb/tests/test_ops_cuda --gtest_filter='*Attention*'; \
    exit \$rc"
  grep -E "% tests passed|attention kernels at head_dim|^\[  (PASSED|FAILED) |\*\*\*(Failed|Skipped|Timeout)|skipped" \
    "$logs/volta_ctest.log" | sed 's/^/  volta_ctest: /' | tee -a "$OUT/summary.txt"
}
# All four, the shortest first. Limits 180 + 180 + 150 + 540 s (the first JIT of every kernel falls in volta_info): a
# `run` of 600 s cut short in volta_ctest keeps the other three's results, and volta_ctest alone fits a second call.
stage_volta() { stage_volta_info; stage_volta_sft; stage_volta_attention; stage_volta_ctest; }
# volta_attention_table PTX_LOG SM90_LOG: per shape, forward and backward ms of the Volta kernels from the PTX build,
# of the Volta kernels and the tiled ones from the sm_90 build, and PTX sm70 / sm_90 tiled (a markdown table).
volta_attention_table() {
  awk 'FNR == 1 { f++; key = "" }
       /^[^ ]/ { key = ($2 == "fp16" && NF == 6) ? $1 " " $2 " " $3 " " $4 " " $5 " " $6 : "" }
       /^[^ ]/ && key != "" && !(key in seen) { seen[key] = 1; order[++n] = key }
       /^  (forward|backward) / && key != "" { t[f, key, $2, $1] = $3 }
       END {
         print "| shape (fp16) | PTX sm70 fwd ms | PTX sm70 bwd ms | sm_90 sm70 fwd | sm_90 sm70 bwd | sm_90 tiled fwd | sm_90 tiled bwd | PTX sm70 / tiled fwd | bwd |"
         print "|---|---|---|---|---|---|---|---|---|"
         for (i = 1; i <= n; i++) {
           k = order[i]; a = t[1, k, "sm70", "forward"]; b = t[1, k, "sm70", "backward"]
           c = t[2, k, "sm70", "forward"]; d = t[2, k, "sm70", "backward"]; e = t[2, k, "tiled", "forward"]; g = t[2, k, "tiled", "backward"]
           rf = (a != "" && e != "") ? sprintf("%.2fx", a / e) : "-"; rb = (b != "" && g != "") ? sprintf("%.2fx", b / g) : "-"
           printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", k, a ? a : "-", b ? b : "-", c ? c : "-", d ? d : "-", e ? e : "-", g ? g : "-", rf, rb
         }
       }' "$1" "$([ -f "${2:-}" ] && echo "$2" || echo /dev/null)"
}
stage_train05() {
  run_stage train05 420 "python3 $root/perf/train_vs_hf.py --mgrl $mgrl --shape qwen2.5-0.5b --batch 8 --seq 1024 \
    --steps 20 --warmup 5 --out $OUT/train.md"
}
stage_train15() {
  run_stage train15 600 "python3 $root/perf/train_vs_hf.py --mgrl $mgrl --shape qwen2.5-1.5b --batch 8 --seq 1024 \
    --steps 12 --warmup 4 --out $OUT/train.md"
}
stage_train7() {
  run_stage train7 900 "python3 $root/perf/train_vs_hf.py --mgrl $mgrl --shape qwen2.5-7b --batch 4 --seq 1024 \
    --steps 8 --warmup 3 --out $OUT/train.md"
}
stage_train() { stage_train05; stage_train15; stage_train7; }
# train_ab: mgrl alone at the 0.5B shape with the 2026-11-25 changes on (default), then each turned off: the fused LM
# head of SFT (MGRL_FUSED_LM_HEAD=0), the stacked LoRA groups (MGRL_LORA_GROUPS=0), the bias in cuBLASLt's epilogue
# (MGRL_CUBLASLT_BIAS=0) and the residual adds fused into RMSNorm with the row-group norm kernels (MGRL_FUSED_NORM=0);
# predicted ~4.5 ms, ~3-4 ms, the 1.0 ms of bias broadcasts and more, and ~2-2.5 ms of the 82 ms step
# (docs/performance.md).
# Tables: $OUT/train_ab_{on,no_fused_head,no_lora_groups,no_cublaslt_bias,no_fused_norm}.md
stage_train_ab() {
  run_stage train_ab 600 "for v in on no_fused_head no_lora_groups no_cublaslt_bias no_fused_norm; do \
    echo \"--- \$v\"; case \$v in no_fused_head) e=MGRL_FUSED_LM_HEAD=0 ;; no_lora_groups) e=MGRL_LORA_GROUPS=0 ;; \
      no_cublaslt_bias) e=MGRL_CUBLASLT_BIAS=0 ;; no_fused_norm) e=MGRL_FUSED_NORM=0 ;; *) e=MGRL_UNUSED=1 ;; esac; \
    env \$e python3 $root/perf/train_vs_hf.py --mgrl $mgrl --shape qwen2.5-0.5b --batch 8 --seq 1024 --steps 20 \
      --warmup 5 --skip-hf --out $OUT/train_ab_\$v.md; done"
}
# train_concat: mgrl alone at the 0.5B shape, as built and with MGRL_LORA_CONCAT=1 (the linears of q|k|v and gate|up
# and their adapters as one GEMM a layer over concatenated operands, written 2026-11-27 without a GPU; predicted
# ~3-4 ms of the 67 ms H200 step from gate|up's read-modify-write of y, docs/performance.md).
# Tables: $OUT/train_concat_{off,on}.md
stage_train_concat() {
  run_stage train_concat 300 "for v in off on; do echo \"--- \$v\"; \
    env MGRL_LORA_CONCAT=\$([ \$v = on ] && echo 1 || echo 0) python3 $root/perf/train_vs_hf.py --mgrl $mgrl \
      --shape qwen2.5-0.5b --batch 8 --seq 1024 --steps 20 --warmup 5 --skip-hf --out $OUT/train_concat_\$v.md; done"
}
stage_gen() {
  run_stage gen 900 "python3 $root/perf/gen_vs_hf.py --mgrl $mgrl --model-cache /tmp/gen_models \
    --shape qwen2.5-0.5b --batches ${GEN_BATCHES:-1,8,64,256} \
    --prompt-len 128 --new-tokens 256 --repeats ${GEN_REPEATS:-3} --out $OUT/gen.md"
}
# The sampler alone: radix top-k / top-p thresholds (2026-11-25, never run on a GPU before) against the bit-by-bit search.
stage_sampler() {
  run_stage sampler 300 "{ for r in 1 0; do MGRL_RADIX_SAMPLER=\$r $build/perf/bench_sample 20 || exit 1; done; \
    MGRL_SAMPLER_SPLIT=1 $build/perf/bench_sample 20; } | tee $OUT/bench_sample.txt"
}
# Decode steps on the device between host round trips (generate.sync_interval): 1 against the default, one run each;
# then the default with the residual adds and norms unfused (MGRL_FUSED_NORM=0).
stage_gen_sync() {
  run_stage gen_sync 600 "for k in 1 8; do python3 $root/perf/gen_vs_hf.py --mgrl $mgrl --model-cache /tmp/gen_models \
    --shape qwen2.5-0.5b \
    --batches ${GEN_SYNC_BATCHES:-1,64} --prompt-len 128 --new-tokens 256 --repeats ${GEN_REPEATS:-3} --skip-hf \
    --sync-interval \$k --out $OUT/gen_sync\$k.md || exit 1; done; MGRL_FUSED_NORM=0 python3 $root/perf/gen_vs_hf.py \
    --mgrl $mgrl --shape qwen2.5-0.5b --batches ${GEN_SYNC_BATCHES:-1,64} --prompt-len 128 --new-tokens 256 \
    --repeats ${GEN_REPEATS:-3} --skip-hf --out $OUT/gen_sync8_no_fused_norm.md"
}
# The decode step's switches of 2026-11-27 (after the second H200 session; never run on a GPU before), mgrl alone at
# batch 1, 8 and 64, one run each: off (as built), pdl (MGRL_PDL=1: each kernel scheduled during the one before it,
# the GEMVs prefetching their weights into L2 there), fold (MGRL_DECODE_NORM_FOLD=1: the RMSNorms folded into the
# q|k|v and gate|up GEMVs, o with its residual add: 7 kernels a layer instead of 9), all (both, the split sampler
# MGRL_SAMPLER_SPLIT=1 and the stacked gate|up GEMM beyond 8 rows MGRL_GATE_UP_STACKED=1): $OUT/gen_pdl_{off,pdl,fold,all}.md.
stage_gen_pdl() {
  run_stage gen_pdl 200 "for v in off pdl fold all; do case \$v in off) e=MGRL_UNUSED=1 ;; pdl) e=MGRL_PDL=1 ;; \
      fold) e=MGRL_DECODE_NORM_FOLD=1 ;; all) e='MGRL_PDL=1 MGRL_DECODE_NORM_FOLD=1 MGRL_SAMPLER_SPLIT=1 MGRL_GATE_UP_STACKED=1' ;; esac; \
      env \$e python3 $root/perf/gen_vs_hf.py --mgrl $mgrl --model-cache /tmp/gen_models \
    --shape qwen2.5-0.5b --batches ${GEN_PDL_BATCHES:-1,8,64} \
      --prompt-len 128 --new-tokens 256 --repeats ${GEN_REPEATS:-3} --skip-hf --out $OUT/gen_pdl_\$v.md || exit 1; done"
}
# LoRA merged for sampling (generate.merge_lora): off against on, one run each, then the token and log-prob mismatch.
stage_gen_merge() {
  run_stage gen_merge 600 "for m in off on; do python3 $root/perf/gen_vs_hf.py --mgrl $mgrl --model-cache /tmp/gen_models \
    --shape qwen2.5-0.5b \
    --batches ${GEN_MERGE_BATCHES:-1,64} --prompt-len 128 --new-tokens 256 --repeats ${GEN_REPEATS:-3} --skip-hf --lora \
    --merge-lora \$m --out $OUT/gen_merge_\$m.md || exit 1; done; python3 $root/perf/merge_mismatch.py --mgrl $mgrl \
    --shape qwen2.5-0.5b --prompts 64 --prompt-len 128 --new-tokens 64 --b-std 0.01 --out $OUT/merge_mismatch.md"
}
# The decode step's fused ops (RoPE + KV store, q|k|v / gate|up + SwiGLU / down + residual GEMVs) against
# MGRL_DECODE_FUSED=0, after their micro-benchmark.
stage_gen_fused() {
  run_stage gen_fused 600 "$build/perf/bench_gemv 20 | tee $OUT/bench_gemv.txt; for f in on off; do \
    e=MGRL_UNUSED=1; [ \$f = off ] && e=MGRL_DECODE_FUSED=0; env \$e python3 $root/perf/gen_vs_hf.py --mgrl $mgrl \
    --model-cache /tmp/gen_models --shape qwen2.5-0.5b --batches ${GEN_FUSED_BATCHES:-1,8,64} --prompt-len 128 --new-tokens 256 \
    --repeats ${GEN_REPEATS:-3} --skip-hf --out $OUT/gen_fused_\$f.md || exit 1; done"
}
stage_grpo() {
  run_stage grpo 900 "if [ -d $root/.whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site $root/.whl/*.whl && export PYTHONPATH=/tmp/site; fi; \
    python3 $root/perf/grpo_vs_trl.py --mgrl $mgrl --shape qwen2.5-0.5b --prompts 16 --G 8 --prompt-len 128 \
    --completion-len 256 --steps ${GRPO_STEPS:-5} --out $OUT/grpo.md"
}
# The LM head on the completions' rows only (Batch::scored_from, 2026-11-27) against every row, mgrl alone.
stage_grpo_ab() {
  run_stage grpo_ab 420 "for v in on no_scored_rows; do echo \"--- \$v\"; \
    if [ \$v = on ]; then e=MGRL_UNUSED=1; else e=MGRL_SCORED_ROWS=0; fi; \
    env \$e python3 $root/perf/grpo_vs_trl.py --mgrl $mgrl --shape qwen2.5-0.5b --prompts 16 --G 8 --prompt-len 128 \
      --completion-len 256 --steps 4 --skip-trl --out $OUT/grpo_ab_\$v.md || exit 1; done"
}
# Issue 19 item 4: a Qwen2.5-1.5B-shaped GRPO run of 50 steps end to end (mgrl alone; its phase table in the log).
stage_grpo15() {
  run_stage grpo15 900 "python3 $root/perf/grpo_vs_trl.py --mgrl $mgrl --shape qwen2.5-1.5b --prompts 16 --G 8 \
    --prompt-len 128 --completion-len 256 --steps 50 --micro-batch 32 --skip-trl --out $OUT/grpo15.md"
}
# Issue 19 item 5: perf/scaling at 1 GPU on the CUDA backend (the built-in workloads; --short keeps it brief).
stage_scaling() {
  run_stage scaling 600 "$root/perf/scaling --mgrl $mgrl --ranks 1 --project --out /tmp/scaling_gpu \
    --runtime.backend=cuda && cp /tmp/scaling_gpu/scaling.md $OUT/scaling.md"
}
stage_ncu() { stage_ncu_train; stage_ncu_decode; }
stage_ncu_train() {
  # One SFT step of the 0.5B shape (the model written by train_vs_hf's maker): every kernel of the run, each timed
  # alone by ncu (the model load's few conversion kernels included), one CSV row a launch; $OUT/ncu_train.md: the
  # kernels by name (perf/ncu_table.py).
  run_stage ncu_train 600 "python3 -c \"
import sys; sys.path.insert(0, '$root/perf'); import train_vs_hf as t
t.make_model('/tmp/ncu_model', 'qwen2.5-0.5b', 'cuda'); t.make_data('/tmp/ncu_train.jsonl', 64, 1024)\" && \
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --log-file $logs/ncu_train.csv \
      $mgrl sft --runtime.backend=cuda --model.path=/tmp/ncu_model \
      --data.input=/tmp/ncu_train.jsonl --train.batch_size=8 --train.max_seq_len=1024 --lora.r=16 --lora.alpha=32 \
      --train.max_steps=1 --log.dir=/tmp/ncu_log --checkpoint.dir=/tmp/ncu_log/ck --checkpoint.resume=none && \
    python3 $root/perf/ncu_table.py $logs/ncu_train.csv --top 50 \
      --title 'ncu, one SFT step at the 0.5B shape (batch 8 x 1024, LoRA r 16 on 7 projections) and the model load' \
      | tee $OUT/ncu_train.md"
}
stage_ncu_decode() {
  # Where a decode step's time goes, at batch 1 and 64 (128-token prompts, greedy): the same generate run with 1 and
  # with 5 new tokens under ncu (every kernel timed alone, one CSV row a launch), the first subtracted from the second
  # by kernel name and divided by 4: the kernels of one decode step ($OUT/ncu_decode_b{1,64}.md, perf/ncu_table.py).
  # Their sum against the measured time a token (stage gen) is the share of launch gaps and host waits (batch 1: 15%
  # of the roofline, 1.53 ms a token on the H200 of 2026-11-27). The first session's 17 new tokens at both batches
  # did not finish in 54 s. Writes the 0.5B model itself when stage ncu_train has not.
  run_stage ncu_decode 300 "[ -f /tmp/ncu_model/config.json ] || python3 -c \"
import sys; sys.path.insert(0, '$root/perf'); import train_vs_hf as t
t.make_model('/tmp/ncu_model', 'qwen2.5-0.5b', 'cuda')\" && python3 -c \"
import json, random; r = random.Random(0)
with open('/tmp/ncu_prompts.jsonl', 'w') as f:
    for i in range(64): f.write(json.dumps({'prompt_tokens': [r.randrange(10, 60) for _ in range(128)]}) + chr(10))\" && \
    for b in 1 64; do head -n \$b /tmp/ncu_prompts.jsonl > /tmp/ncu_p\$b.jsonl; for n in 1 5; do \
      ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        --log-file $logs/ncu_decode_b\${b}_n\$n.csv $mgrl generate --runtime.backend=cuda --model.path=/tmp/ncu_model \
        --data.input=/tmp/ncu_p\$b.jsonl --generate.output=/tmp/ncu_gen\$b.jsonl --generate.max_new_tokens=\$n \
        --generate.temperature=0 --generate.max_sequences=64 || exit 1; done; \
      python3 $root/perf/ncu_table.py $logs/ncu_decode_b\${b}_n5.csv --minus $logs/ncu_decode_b\${b}_n1.csv --per 4 \
        --title \"ncu, one decode step at batch \$b (0.5B shape, greedy; 5 new tokens minus 1, over 4)\" \
        | tee $OUT/ncu_decode_b\$b.md; done"
}
# initcheck, to decide what its reports of 2026-11-27 were (all 20 printed a run in lora_fold_kernel reading the f32
# product of a cuBLAS GEMM, at aligned shapes only): tests/gpu/test_gemm_cuda.cu's ten instances one by one under
# initcheck (Prefilled shows the GEMM writes every element; a report in Fresh is then the tool not seeing that GEMM
# kernel's writes), the reports counted per instance; then the gpu tests and 2 steps of SFT and GRPO with the
# custom LoRA kernels (MGRL_CUDA_LORA=fused: no cuBLAS product read back), reports counted by kernel
# ($OUT/initcheck.md).
stage_initcheck() {
  run_stage initcheck 420 "for i in 0 1 2 3 4 5 6 7 8 9; do echo \"--- test_gemm_cuda instance \$i\"; \
      compute-sanitizer --tool initcheck --error-exitcode 99 --print-limit 2 $build/tests/test_gemm_cuda \
        --gtest_filter=\"*/\$i\"; echo \"rc \$?\"; done; \
    for b in test_ops_cuda test_model_cuda; do echo \"--- \$b (MGRL_CUDA_LORA=fused)\"; MGRL_CUDA_LORA=fused \
      compute-sanitizer --tool initcheck --error-exitcode 99 --print-limit 200 $build/tests/\$b --gtest_brief=1; \
      echo \"rc \$?\"; done; rm -rf /tmp/gp_sft /tmp/gp_grpo; \
    echo '--- sft 2 steps (MGRL_CUDA_LORA=fused)'; MGRL_CUDA_LORA=fused compute-sanitizer --tool initcheck \
      --error-exitcode 99 --print-limit 200 $SFT_SMALL; echo \"rc \$?\"; \
    echo '--- grpo 2 steps (MGRL_CUDA_LORA=fused)'; MGRL_CUDA_LORA=fused compute-sanitizer --tool initcheck \
      --error-exitcode 99 --print-limit 200 $GRPO_SMALL; echo \"rc \$?\""
  sanitizer_counts "$logs/initcheck.log" > "$OUT/initcheck.md"
  sed 's/^/  initcheck: /' "$OUT/initcheck.md" | tee -a "$OUT/summary.txt"
}
# racecheck over the ops whose kernels share memory between threads (attention, sampler, norms, LM head, the decode
# GEMVs, RoPE + KV store) and the fused decode test; not the whole binary (on the H100 it did not finish in 60 s).
stage_racecheck() {
  run_stage racecheck 300 "echo '--- test_ops_cuda (shared-memory kernels)'; compute-sanitizer --tool racecheck \
      --error-exitcode 99 --print-limit 20 $build/tests/test_ops_cuda --gtest_brief=1 \
      --gtest_filter='*Attention*:*Sample*:*Rmsnorm*:*LmHead*:*LinearGroupForward*:*GatedMlpForward*:*LinearResidualForward*:*RopeKvStore*:*Lora*'; \
    echo \"rc \$?\"; echo '--- test_model_cuda (fused decode)'; compute-sanitizer --tool racecheck --error-exitcode 99 \
      --print-limit 20 $build/tests/test_model_cuda --gtest_brief=1 --gtest_filter='*FusedDecode*'; echo \"rc \$?\""
  sanitizer_counts "$logs/racecheck.log" > "$OUT/racecheck.md"
  sed 's/^/  racecheck: /' "$OUT/racecheck.md" | tee -a "$OUT/summary.txt"
}
# sanitizer_counts LOG: for each "--- part" of a sanitizer stage's log, its ERROR SUMMARY, rc, and the printed
# reports counted by kind and kernel.
sanitizer_counts() {
  awk '/^--- /{part=substr($0, 5); order[++n]=part}
       /ERROR SUMMARY: [0-9]+ errors?$/{summ[part]=$0; sub(/^=* */, "", summ[part])}
       /^========= Program hit /{k=$0; sub(/^=* Program hit /, "", k); sub(/ due to.*/, "", k);
                                 k="API error " k; cnt[part SUBSEP k]++; if (!((part SUBSEP k) in seen)) {
                                 seen[part SUBSEP k]=1; keys[part]=keys[part] "\n" k }}
       /^rc [0-9]+$/{rc[part]=$2}
       /^========= [A-Z][a-z].*(read|write|hazard|Race|Barrier|error)/{kind=$0; sub(/^=* */, "", kind)}
       /^=========     at /{k=$0; sub(/^=*     at /, "", k); sub(/\+0x.*/, "", k); sub(/\(.*$/, "", k);
                          cnt[part SUBSEP kind " in " k]++; if (!((part SUBSEP kind " in " k) in seen)) {
                          seen[part SUBSEP kind " in " k]=1; keys[part]=keys[part] "\n" kind " in " k }}
       END { for (i = 1; i <= n; i++) { p = order[i]; printf "%s: %s, rc %s\n", p, summ[p] ? summ[p] : "no summary", rc[p];
               m = split(keys[p], ks, "\n"); for (j = 2; j <= m; j++) printf "    %d printed: %s\n", cnt[p SUBSEP ks[j]], ks[j] } }' "$1"
}

stage_large() {
  run_stage large_nf4 300 "$build/perf/bench_nf4 2048 20 | tee $OUT/bench_nf4.txt"
  run_stage large_70b 900 "bash $root/perf/large_step.sh $mgrl $OUT"
}

stages=()
for a in "$@"; do
  case $a in
    first) stages+=(info ctest_quick train05 train_concat grpo gen gen_pdl sampler train15); GPU_DEADLINE=${GPU_DEADLINE:-540} ;;
    second) stages+=(ncu_decode initcheck racecheck ncu_train train15); GPU_DEADLINE=${GPU_DEADLINE:-540} ;;
    *) stages+=("$a") ;;
  esac
done
[ ${#stages[@]} -eq 0 ] && stages=(info ctest sanitize_runs sanitize attention norm train_ab train gen gen_sync gen_merge gen_fused sampler grpo grpo15 scaling ncu)
for s in "${stages[@]}"; do
  declare -F "stage_$s" >/dev/null || { echo "gpu_program.sh: no stage '$s' (see the list at the top of $0)" >&2; exit 2; }
done
: > "$OUT/summary.txt"
note "gpu_program: $(date -u +%FT%TZ), git $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), stages: ${stages[*]}${GPU_DEADLINE:+, deadline ${GPU_DEADLINE} s}"
for s in "${stages[@]}"; do "stage_$s"; done
note "gpu_program: done after $((SECONDS - t_start)) s"
pack
echo "=== summary ==="; cat "$OUT/summary.txt"
# The tables last, where the device tool's reply (the output's last 12,000 characters) shows them.
for f in train_concat_off.md train_concat_on.md gen_pdl_off.md gen_pdl_pdl.md gen_pdl_fold.md gen_pdl_all.md ncu_decode_b1.md ncu_decode_b64.md initcheck.md racecheck.md train.md train_ab_on.md train_ab_no_fused_head.md train_ab_no_lora_groups.md train_ab_no_cublaslt_bias.md train_ab_no_fused_norm.md gen.md gen_sync1.md gen_sync8.md gen_sync8_no_fused_norm.md gen_merge_off.md gen_merge_on.md merge_mismatch.md gen_fused_on.md gen_fused_off.md grpo.md grpo_ab_on.md grpo_ab_no_scored_rows.md grpo15.md scaling.md; do [ -f "$OUT/$f" ] && { echo "=== $f ==="; cat "$OUT/$f"; }; done
exit "${setup_failed:-0}"  # 1 when a stage could not start (its build missing); a stage that ran and failed: 0
