#!/usr/bin/env bash
# distill_teacher_nf4.sh WORK CHECK NF4_DIR MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- MGRL ARGS...: `mgrl distill` from an
# NF4 teacher (the fixtures of tests/data/nf4, written by bitsandbytes: llama_dense (bf16), llama_nf4_plain and
# llama_nf4 (its 4-bit directories, fp32 and double-quantized absmax); the student: llama_dense with LoRA):
# - the bitsandbytes 4-bit directory as the teacher trains what llama_dense quantized at load trains
#   (distill.teacher_quantize = "nf4"), bit for bit, with and without double quantization; the start-up line says
#   the teacher's projections are NF4;
# - the dense teacher trains other weights (the quantization acts);
# - on 2 ranks with model.shard_base (student and NF4 teacher sharded) the same as unsharded, bit for bit;
# - mgrl plan counts the teacher's NF4 bytes and its dequantize workspace.
set -uo pipefail
work=$1 check=$2 nf4=$3
shift 3
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
take_launcher "$@"
set -- "${rest[@]}" --model.path="$nf4/llama_dense"
run bnb 1 "$@" --distill.teacher="$nf4/llama_nf4_plain"
grep -q "^distill: .* from teacher LlamaForCausalLM (2 layers, hidden 64, NF4 projections)" "$work/bnb.log" ||
  fail "the start-up line: $(grep '^distill:' "$work/bnb.log")"
run load 1 "$@" --distill.teacher="$nf4/llama_dense" --distill.teacher_quantize=nf4
"$check" weights "$(ck bnb 4)" "$(ck load 4)" --exact || fail "quantized at load: other weights than the bitsandbytes directory"
echo "NF4 teacher: bitsandbytes' directory = quantized at load"
run bnbdq 1 "$@" --distill.teacher="$nf4/llama_nf4"
run loaddq 1 "$@" --distill.teacher="$nf4/llama_dense" --distill.teacher_quantize=nf4 \
  --distill.teacher_quantize_double=true
"$check" weights "$(ck bnbdq 4)" "$(ck loaddq 4)" --exact || fail "double-quantized at load: other weights"
echo "double-quantized NF4 teacher: bitsandbytes' directory = quantized at load"
run dense 1 "$@" --distill.teacher="$nf4/llama_dense"
"$check" weights "$(ck bnb 4)" "$(ck dense 4)" --rtol=1e-4 > /dev/null && fail "the dense teacher trained the NF4 teacher's weights"
grep -q "hidden 64)," "$work/dense.log" || fail "the dense teacher said NF4: $(grep '^distill:' "$work/dense.log")"
echo "the dense teacher: other weights"
run np2 2 "$@" --distill.teacher="$nf4/llama_nf4_plain"
run np2s 2 "$@" --distill.teacher="$nf4/llama_nf4_plain" --model.shard_base=true
"$check" weights "$(ck np2 4)" "$(ck np2s 4)" --exact || fail "2 ranks: sharded other weights"
grep -q "| teacher [0-9.]* MiB/rank" "$work/np2s.log" || fail "2 ranks: the teacher's memory not said"
echo "2 ranks, NF4 teacher sharded = unsharded"
echo 'mode = "distill"' > "$work/distill.toml"  # mgrl plan reads the mode from its config file
plan=$("$1" plan "$work/distill.toml" "${@:3}" --distill.teacher="$nf4/llama_dense" \
  --distill.teacher_quantize=nf4 --plan.target=cpu) || fail "plan: $plan"
echo "$plan" | grep -E "^  teacher weights .*NF4 projections" && echo "$plan" | grep -E "^  teacher dequantize workspace" ||
  fail "plan: $plan"
echo "PASS: distill NF4 teacher"
