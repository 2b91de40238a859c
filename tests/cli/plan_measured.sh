#!/usr/bin/env bash
# plan_measured.sh: `mgrl plan --plan.target=cpu` against the measured peak host memory (the largest process's
# max RSS, tests/cli/peak_rss) of the same run on the CPU backend, one rank (*_np2: two ranks, planned with
# --gpus 2), one thread: within 10% or the test fails.
# usage: plan_measured.sh MGRL PEAK_RSS SOURCE_DIR CASE    (CASE: sft, sft_recompute, grpo, shape_load, qlora,
#        qlora_shard_np2, sft_files, distill, distill_shard_np2,
#        distill_teacher_nf4; the *_np2 cases launch with $MPIRUN 2 $MPIFLAGS, e.g.
#        MPIRUN="mpiexec -n")
set -eu
mgrl=$1 peak_rss=$2 src=$3 case=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# Data of fixed lengths for the quickstart's character tokenizer: SFT examples longer than train.max_seq_len (cut to
# exactly 64 tokens), GRPO prompts of exactly 13 tokens (BOS + "ddddd+ddddd=").
awk 'BEGIN { srand(1); for (i = 0; i < 64; i++) { p = ""; c = "";
       for (j = 0; j < 40; j++) { p = p int(rand() * 10); c = c int(rand() * 10) }
       printf "{\"prompt\": \"%s=\", \"completion\": \"%s\"}\n", p, c } }' > sft.jsonl
awk 'BEGIN { srand(2); for (i = 0; i < 64; i++) { a = 10000 + int(rand() * 90000); b = 10000 + int(rand() * 90000);
       printf "{\"prompt\": \"%d+%d=\", \"answer\": \"%d\"}\n", a, b, a + b } }' > grpo.jsonl
# A tokenizer without an EOS token, and a model config without one (a completion ends at either since 2026-11-28):
# every GRPO completion runs to grpo.max_completion_length (the plan's worst case).
mkdir m_noeos
sed 's/"eos_token_id": *[0-9]*/"eos_token_id": null/' "$src/tests/data/plan/llama_50m/config.json" > m_noeos/config.json
mkdir tok_noeos
cp "$src/inputs/quickstart/tokenizer.json" tok_noeos/
echo '{"bos_token": "<bos>", "pad_token": "<pad>", "unk_token": "<unk>"}' > tok_noeos/tokenizer_config.json
cat > grpo.toml <<'TOML'
mode = "grpo"
[grpo]
num_generations = 4
max_prompt_length = 13
max_completion_length = 32
beta = 0.04
[[reward]]
kind = "regex"
pattern = "^[0-4]"
TOML
common=(--runtime.backend=cpu --runtime.threads=1 --model.init=random --checkpoint.dir= --log.dir=runs
        --train.max_steps=1)
model=(--model.path="$src/tests/data/plan/llama_50m")
ranks=1 launch=()
case $case in
  sft) run=(sft "${common[@]}" "${model[@]}" --model.tokenizer="$src/inputs/quickstart" --data.input=sft.jsonl
            --train.batch_size=8 --train.max_seq_len=64) ;;
  sft_recompute) run=(sft "${common[@]}" "${model[@]}" --model.tokenizer="$src/inputs/quickstart"
                      --data.input=sft.jsonl --train.batch_size=8 --train.max_seq_len=64 --model.recompute=true) ;;
  grpo) run=(grpo grpo.toml "${common[@]}" --model.path=m_noeos --model.tokenizer=tok_noeos --data.input=grpo.jsonl
             --train.batch_size=2) ;;
  # A built-in shape (Qwen2.5-0.5B's 152k vocabulary, one layer): the peak is while the weights are drawn (the
  # embeddings' f32 staging beside the weights), which the plan says.
  shape_load) run=(sft "${common[@]}" --model.shape=qwen2.5-0.5b --model.num_layers=1
                   --model.tokenizer="$src/inputs/quickstart" --data.input=sft.jsonl --train.batch_size=2
                   --train.max_seq_len=64) ;;
  # QLoRA: the projections quantized to NF4 at load (double-quantized absmax), one layer dequantized at a time; on
  # two ranks with the base sharded (each rank stores half of every layer's NF4 bytes, gathers two layers' worth).
  qlora) run=(sft "${common[@]}" "${model[@]}" --model.tokenizer="$src/inputs/quickstart" --data.input=sft.jsonl
              --train.batch_size=8 --train.max_seq_len=64 --model.quantize=nf4 --model.quantize_double=true) ;;
  qlora_shard_np2) ranks=2
    # shellcheck disable=SC2206  # MPIRUN and MPIFLAGS are words
    launch=(${MPIRUN:?MPIRUN names the MPI launcher and its rank-count flag} 2 ${MPIFLAGS:-})
    run=(sft "${common[@]}" "${model[@]}" --model.tokenizer="$src/inputs/quickstart" --data.input=sft.jsonl
         --train.batch_size=8 --train.max_seq_len=64 --model.quantize=nf4 --model.quantize_double=true
         --model.shard_base=true) ;;
  # A model read from its files (half llama_50m's layers, 25M parameters, written here by mgrl itself: a random-init
  # full fine-tuning step at lr 0, exported): each tensor's mapped pages leave the process once copied, so that the
  # load holds one tensor of the file beside the weights (until 2026-11-29 the whole file: 19% above the plan).
  # Distillation: that model as the teacher beside a student of 2 such layers (the teacher the larger), its pass to
  # the LM head's input over the micro-batch, both models' logits chunks; on two ranks both sharded
  # (model.shard_base); the teacher quantized to NF4 at load (distill.teacher_quantize).
  sft_files|distill|distill_shard_np2|distill_teacher_nf4)
    mkdir t4
    sed 's/"num_hidden_layers": 8/"num_hidden_layers": 4/' "$src/tests/data/plan/llama_50m/config.json" > t4/config.json
    "$mgrl" sft "${common[@]}" --model.path=t4 --model.tokenizer="$src/inputs/quickstart" --data.input=sft.jsonl \
      --train.full_finetune=true --train.batch_size=1 --train.max_seq_len=128 --train.lr=0 --checkpoint.dir=tck \
      > teacher.out 2>&1 || { cat teacher.out; echo "FAIL: the teacher's run"; exit 1; }
    "$mgrl" export --export.checkpoint=tck/step_00000001.h5 --export.output=teacher > teacher.out 2>&1 ||
      { cat teacher.out; echo "FAIL: the teacher's export"; exit 1; }
    [ "$(stat -c %s teacher/model.safetensors)" -gt 100000000 ] || { echo "FAIL: the exported model is not f32"; exit 1; }
    if [ "$case" = sft_files ]; then
      run=(sft --runtime.backend=cpu --runtime.threads=1 --checkpoint.dir= --log.dir=runs --train.max_steps=1
           --model.path=teacher --model.tokenizer="$src/inputs/quickstart" --data.input=sft.jsonl --train.batch_size=2
           --train.max_seq_len=64)
    else
      echo 'mode = "distill"' > distill.toml  # mgrl plan reads the mode from its config file
      run=(distill distill.toml "${common[@]}" --model.path=m_noeos --model.tokenizer=tok_noeos --data.input=grpo.jsonl
           --model.num_layers=2 --distill.teacher=teacher --train.batch_size=2 --distill.max_prompt_length=13
           --distill.max_completion_length=32)
    fi
    [ "$case" = distill_teacher_nf4 ] && run+=(--distill.teacher_quantize=nf4)
    if [ "$case" = distill_shard_np2 ]; then
      ranks=2
      # shellcheck disable=SC2206  # MPIRUN and MPIFLAGS are words
      launch=(${MPIRUN:?MPIRUN names the MPI launcher and its rank-count flag} 2 ${MPIFLAGS:-})
      run+=(--model.shard_base=true --train.batch_size=4)
    fi ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
plan_json=$("$mgrl" plan "${run[@]:1}" --plan.target=cpu --gpus "$ranks" --json)
"$peak_rss" "${launch[@]}" "$mgrl" "${run[@]}" > run.out 2> run.err || { cat run.out run.err; echo "FAIL: the run failed"; exit 1; }
grep -q "^step 1/1 " run.out || { cat run.out run.err; echo "FAIL: no step line"; exit 1; }
measured_kib=$(sed -n 's/^peak_rss_kib \([0-9]*\)$/\1/p' run.err)
plan_bytes=$(echo "$plan_json" | grep -o '"total_bytes":[0-9.e+]*' | cut -d: -f2)
awk -v p="$plan_bytes" -v m="$measured_kib" -v c="$case" 'BEGIN {
  mm = m * 1024; r = (p - mm) / mm;
  printf "%s: plan %.1f MiB, measured peak RSS %.1f MiB, plan - measured = %+.1f%%\n", c, p / 1048576, mm / 1048576, 100 * r;
  exit (r > 0.10 || r < -0.10) ? 1 : 0 }'
