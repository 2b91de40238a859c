// generator.h: batched generation with a paged KV cache and continuous batching: prompts are admitted as
// cache slots free up; the G completions of a prompt share one prefill of it (and the cache blocks of that
// prefill: the prompt's memory is held once, each completion owns only the blocks it writes); every step runs
// one decode row per running sequence together with prefill rows of admitted prompts, up to a budget of prompt
// tokens per step (a long prompt is prefilled in chunks over several steps, so it never stalls the running
// decodes); tokens are sampled on the device. Results depend only on the seed, the prompt's index
// and the completion's index, never on batching or rank count (up to floating-point reassociation).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "kernels/ops.h"
#include "model/transformer.h"

namespace mgrl::dist {
class MpiEnv;
}

namespace mgrl::rl {

// The ids that end a completion: the model's eos_token_id (config.json and generation_config.json, io::ModelConfig)
// and the tokenizer's EOS (tok may be null), each once, the model's first. mgrl generate, GRPO, PPO and the greedy
// held-out accuracies all stop at these (until 2026-11-28 GRPO, PPO and the accuracies at the tokenizer's alone, as
// trl does: a chat model whose turns end in a token only the model's files name ran to its length there).
std::vector<std::int32_t> stop_ids(const io::ModelConfig& mc, const io::Tokenizer* tok);

struct GenerationOptions {
  int max_new_tokens = 256;
  int num_generations = 1;  // G completions per prompt
  kernels::Ops::Sampling sampling;
  // Repetition penalty (transformers' / vLLM's repetition_penalty; 1: none): before the sampling filters, the logit of
  // every token already in the sequence (its prompt and its completion so far) is divided by it when positive and
  // multiplied by it otherwise. The recorded log-probs stay the model's (Ops::token_logprobs of the raw logits).
  float repetition_penalty = 1.0f;
  std::uint64_t seed = 0;
  std::vector<std::int32_t> eos_ids;      // any of them ends a completion ("eos"); it is kept in the tokens
  std::vector<std::string> stop_strings;  // text that ends a completion ("stop"); cut from the text
  int max_sequences = 64;                 // sequences in flight (cache slots)
  int max_prefill_tokens = 2048;          // prompt tokens prefilled per step (longer prompts: in chunks)
  int kv_block_size = 16;                 // positions per KV-cache block
  bool use_lora = true;
  // generate.merge_lora: with use_lora, sample from the adapter merged into the base weights
  // (model::InferenceEngine::merge_lora, refreshed at the start of every generate() call, undone at its end): Off;
  // IfMemory ("auto" on a GPU: sample unmerged, after one warning, when the merged copy cannot be allocated); On
  // (failing to allocate it is an error).
  enum class Merge { Off, IfMemory, On };
  Merge merge_lora = Merge::Off;
  // Decode steps run back to back on the device, with no host round trip, while no prompt can be admitted: the
  // sampled tokens feed the next step there, EOS and length end sequences there, and the tokens come back once per
  // sync_interval steps (the host then applies stop strings, frees slots and admits prompts). 1: a round trip per
  // step (also what runs with lockstep). Results do not depend on it.
  int sync_interval = 8;
  // A model with a sharded base (model.shard_base) gathers its layers collectively in every model step, so every
  // rank must run as many steps. Set, lockstep(this rank has work) is called before each step on every rank and
  // returns whether any rank has work; a rank without runs a one-token step whose result it drops.
  std::function<bool(bool)> lockstep;
};

// The KV cache and scheduling settings of the generate.* keys as the training modes that sample pass them on
// (GRPO, PPO, distill): generate.max_sequences, max_prefill_tokens, kv_block_size, sync_interval and merge_lora
// (resolved: app's merge_lora_option).
struct CacheSettings {
  int max_sequences = 64, max_prefill_tokens = 2048, kv_block_size = 16, sync_interval = 8;
  GenerationOptions::Merge merge_lora = GenerationOptions::Merge::Off;
  // Into g; max_sequences at least `at_least` (GRPO: a prompt's G completions in flight together).
  void apply(GenerationOptions& g, int at_least = 1) const {
    g.max_sequences = max_sequences > at_least ? max_sequences : at_least;
    g.max_prefill_tokens = max_prefill_tokens;
    g.kv_block_size = kv_block_size;
    g.sync_interval = sync_interval;
    g.merge_lora = merge_lora;
  }
};

// The lockstep of a sharded base over the ranks of env: whether any rank has work (an allreduce of one number).
std::function<bool(bool)> lockstep_over(const dist::MpiEnv& env);

struct Prompt {
  std::int64_t index;                 // global index: the seed stream of its completions
  std::vector<std::int32_t> tokens;
};

struct Completion {
  std::int64_t prompt_index = 0;
  int generation = 0;  // 0..G-1
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;  // log p(token) under the model (temperature 1), one per token
  std::string text;             // decoded (when a decoder is given), cut at a stop string
  std::string finish_reason;    // "eos", "stop" or "length"
};

struct GenerationStats {
  std::int64_t prompts = 0, prompt_tokens = 0, generated_tokens = 0, steps = 0;
  std::int64_t downloads = 0;      // device-to-host copies of sampled tokens and log-probs (each waits for the device)
  std::int64_t device_steps = 0;   // of the steps, those run back to back on the device (sync_interval > 1)
  int kv_blocks = 0;               // blocks in the KV-cache pool
  std::size_t kv_cache_bytes = 0;  // its memory (keys and values of every layer)
  bool merged_lora = false;        // the last generate() sampled from merged weights (merge_lora)
  double seconds = 0;
};

class Generator {
 public:
  // decode: token ids -> text (for stop strings and Completion::text); may be empty when there are no
  // stop strings and no text is wanted.
  Generator(model::Transformer& model, GenerationOptions opts,
            std::function<std::string(const std::vector<std::int32_t>&)> decode = {});
  // Completions in (prompt order, generation) order.
  std::vector<Completion> generate(const std::vector<Prompt>& prompts);
  const GenerationStats& stats() const { return stats_; }

  // The paged KV cache a generation sizes for `prompts` prompts of up to `longest` tokens: max_sequences slots (at
  // least G, at most every completion), every slot busy, at most slots / G prompts in flight, each with its full
  // prompt blocks once and, per completion, the blocks from the prompt's partly filled last block on. `mgrl plan`
  // counts the same.
  struct KvPool {
    int slots = 0, block_size = 0, blocks = 0, max_len = 0;
  };
  static KvPool kv_pool(int max_sequences, int G, std::int64_t prompts, int longest, int max_new_tokens,
                        int kv_block_size);

  // The seed of one sampling draw (exposed for tests), from its completion's stream (the on-device decode advances
  // the stream itself).
  static std::uint64_t draw_seed(std::uint64_t seed, std::int64_t prompt_index, int generation, int step);
  static std::uint64_t draw_stream(std::uint64_t seed, std::int64_t prompt_index, int generation);

 private:
  model::Transformer& model_;
  GenerationOptions opts_;
  std::function<std::string(const std::vector<std::int32_t>&)> decode_;
  GenerationStats stats_;
};

}  // namespace mgrl::rl
