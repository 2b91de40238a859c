#!/usr/bin/env bash
# large_step.sh: issue 23's target run on one GPU: a Llama-3.1-70B-shaped QLoRA SFT step (model.shape with random
# weights, NF4 double-quantized, LoRA r16 on all projections, batch 1 x 2048, recompute) at each layer count of
# $LARGE_LAYERS (default "8 80"), with `mgrl plan`'s prediction beside the peak GPU memory nvidia-smi saw (every
# 0.2 s) and the step time; a markdown table to OUT_DIR/large.md. Run by perf/gpu_program.sh's stage `large`.
# usage: large_step.sh MGRL OUT_DIR
set -uo pipefail
mgrl=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/large.XXXX)
# 16 examples of 2200 characters (the quickstart's character tokenizer): every sequence is cut at 2048 tokens.
awk 'BEGIN { srand(3); for (i = 0; i < 16; i++) { p = ""; c = "";
       for (j = 0; j < 1100; j++) { p = p int(rand() * 10); c = c int(rand() * 10) }
       printf "{\"prompt\": \"%s=\", \"completion\": \"%s\"}\n", p, c } }' > "$work/data.jsonl"
{
  echo "| layers | plan GiB | measured peak GiB (nvidia-smi) | plan - measured | last step s | tokens/s (last step) |"
  echo "|---|---|---|---|---|---|"
} > "$out/large.md"
worst=0
for L in ${LARGE_LAYERS:-8 80}; do
  args=(--runtime.backend=cuda --model.shape=llama-3.1-70b --model.num_layers="$L" --model.init=random
        --model.quantize=nf4 --model.quantize_double=true --model.recompute=true
        --model.tokenizer="$root/inputs/quickstart" --data.input="$work/data.jsonl" --train.batch_size=1
        --train.max_seq_len=2048 --lora.r=16 --lora.alpha=32 --checkpoint.dir= --log.dir="$work/log_$L")
  "$mgrl" plan "${args[@]}" --plan.gpu_memory=80GiB | tee "$out/large_plan_$L.txt"
  plan=$("$mgrl" plan "${args[@]}" --plan.gpu_memory=80GiB --json | grep -o '"total_bytes":[0-9.e+]*' | cut -d: -f2)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$work/mem_$L.txt" &
  smi=$!
  /usr/bin/time -v "$mgrl" sft "${args[@]}" --train.max_steps=4 > "$out/large_run_$L.log" 2>&1
  rc=$?
  kill "$smi" 2> /dev/null; wait "$smi" 2> /dev/null
  tail -n 25 "$out/large_run_$L.log"
  peak=$(sort -n "$work/mem_$L.txt" | tail -1)
  # The last step's own rate (its step record; the phases record's step_seconds is the sum over the whole run).
  tps=$(grep '"loss"' "$work/log_$L/metrics.jsonl" 2> /dev/null | tail -1 | grep -o '"tokens_per_second":[0-9.e+-]*' |
        cut -d: -f2)
  awk -v L="$L" -v p="${plan:-0}" -v m="${peak:-0}" -v t="${tps:-0}" -v rc="$rc" 'BEGIN {
    pg = p / 1073741824; mg = m / 1024;
    printf "| %d%s | %.2f | %.2f | %s | %s | %s |\n", L, (rc ? " (exit " rc ")" : ""), pg, mg,
           (mg > 0 ? sprintf("%+.1f%%", 100 * (pg - mg) / mg) : "-"), (t > 0 ? sprintf("%.3f", 2048 / t) : "-"),
           (t > 0 ? sprintf("%.0f", t) : "-") }' >> "$out/large.md"
  [ "$rc" -gt "$worst" ] && worst=$rc
done
cat "$out/large.md"
exit "$worst"  # a run that failed (out of memory) fails the stage
