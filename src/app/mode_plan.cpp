// mode_plan.cpp: `mgrl plan`: the memory one rank of a run needs, by part (model::memory_plan), from the model's
// shape alone (config.json or model.shape; no weights read, nothing allocated), whether it fits plan.gpu_memory,
// and the largest training micro-batch that does; a table, or one JSON object with plan.json.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <nlohmann/json.hpp>

#include "app/modes.h"
#include "core/dtype.h"
#include "core/error.h"
#include "dist/device.h"
#include "dist/mpi_env.h"
#include "io/config.h"
#include "model/memory_plan.h"
#include "rl/generator.h"

namespace mgrl::app {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// This process's resident memory now (VmRSS of /proc/self/status), 0 when unknown. `mgrl plan` is the same binary
// as the run it plans, with the same libraries loaded: a build with CUDA maps and touches ~200 MiB of CUDA
// libraries even on the CPU backend, a CPU-only build ~20 MiB, so the CPU process overhead is measured here.
double resident_bytes_now() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) * 1024.0;
  return 0;
}

// "80GiB", "141 GB", "16GiB", "81920MiB", "85899345920": bytes; a UserError naming the key otherwise.
double parse_size(const std::string& text, const std::string& key) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string num = text.substr(0, i);
  std::string unit = text.substr(i);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  double v = 0;
  bool ok = !num.empty() && std::count(num.begin(), num.end(), '.') <= 1 && num != ".";
  if (ok) v = std::stod(num);
  static const std::pair<const char*, double> units[] = {
      {"", 1},         {"B", 1},          {"KB", 1e3},          {"MB", 1e6},          {"GB", 1e9},
      {"TB", 1e12},    {"KiB", 1024.0},   {"MiB", kMiB},        {"GiB", kGiB},        {"TiB", kGiB * 1024.0}};
  double mult = -1;
  for (const auto& [name, m] : units)
    if (unit == name) mult = m;
  if (!ok || mult < 0 || !(v * mult >= 1) || !std::isfinite(v * mult))
    throw UserError("key '" + key + "' = \"" + text +
                    "\" is not a memory size (a positive number with a unit: 80GiB, 141GB, 16384MiB, or bytes)");
  return v * mult;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / kGiB);
  return buf;
}

}  // namespace

int run_plan(dist::MpiEnv& env, const io::Config& cfg) {
  model::PlanInput in;
  std::string source, mode, dtype_label;
  double budget = 0;
  std::int64_t seq_len = 0, micro = 0;
  env.agree([&] {
    in.model = model_config(cfg, &source);
    const io::ModelConfig& mc = in.model;
    budget = parse_size(cfg.get_string("plan.gpu_memory"), "plan.gpu_memory");
    in.cuda = cfg.get_string("plan.target") == "cuda";
    in.ranks = static_cast<int>(cfg.get_int("plan.gpus"));
    if (in.cuda) {
      // The storage dtype of an sm_80+ GPU (bf16, or fp16 when model.dtype says so): 2 bytes either way.
      const DType st = dist::storage_dtype(dist::Backend::Cuda, 80, cfg.get_string("model.dtype"));
      in.storage = dtype_size(st);
      dtype_label = dtype_name(st);
    } else {
      in.storage = 4;
      dtype_label = "f32";
    }
    // The model settings as the modes read them (app::model_options); a bitsandbytes 4-bit directory loads as NF4
    // whatever the keys say. What the modes refuse, plan refuses too.
    const model::ModelOptions mo = model_options(cfg, cfg.get_bool("train.full_finetune"));
    refuse_sharded_full_finetune(cfg);
    in.quantize = mo.quantize == model::Quantize::Nf4 || mc.bnb4bit ? "nf4" : "none";
    in.double_quant = mc.bnb4bit ? mc.bnb4bit->double_quant : mo.quantize_double;
    in.shard_base = mo.shard_base;
    in.shard_keep = mo.shard_base && mo.shard_keep;
    in.full_finetune = mo.full_finetune;
    in.master_weights = mo.master_weights;
    in.recompute = mo.recompute;
    in.lora = !in.full_finetune;
    if (in.lora) in.lora_cfg = training_lora_config(cfg);

    mode = cfg.mode_before_cli();
    if (mode != "sft" && mode != "grpo" && mode != "dpo" && mode != "kto" && mode != "ppo" && mode != "distill")
      mode = "sft";
    const std::int64_t max_pos = mc.max_position_embeddings > 0 ? mc.max_position_embeddings : (1 << 30);
    const std::int64_t batch = cfg.get_int("train.batch_size"), accum = cfg.get_int("train.grad_accum");
    const std::int64_t per_rank = std::max<std::int64_t>(1, batch / in.ranks);
    if (mode == "grpo" || mode == "ppo" || mode == "distill") {
      // PPO samples one response per prompt and trains on mini-batches of the rollout batch; its scoring pass
      // (old log-probs and values, and the reference with the adapter off) always runs. distill samples one
      // completion per prompt and holds its teacher (below).
      const bool ppo = mode == "ppo", distill = mode == "distill";
      const std::int64_t G = ppo || distill ? 1 : cfg.get_int("grpo.num_generations");
      const std::int64_t prompt = cfg.get_int(ppo ? "ppo.max_prompt_length"
                                              : distill ? "distill.max_prompt_length"
                                                        : "grpo.max_prompt_length");
      const std::int64_t completion = cfg.get_int(ppo ? "ppo.response_length"
                                                  : distill ? "distill.max_completion_length"
                                                            : "grpo.max_completion_length");
      seq_len = std::min(max_pos, prompt + completion);
      micro = ppo ? std::max<std::int64_t>(1, per_rank / std::max<std::int64_t>(1, cfg.get_int("ppo.num_mini_batches")))
                  : std::max<std::int64_t>(1, per_rank * G / accum);
      // The scoring pass runs for the reference (grpo.beta > 0) and the old policy (a round serving several steps).
      in.scoring = ppo || (!distill && (cfg.get_float("grpo.beta") > 0 || cfg.get_int("grpo.num_iterations") > 1 ||
                                        cfg.get_int("grpo.steps_per_generation") > 1));
      in.reference_copy = !ppo && !distill && cfg.get_float("grpo.beta") > 0 &&
                          (in.full_finetune || cfg.get_bool("grpo.sync_ref_model") ||
                           (cfg.get_string("grpo.reference") == "initial" && !cfg.get_string("lora.adapter").empty()));
      if (distill) {
        if (!cfg.is_set("distill.teacher") || cfg.get_string("distill.teacher").empty())
          throw UserError("mgrl plan of a distill run needs its teacher: set distill.teacher (its config.json is read)");
        in.teacher = true;
        in.teacher_model = io::parse_hf_config(cfg.get_string("distill.teacher") + "/config.json");
        const auto [nf4, dq] = teacher_nf4(cfg, in.teacher_model);
        in.teacher_quantize = nf4 ? "nf4" : "none";
        in.teacher_double_quant = dq;
      }
      // The rollout's paged cache as rl::Generator sizes it (Generator::kv_pool), for the prompts a rank generates in
      // a round (grpo.steps_per_generation steps' worth).
      in.generate = true;
      const std::int64_t round_prompts =
          per_rank * (ppo || distill ? 1 : cfg.get_int("grpo.steps_per_generation"));
      const rl::Generator::KvPool pool = rl::Generator::kv_pool(
          static_cast<int>(cfg.get_int("generate.max_sequences")), static_cast<int>(G), round_prompts, static_cast<int>(prompt),
          static_cast<int>(completion), static_cast<int>(cfg.get_int("generate.kv_block_size")));
      const int slots = pool.slots;
      in.kv_slots = slots;
      in.kv_max_len = pool.max_len;
      in.kv_block_size = pool.block_size;
      in.kv_blocks = pool.blocks;
      in.infer_tokens = std::min<std::int64_t>(cfg.get_int("generate.max_prefill_tokens"), round_prompts * prompt) + slots;
      in.infer_rows = slots;
      // "auto" merges when the copy takes at most 1/kMergeShare of the free memory at the first generation; the
      // plan asks that of the whole budget (free memory then is less): it may count a copy the run skips, never
      // the reverse.
      const rl::GenerationOptions::Merge merge = in.lora ? merge_lora_option(cfg, mc, in.cuda)
                                                         : rl::GenerationOptions::Merge::Off;
      in.merged_lora = merge == rl::GenerationOptions::Merge::On ||
                       (merge != rl::GenerationOptions::Merge::Off &&
                        static_cast<double>(model::InferenceEngine::merged_bytes(mc, in.storage, in.lora_cfg)) <=
                            budget / static_cast<double>(model::InferenceEngine::kMergeShare));
    } else if (mode == "dpo" || mode == "kto") {
      seq_len = std::min(max_pos, cfg.get_int(mode + ".max_length"));
      // chosen and rejected; KTO: an example's completion (and a one-token placeholder; its KL sequence goes
      // through a pass of its own, no longer)
      micro = std::max<std::int64_t>(1, (mode == "dpo" ? 2 : 1) * per_rank / accum);
      // KTO's reference from a starting adapter or with full fine-tuning: a frozen copy of the starting weights
      // and any run whose reference moves (TR-DPO: dpo/kto.sync_ref_model)
      in.reference_copy = (mode == "kto" && (in.full_finetune || !cfg.get_string("lora.adapter").empty())) ||
                          cfg.get_bool(mode + ".sync_ref_model");
      in.scoring = true;
    } else {
      seq_len = std::min(max_pos, cfg.get_int("train.max_seq_len"));
      micro = std::max<std::int64_t>(1, per_rank / accum);
    }
    in.train_tokens = micro * seq_len + (mode == "kto" ? micro : 0);  // KTO: a one-token placeholder an example
    model::set_runtime_allowances(in);
    if (const double rss = in.cuda ? 0 : resident_bytes_now(); rss > in.runtime_bytes) {
      in.runtime_bytes = rss;
      in.runtime_note = "the mgrl process itself (binary and libraries as loaded, measured in this process)";
    }
  });

  const model::MemoryPlan plan = model::memory_plan(in);
  const std::int64_t limit = std::int64_t{1} << 24;
  const std::int64_t best = model::largest_fitting_tokens(in, budget, limit);
  const bool fits = plan.total <= budget;
  if (env.rank() != 0) return 0;

  const io::ModelConfig& mc = in.model;
  if (cfg.get_bool("plan.json")) {
    nlohmann::json j;
    j["model"] = source;
    j["architecture"] = io::architecture_name(mc.arch);
    j["parameters"] = io::parameter_count(mc);
    j["mode"] = mode;
    j["target"] = in.cuda ? "cuda" : "cpu";
    j["storage"] = dtype_label;
    j["ranks"] = in.ranks;
    j["quantize"] = in.quantize;
    j["shard_base"] = in.shard_base;
    j["recompute"] = in.recompute;
    j["micro_batch_sequences"] = micro;
    j["sequence_tokens"] = seq_len;
    j["micro_batch_tokens"] = in.train_tokens;
    j["parts"] = nlohmann::json::array();
    for (const auto& p : plan.parts)
      j["parts"].push_back({{"name", p.name}, {"bytes", p.bytes}, {"note", p.note}, {"load_only", p.transient}});
    j["step_bytes"] = plan.step_bytes;
    j["load_bytes"] = plan.load_bytes;
    j["total_bytes"] = plan.total;
    j["budget_bytes"] = budget;
    j["fits"] = fits;
    j["largest_micro_batch_tokens"] = best;
    std::cout << j.dump() << "\n";
    return 0;
  }
  char line[512];
  std::snprintf(line, sizeof line, "mgrl plan: %s: %s, %.3g parameters; mode %s, %s%s%s\n", source.c_str(),
                io::model_name(mc).c_str(), io::parameter_count(mc), mode.c_str(),
                in.full_finetune ? "full fine-tuning" : ("LoRA r " + std::to_string(in.lora_cfg.r)).c_str(),
                in.quantize == "nf4" ? ", NF4 base (QLoRA)" : "", in.recompute ? ", model.recompute" : "");
  std::cout << line;
  std::snprintf(line, sizeof line,
                "per rank on %d x %s (%s storage%s), %s GiB each; micro-batch %lld x %lld = %lld tokens\n",
                in.ranks, in.cuda ? "GPU" : "CPU rank", dtype_label.c_str(), in.shard_base ? ", base sharded" : "",
                gib(budget).c_str(), static_cast<long long>(micro), static_cast<long long>(seq_len),
                static_cast<long long>(in.train_tokens));
  std::cout << line;
  std::snprintf(line, sizeof line, "  %-24s %10s  %s\n", "part", "GiB", "what");
  std::cout << line;
  for (const auto& p : plan.parts) {
    std::snprintf(line, sizeof line, "  %-24s %10s  %s\n", p.name.c_str(), gib(p.bytes).c_str(), p.note.c_str());
    std::cout << line;
  }
  std::snprintf(line, sizeof line, "  %-24s %10s  %s\n", "total (peak)", gib(plan.total).c_str(),
                plan.load_bytes > plan.step_bytes ? "while loading the weights (a step holds less)"
                                                  : "during a training step");
  std::cout << line;
  if (fits)
    std::snprintf(line, sizeof line, "fits in %s GiB: yes (%s GiB to spare)\n", gib(budget).c_str(),
                  gib(budget - plan.total).c_str());
  else
    std::snprintf(line, sizeof line, "fits in %s GiB: no (%s GiB short)\n", gib(budget).c_str(),
                  gib(plan.total - budget).c_str());
  std::cout << line;
  if (best > 0)
    std::snprintf(line, sizeof line, "largest micro-batch that fits: %lld tokens (%lld sequences of %lld)%s\n",
                  static_cast<long long>(best), static_cast<long long>(best / std::max<std::int64_t>(1, seq_len)),
                  static_cast<long long>(seq_len), best >= limit ? " or more" : "");
  else
    std::snprintf(line, sizeof line, "largest micro-batch that fits: none (not one token)\n");
  std::cout << line;
  return 0;
}

}  // namespace mgrl::app
