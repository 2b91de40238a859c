// mode_generate.cpp: `mgrl generate`: completions of JSONL prompts, prompts sharded over ranks,
// one output line per completion written by rank 0 in input order.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include "app/modes.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/device.h"
#include "dist/mpi_env.h"
#include "io/atomic_file.h"
#include "io/chat_template.h"
#include "io/config.h"
#include "io/hf_config.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "rl/generator.h"
#include "train/comm_gatherer.h"

namespace mgrl::app {
namespace {

struct Input {
  nlohmann::json prompt;  // as given: text, messages or token ids (echoed in the output)
  std::vector<std::int32_t> tokens;
};

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// The generate.* sampling keys that were not given take generation_config.json's values, as transformers' generate
// reads them when it is given none: do_sample false or absent is greedy (temperature 0); sampling takes the file's
// temperature (absent: 1), top_k (absent: transformers' 50), top_p and min_p; repetition_penalty applies either way.
// A given key wins. Returns the line that says what was taken ("" when nothing was: no file, or every key given).
std::string apply_generation_config(const io::Config& cfg, const std::string& model_dir, rl::GenerationOptions& o) {
  const auto file = io::read_generation_defaults(model_dir);
  if (!file) return "";
  const auto given = [&cfg](const char* key) { return cfg.origin(key).kind != io::Origin::Default; };
  const bool any_sampling_key = given("generate.temperature") || given("generate.top_k") || given("generate.top_p") ||
                                given("generate.min_p");
  // A sampling key given asks for sampling (transformers would warn and stay greedy under do_sample false).
  const bool sample = file->do_sample.value_or(false) || (any_sampling_key && !given("generate.temperature"));
  std::vector<std::string> taken;
  char v[64];
  const auto take_f = [&](const char* key, const char* name, float& field, double value) {
    if (given(key)) return;
    field = static_cast<float>(value);
    std::snprintf(v, sizeof v, "%s %g", name, value);
    taken.emplace_back(v);
  };
  if (!given("generate.temperature")) {
    if (sample) {
      take_f("generate.temperature", "temperature", o.sampling.temperature, file->temperature.value_or(1.0));
    } else {
      o.sampling.temperature = 0;
      taken.emplace_back(file->do_sample ? "greedy (do_sample false)" : "greedy (no do_sample)");
    }
  }
  if (o.sampling.temperature > 0) {
    if (!given("generate.top_k")) {
      o.sampling.top_k = static_cast<int>(file->top_k.value_or(50));
      taken.push_back("top_k " + std::to_string(o.sampling.top_k) + (file->top_k ? "" : " (transformers' default)"));
    }
    if (file->top_p) take_f("generate.top_p", "top_p", o.sampling.top_p, *file->top_p);
    if (file->min_p) take_f("generate.min_p", "min_p", o.sampling.min_p, *file->min_p);
  }
  if (file->repetition_penalty)
    take_f("generate.repetition_penalty", "repetition_penalty", o.repetition_penalty, *file->repetition_penalty);
  if (taken.empty()) return "";
  std::string line = "generate: sampling as " + model_dir + "/generation_config.json sets it (generate.* keys not given):";
  for (std::size_t i = 0; i < taken.size(); ++i) line += (i ? ", " : " ") + taken[i];
  return line + " (generate.use_generation_config = false: mgrl's defaults)";
}

}  // namespace

int run_generate(Context& ctx) {
  const auto& env = ctx.env;
  const auto& cfg = ctx.cfg;
  const std::string model_dir = cfg.get_string("model.path");
  std::string tok_dir;
  const std::string adapter = cfg.get_string("lora.adapter");
  const std::string input = cfg.get_string("data.input");
  const std::string output = cfg.get_string("generate.output");

  rl::GenerationOptions opts;
  opts.max_new_tokens = static_cast<int>(cfg.get_int("generate.max_new_tokens"));
  opts.num_generations = static_cast<int>(cfg.get_int("generate.num_generations"));
  opts.sampling.temperature = static_cast<float>(cfg.get_float("generate.temperature"));
  opts.sampling.top_k = static_cast<int>(cfg.get_int("generate.top_k"));
  opts.sampling.top_p = static_cast<float>(cfg.get_float("generate.top_p"));
  opts.sampling.min_p = static_cast<float>(cfg.get_float("generate.min_p"));
  opts.repetition_penalty = static_cast<float>(cfg.get_float("generate.repetition_penalty"));
  opts.seed = static_cast<std::uint64_t>(cfg.get_int("generate.seed"));
  opts.stop_strings = cfg.get_strings("generate.stop");
  opts.max_sequences = static_cast<int>(cfg.get_int("generate.max_sequences"));
  opts.max_prefill_tokens = static_cast<int>(cfg.get_int("generate.max_prefill_tokens"));
  opts.sync_interval = static_cast<int>(cfg.get_int("generate.sync_interval"));
  opts.kv_block_size = static_cast<int>(cfg.get_int("generate.kv_block_size"));
  opts.use_lora = !adapter.empty();

  io::ModelConfig mc;
  std::optional<io::Tokenizer> tok;
  std::vector<Input> inputs;
  std::string sampling_from_model;
  env.agree([&] {
    check_inference_keys(cfg, "generate");
    tok_dir = tokenizer_dir(cfg);
    mc = io::parse_hf_config(model_dir + "/config.json");
    check_model_fits(ctx, mc, model_dir + "/config.json", false);
    if (cfg.get_bool("generate.use_generation_config")) sampling_from_model = apply_generation_config(cfg, model_dir, opts);
    if (opts.use_lora) opts.merge_lora = merge_lora_option(cfg, mc, ctx.device.backend == dist::Backend::Cuda);
    if (file_exists(tok_dir + "/tokenizer.json")) tok = io::Tokenizer::from_dir(tok_dir);
    std::optional<io::ChatTemplate> chat;
    if (tok) chat.emplace(chat_template(cfg, "generate.chat_format", *tok));
    auto need_tokenizer = [&](int line, const char* what) {
      if (!tok)
        io::jsonl_error(input, line, std::string(what) + " input needs a tokenizer, but " + tok_dir +
                                         " has no tokenizer.json (set model.tokenizer)");
    };
    io::read_jsonl(input, [&](const nlohmann::ordered_json& j, int line) {
      Input in;
      if (j.contains("messages")) {
        need_tokenizer(line, "\"messages\"");
        in.prompt = j["messages"];
        try {
          io::ChatTemplate::check_messages(j["messages"]);
          in.tokens = chat->encode(j["messages"], true, io::ChatExtras::of(j));
        } catch (const UserError& e) {
          io::jsonl_error(input, line, e.what());
        }
      } else if (j.contains("prompt")) {
        need_tokenizer(line, "\"prompt\"");
        if (!j["prompt"].is_string()) io::jsonl_error(input, line, "\"prompt\" must be a string");
        in.prompt = j["prompt"];
        in.tokens = tok->encode(j["prompt"].get<std::string>());
      } else if (j.contains("prompt_tokens")) {
        in.prompt = j["prompt_tokens"];
        if (!j["prompt_tokens"].is_array()) io::jsonl_error(input, line, "\"prompt_tokens\" must be an array of token ids");
        for (const auto& t : j["prompt_tokens"]) in.tokens.push_back(token_id(t, mc.vocab_size, input, line));
      } else {
        io::jsonl_error(input, line, "expected \"prompt\", \"messages\" or \"prompt_tokens\"");
      }
      if (in.tokens.empty()) io::jsonl_error(input, line, "the prompt has no tokens");
      for (auto id : in.tokens)
        if (id < 0 || id >= mc.vocab_size)
          io::jsonl_error(input, line, "token " + std::to_string(id) + " is outside the model's vocabulary");
      if (mc.max_position_embeddings > 0 &&
          static_cast<std::int64_t>(in.tokens.size()) + opts.max_new_tokens > mc.max_position_embeddings)
        io::jsonl_error(input, line, "prompt (" + std::to_string(in.tokens.size()) + " tokens) + " +
                                         "generate.max_new_tokens exceeds the model's max_position_embeddings (" +
                                         std::to_string(mc.max_position_embeddings) + ")");
      inputs.push_back(std::move(in));
    });
    if (inputs.empty()) throw UserError(input + ": no prompts");
    if (!opts.stop_strings.empty() && !tok) throw UserError("generate.stop needs a tokenizer (set model.tokenizer)");
    for (const auto& s : opts.stop_strings)
      if (s.empty()) throw UserError("key 'generate.stop': an empty stop string would end every completion at once");
    // The KV cache holds every sequence in flight: all G completions of a prompt at once (they share its prefix).
    {
      std::size_t longest = 0;
      for (const auto& in : inputs) longest = std::max(longest, in.tokens.size());
      const double per_rank = std::ceil(static_cast<double>(inputs.size()) / env.size());
      const double in_flight = std::min(std::max<double>(opts.max_sequences, opts.num_generations),
                                        per_rank * opts.num_generations);
      check_batch_fits(mc, "generate.num_generations", opts.num_generations, in_flight,
                       static_cast<double>(longest) + opts.max_new_tokens,
                       "lower it or generate.max_sequences");
    }
    if (env.rank() == 0) {
      refuse_output_over_inputs("generate.output", output,
                                {{"data.input", input}, {"model.path", model_dir}, {"model.tokenizer", tok_dir},
                                 {"lora.adapter", adapter}});
      io::remove_stale_temporaries_of(output);  // a killed earlier run's
      io::check_output_writable(output);        // fail early when the output cannot be written
    }
  });
  opts.eos_ids = rl::stop_ids(mc, tok ? &*tok : nullptr);
  if (!sampling_from_model.empty() && env.rank() == 0) log::info(sampling_from_model);

  auto ops = make_ops(ctx);
  const model::ModelOptions mo = model_options(cfg, false);
  train::CommGatherer gatherer(ctx.comm, *ops);
  model::Transformer net(mc, *ops, mo, mo.shard_base ? &gatherer : nullptr);
  load_model(ctx, net, model_dir, adapter);
  if (mo.shard_base) opts.lockstep = rl::lockstep_over(env);
  log_merge_lora(opts.merge_lora, net);

  const std::size_t N = inputs.size();
  const auto [lo, hi] = shard(env, N);
  std::vector<rl::Prompt> prompts;
  for (std::size_t i = lo; i < hi; ++i) prompts.push_back({static_cast<std::int64_t>(i), inputs[i].tokens});
  std::function<std::string(const std::vector<std::int32_t>&)> decode;
  if (tok) decode = [&](const std::vector<std::int32_t>& ids) { return tok->decode(ids, true); };
  rl::Generator gen(net, opts, decode);
  say_unused_keys(ctx);  // the configuration is read: what it did not read changes nothing
  const auto completions = gen.generate(prompts);

  std::string lines;
  for (const auto& c : completions) {
    nlohmann::json j = {{"index", c.prompt_index},
                        {"generation", c.generation},
                        {"prompt", inputs[static_cast<std::size_t>(c.prompt_index)].prompt},
                        {"completion", c.text},
                        {"completion_tokens", c.tokens},
                        {"logprobs", c.logprobs},
                        {"finish_reason", c.finish_reason}};
    lines += j.dump() + "\n";
  }
  const auto& st = gen.stats();
  char mine[256];
  std::snprintf(mine, sizeof(mine), "  rank %d: %lld prompts, %lld prompt tokens, %lld generated tokens in %.2f s (%.0f tokens/s)",
                env.rank(), static_cast<long long>(st.prompts), static_cast<long long>(st.prompt_tokens),
                static_cast<long long>(st.generated_tokens), st.seconds,
                st.seconds > 0 ? static_cast<double>(st.generated_tokens) / st.seconds : 0.0);
  const auto parts = env.gather_to_root(lines);
  const auto per_rank = env.gather_to_root(mine);
  const long long total = env.allreduce_sum(static_cast<long long>(st.generated_tokens));
  const double slowest = env.allreduce_max(st.seconds);
  if (env.rank() != 0) return 0;

  std::string all;
  for (const auto& p : parts) all += p;
  io::write_file_atomically(output, all);  // under a temporary name, fsync'ed, renamed: whole or not at all
  char line[256];
  std::snprintf(line, sizeof(line), "generate: %zu prompts x %d, %lld tokens in %.2f s on %d rank%s: %.0f tokens/s in total; wrote %s",
                N, opts.num_generations, total, slowest, env.size(), env.size() == 1 ? "" : "s",
                slowest > 0 ? static_cast<double>(total) / slowest : 0.0, output.c_str());
  log::info(line);
  for (const auto& r : per_rank) log::info(r);
  return 0;
}

}  // namespace mgrl::app
