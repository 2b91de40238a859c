#!/usr/bin/env bash
# gpu_dpo_sync.sh WORK CHECK -- MGRL DPO_ARGS...: TR-DPO (dpo.sync_ref_model) on the CUDA backend, full fine-tuning
# (bf16 weights with their fp32 master copy; the reference a copy of the master weights, mixed after steps 2 and 4):
# 4 steps finish with a finite loss each; stopped at step 3 and resumed, the run ends on the straight run's weights
# and reference (1e-6: the GPU's reductions). Exit 77 (skipped) without a GPU.
set -uo pipefail
work=$1 check=$2
shift 2
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work" || exit 1
args=("$@" --runtime.backend=cuda --train.full_finetune=true --train.max_steps=4 --dpo.sync_ref_model=true
      --dpo.ref_model_sync_steps=2 --checkpoint.every_steps=1)
"${args[@]}" --checkpoint.dir="$work/a" --log.dir="$work/a" > "$work/a.log" 2>&1
rc=$?
if [ $rc = 2 ] && ! nvidia-smi -L > /dev/null 2>&1; then exit 77; fi
cat "$work/a.log"
[ $rc = 0 ] || exit $rc
"$check" field "$work/a/metrics.jsonl" loss | awk '{ if (NF != 6) exit 1; for (i = 3; i <= NF; ++i) if (!($i > 0 && $i < 100)) exit 1 }' ||
  { echo "FAIL: losses $("$check" field "$work/a/metrics.jsonl" loss)"; exit 1; }
"${args[@]}" --checkpoint.dir="$work/b" --log.dir="$work/b" --train.stop_at_step=3 > "$work/b.log" 2>&1 || exit 1
"${args[@]}" --checkpoint.dir="$work/b" --log.dir="$work/b" --checkpoint.resume=auto > "$work/b2.log" 2>&1 || exit 1
grep -q "resumed from .*step_00000003.h5" "$work/b2.log" || { echo "FAIL: not resumed"; exit 1; }
"$check" weights "$work/a/step_00000004.h5" "$work/b/step_00000004.h5" --rtol=1e-6 | tee "$work/cmp.txt" || exit 1
grep -q "synced reference weights: in both" "$work/cmp.txt" || { echo "FAIL: no reference"; exit 1; }
echo "PASS: gpu dpo sync_ref_model"
