#!/usr/bin/env bash
# distill_teacher_beyond_memory.sh WORK -- MGRL ARGS...: a teacher whose weights do not fit beside the student is
# refused before anything loads, in one line naming its config.json (exit 2). Its config.json (no weights: nothing is
# read) describes a Llama-8B-wide model with as many layers as make it about 1.5 bytes a parameter of this machine's
# memory: it passes the config's own check (NF4 projections), and as stored (f32 on the CPU backend) it is 2.7 times
# the memory.
set -uo pipefail
work=$1
shift
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work" || exit 1
layers=$(awk '/^MemTotal:/ { print int($2 * 1024 / (1.5 * 218103808)) + 1 }' /proc/meminfo)
cat > "$work/config.json" <<JSON
{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 173, "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": $layers, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "bos_token_id": 1,
 "eos_token_id": 2}
JSON
exec "$@" --distill.teacher="$work"
