#!/usr/bin/env bash
# gpu_program.sh: the whole GPU programme of issue 19 in one call on a GPU machine, every log under $OUT.
#
# Here:   MGRL_CUDA_ARCHS=90 MGRL_BUILD_DIR=build-gpu bash scripts/build.sh
#         bash ../shared/hooks/device-bundle.sh build-gpu
# There:  source .device/env.sh && bash perf/gpu_program.sh [STAGE ...]       (carry [".device"], and ".whl" for trl:
#         bash perf/fetch_trl_wheels.sh here first)
#
# Stages (default: all, in this order): info ctest sanitize_runs sanitize attention train gen grpo grpo15 scaling ncu
#   info       nvidia-smi, mgrl info on the CUDA backend, the measured copy bandwidth
#   ctest      ctest -L gpu, then tests/test_ops_cuda and test_model_cuda verbosely (each comparison's error)
#   sanitize   compute-sanitizer memcheck, racecheck, synccheck, initcheck over the gpu tests ($SANITIZE_TESTS,
#              default test_model_cuda test_ops_cuda; tools: $SANITIZE_TOOLS)
#   sanitize_runs  the same tools over 2 steps each of SFT and GRPO (the Qwen2 test fixture, CUDA backend)
#   attention  perf/bench_attention (tiled vs naive) and perf/bench_attention_torch.py (torch sdpa flash)
#   attention_sm70  (not in the default list) perf/bench_attention with MGRL_CUDA_ATTENTION=sm70: the Volta wmma
#              kernels against the mma.sync ones on this GPU, every shape in fp16
#   train      perf/train_vs_hf.py at the Qwen2.5 0.5B, 1.5B (batch 8 x 1024) and 7B (4 x 1024) shapes
#   train05, train15, train7   the same at one shape
#   gen        perf/gen_vs_hf.py at the 0.5B shape, batch 1, 8, 64, 256
#   grpo       perf/grpo_vs_trl.py at the 0.5B shape (needs the trl wheels carried in .whl)
#   grpo15     a 1.5B-shaped GRPO run of 50 steps (mgrl only), its phase table
#   scaling    perf/scaling at 1 rank on the CUDA backend
#   ncu        ncu per-kernel summaries: one SFT step at 0.5B (batch 8 x 1024), 16 decode steps at batch 1 and 64
# Each stage has a time budget (GPU_STAGE_TIMEOUT_<stage> seconds overrides it). Logs go to $OUT/logs.tgz, re-packed
# after every stage (so a call cut short still returns what ran), and a one-line-per-stage $OUT/summary.txt.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/gpu_out}
mkdir -p "$OUT"
logs=$(mktemp -d /tmp/gpu_logs.XXXX)
build=${MGRL_BUILD_DIR:-$root/build-gpu}
mgrl=$build/mgrl
models=$root/tests/data/models
export PYTHONUNBUFFERED=1

pack() { tar -czf "$OUT/logs.tgz" -C "$logs" . 2>/dev/null; }
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
# run_stage NAME DEFAULT_SECONDS COMMAND...: runs the command under a time limit, log in $logs/NAME.log.
run_stage() {
  local name=$1 secs=$2; shift 2
  local var="GPU_STAGE_TIMEOUT_$name"; secs=${!var:-$secs}
  local t0=$SECONDS
  echo "=== $name (limit ${secs} s) ==="
  timeout --kill-after=10 "$secs" bash -c "$*" > "$logs/$name.log" 2>&1
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
stage_sanitize_runs() {
  local t
  for t in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
    run_stage "sanrun_$t" 600 "rm -rf /tmp/gp_sft /tmp/gp_grpo; echo '--- sft 2 steps'; \
      compute-sanitizer --tool $t --error-exitcode 99 --print-limit 20 $SFT_SMALL; echo \"rc \$?\"; \
      echo '--- grpo 2 steps'; compute-sanitizer --tool $t --error-exitcode 99 --print-limit 20 $GRPO_SMALL; echo \"rc \$?\""
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
stage_attention_sm70() {
  run_stage attention_sm70 300 "MGRL_CUDA_ATTENTION=sm70 $build/perf/bench_attention 20"
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
stage_gen() {
  run_stage gen 900 "python3 $root/perf/gen_vs_hf.py --mgrl $mgrl --shape qwen2.5-0.5b --batches ${GEN_BATCHES:-1,8,64,256} \
    --prompt-len 128 --new-tokens 256 --repeats ${GEN_REPEATS:-3} --out $OUT/gen.md"
}
stage_grpo() {
  run_stage grpo 900 "if [ -d $root/.whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site $root/.whl/*.whl && export PYTHONPATH=/tmp/site; fi; \
    python3 $root/perf/grpo_vs_trl.py --mgrl $mgrl --shape qwen2.5-0.5b --prompts 16 --G 8 --prompt-len 128 \
    --completion-len 256 --steps ${GRPO_STEPS:-5} --out $OUT/grpo.md"
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
stage_ncu() {
  # One SFT step of the 0.5B shape (the model written by train_vs_hf's maker): every kernel of the run, each timed
  # alone by ncu (the model load's few conversion kernels included).
  run_stage ncu_train 600 "python3 -c \"
import sys; sys.path.insert(0, '$root/perf'); import train_vs_hf as t
t.make_model('/tmp/ncu_model', 'qwen2.5-0.5b', 'cuda'); t.make_data('/tmp/ncu_train.jsonl', 64, 1024)\" && \
    ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      $mgrl sft --runtime.backend=cuda --model.path=/tmp/ncu_model \
      --data.input=/tmp/ncu_train.jsonl --train.batch_size=8 --train.max_seq_len=1024 --lora.r=16 --lora.alpha=32 \
      --train.max_steps=1 --log.dir=/tmp/ncu_log --checkpoint.dir=/tmp/ncu_log/ck --checkpoint.resume=none"
  # 16 decode steps after the prefill, at batch 1 and 64 (128-token prompts, greedy).
  run_stage ncu_decode 600 "python3 -c \"
import json, random; r = random.Random(0)
with open('/tmp/ncu_prompts.jsonl', 'w') as f:
    for i in range(64): f.write(json.dumps({'prompt_tokens': [r.randrange(10, 60) for _ in range(128)]}) + chr(10))\" && \
    for b in 1 64; do head -n \$b /tmp/ncu_prompts.jsonl > /tmp/ncu_p\$b.jsonl; \
      ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
        $mgrl generate --runtime.backend=cuda --model.path=/tmp/ncu_model \
        --data.input=/tmp/ncu_p\$b.jsonl --generate.output=/tmp/ncu_gen\$b.jsonl --generate.max_new_tokens=17 \
        --generate.temperature=0 --generate.max_sequences=64; done"
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(info ctest sanitize_runs sanitize attention train gen grpo grpo15 scaling ncu)
: > "$OUT/summary.txt"
note "gpu_program: $(date -u +%FT%TZ), git $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), stages: ${stages[*]}"
for s in "${stages[@]}"; do "stage_$s"; done
pack
echo "=== summary ==="; cat "$OUT/summary.txt"
for f in train.md gen.md grpo.md grpo15.md scaling.md; do [ -f "$OUT/$f" ] && { echo "=== $f ==="; cat "$OUT/$f"; }; done
exit 0
