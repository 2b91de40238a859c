// mode_dpo.cpp: `mgrl dpo`: direct preference optimisation (LoRA or full) on JSONL preference pairs, data-parallel
// over ranks (docs/dpo.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "app/modes.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/comm.h"
#include "dist/device.h"
#include "dist/mpi_env.h"
#include "io/chat_template.h"
#include "io/config.h"
#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "rl/generator.h"
#include "train/comm_gatherer.h"
#include "train/dpo.h"
#include "train/dpo_data.h"

namespace mgrl::app {
namespace {

// The run's losses: dpo.loss_type with dpo.sft_weight, or dpo.loss_mix (trl's loss_type list with loss_weights):
// "type" or "type:weight" items, "sft" the sft weight.
struct LossMix {
  std::vector<std::pair<train::DpoLossType, double>> members;  // never empty
  double sft_weight = 0;
  bool given = false;  // from dpo.loss_mix
  // Every member is a loss of the log-ratios' difference (a pair whose sides are the same teaches nothing).
  bool of_difference() const {
    for (const auto& m : members)
      if (!train::dpo_loss_of_difference(m.first)) return false;
    return true;
  }
  bool has(train::DpoLossType t) const {
    for (const auto& m : members)
      if (m.first == t) return true;
    return false;
  }
};

LossMix loss_mix(const io::Config& cfg) {
  LossMix mix;
  const auto& items = cfg.get_strings("dpo.loss_mix");
  if (items.empty()) {
    mix.members = {{train::dpo_loss_type(cfg.get_string("dpo.loss_type")), 1.0}};
    mix.sft_weight = cfg.get_float("dpo.sft_weight");
    return mix;
  }
  mix.given = true;
  for (const char* other : {"dpo.loss_type", "dpo.sft_weight"})
    if (cfg.origin(other).kind != io::Origin::Default)
      throw UserError(std::string("keys 'dpo.loss_mix' and '") + other + "' are both given: the mix names every loss "
                      "type and weight (\"sft:w\" for the sft term)");
  for (const auto& item : items) {
    const auto colon = item.find(':');
    const std::string name = item.substr(0, colon);
    double weight = 1.0;
    if (colon != std::string::npos) {
      const std::string w = item.substr(colon + 1);
      char* end = nullptr;
      weight = std::strtod(w.c_str(), &end);
      if (w.empty() || *end != '\0' || !std::isfinite(weight) || weight < 0)
        throw UserError("key 'dpo.loss_mix': item \"" + item + "\" needs a weight >= 0 after the colon (\"type:weight\")");
    }
    if (name == "sft") {
      mix.sft_weight += weight;
      continue;
    }
    train::DpoLossType t;
    try {
      t = train::dpo_loss_type(name);
    } catch (const UserError&) {
      throw UserError("key 'dpo.loss_mix': \"" + name + "\" is not a loss type (those of dpo.loss_type, or sft)");
    }
    for (const auto& m : mix.members)
      if (m.first == t) throw UserError("key 'dpo.loss_mix' names \"" + name + "\" twice");
    mix.members.emplace_back(t, weight);
  }
  if (mix.members.empty())
    throw UserError("key 'dpo.loss_mix' has no preference loss (only sft): give one, e.g. \"sigmoid\"");
  return mix;
}

// The start-up line's reference: `otherwise` unless it is a frozen copy (moving with TR-DPO's syncs).
std::string reference_text(const train::DpoOptions& o, const std::string& otherwise) {
  if (o.ref_sync.on()) return "a copy of the starting weights, " + ref_sync_text(o.ref_sync);
  return o.frozen_reference ? "a frozen copy of the starting weights" : otherwise;
}

}  // namespace

int run_dpo(Context& ctx) {
  const auto& env = ctx.env;
  const auto& cfg = ctx.cfg;
  // `mgrl kto`: trl's KTOTrainer on labelled completions, in this trainer: an example is its completion and its KL
  // sequence where a pair has chosen and rejected (docs/kto.md).
  const bool kto = cfg.get_string("mode") == "kto";
  const std::string sec = kto ? "kto." : "dpo.";
  prepare_run_dirs(ctx, false);
  const bool random_init = cfg.get_string("model.init") == "random";
  const bool full = cfg.get_bool("train.full_finetune");

  io::ModelConfig mc;
  std::unique_ptr<io::Tokenizer> tok;
  train::PairData train_data, eval_data;
  LossMix mix;
  int max_length = 0;  // dpo.max_length within the model's positions
  env.agree([&] {
    // trl 1.16 smooths labels in the robust and exo_pair losses only (older trl's sigmoid "cDPO" smoothing is gone):
    // a smoothing given with another loss was accepted and ignored until 2026-11-28. exo_pair needs one (its
    // log(epsilon) is -inf at 0: trl's loss is inf there).
    using T = train::DpoLossType;
    if (kto) {
      mix.members = {{T::Kto, 1.0}};
    } else {
      mix = loss_mix(cfg);
      const std::string key = mix.given ? "dpo.loss_mix" : "dpo.loss_type";
      if (cfg.get_float("dpo.label_smoothing") != 0.0 && !mix.has(T::Robust) && !mix.has(T::ExoPair) &&
          !mix.has(T::Aot) && !mix.has(T::AotUnpaired))
        throw UserError("key 'dpo.label_smoothing' applies to dpo.loss_type = \"robust\", \"exo_pair\", \"aot\" and "
                        "\"aot_unpaired\" only (as in trl 1.16), not to \"" +
                        std::string(train::dpo_loss_name(mix.members.front().first)) + "\"");
      for (const auto& m : mix.members)
        if (cfg.get_string("dpo.f_divergence_type") != "reverse_kl" &&
            (!train::dpo_loss_of_difference(m.first) || train::dpo_loss_is_batch(m.first)))
          throw UserError("key 'dpo.f_divergence_type' = \"" + cfg.get_string("dpo.f_divergence_type") + "\" applies to "
                          "the losses of the log-ratios' difference (as in trl 1.16), not to " + key + " = \"" +
                          train::dpo_loss_name(m.first) + "\"");
      if (mix.has(T::ExoPair) && cfg.get_float("dpo.label_smoothing") == 0.0)
        throw UserError("key 'dpo.label_smoothing' = 0: dpo.loss_type = \"exo_pair\" needs its epsilon > 0 (the EXO "
                        "paper recommends 1e-3; at 0 the loss is infinite)");
      // WPO weighs each pair: AOT's losses sort the pairs (trl refuses them too); mgrl's sft term is a mean over the
      // global batch's chosen tokens, which trl's per-micro-batch weighting of it does not carry over to.
      if (cfg.get_bool("dpo.use_weighting")) {
        if (mix.has(T::Aot) || mix.has(T::AotUnpaired))
          throw UserError("key 'dpo.use_weighting' does not apply to the aot losses (they sort the pairs, so per-pair "
                          "weights would be misaligned; trl refuses them too)");
        if (mix.sft_weight != 0.0)
          throw UserError("key 'dpo.use_weighting' with an sft term (dpo.sft_weight or \"sft\" in dpo.loss_mix) is not "
                          "available in mgrl: leave one of them out");
      }
    }
    // TR-DPO (sync_ref_model): the reference is a copy of the trainable weights, scored per batch (trl refuses
    // precompute_ref_log_probs with it, as a reference that moves cannot be scored before training).
    if (cfg.get_bool(sec + "sync_ref_model") && !kto && cfg.get_bool("dpo.precompute_ref_log_probs"))
      throw UserError("key 'dpo.sync_ref_model' with dpo.precompute_ref_log_probs = true: a reference that moves "
                      "with training cannot be scored before it (trl refuses the pair too): leave one of them out");
    std::string model_src;
    mc = training_model_config(cfg, &model_src);
    // a frozen copy of the starting weights (full fine-tuning): KTO's reference, and any run whose reference moves
    check_model_fits(ctx, mc, model_src, full, kto || cfg.get_bool(sec + "sync_ref_model"));
    tok = std::make_unique<io::Tokenizer>(io::Tokenizer::from_dir(tokenizer_dir(cfg)));
    if (tok->vocab_size() > mc.vocab_size)
      throw UserError(tok->path() + ": the tokenizer has " + std::to_string(tok->vocab_size()) +
                      " tokens, more than the model's vocab_size (" + std::to_string(mc.vocab_size) + ")");
    train::PairOptions d;
    d.max_length = max_length = static_cast<int>(std::min<std::int64_t>(
        cfg.get_int(sec + "max_length"), mc.max_position_embeddings > 0 ? mc.max_position_embeddings : 1 << 30));
    const io::ChatTemplate chat = chat_template(cfg, "train.chat_format", *tok);
    d.chat = &chat;
    // KTO's KL sequences pair each example's prompt with the completion of another example of its global
    // micro-batch (trl: of each device's micro-batch), so that micro-batch needs two examples or more.
    const std::int64_t kl_block = cfg.get_int("train.batch_size") / std::max<std::int64_t>(1, cfg.get_int("train.grad_accum"));
    if (kto && cfg.get_string("kto.loss_type") == "kto" && kl_block < 2)
      throw UserError("mgrl kto needs train.batch_size / train.grad_accum >= 2 (got " + std::to_string(kl_block) +
                      "): its KL estimate pairs each example's prompt with another example's completion of its "
                      "micro-batch (trl refuses a batch of 1 too; kto.loss_type = \"apo_zero_unpaired\" has no KL estimate)");
    train_data = kto ? train::load_kto(cfg.get_string("data.input"), *tok, d)
                     : train::load_pairs(cfg.get_string("data.input"), *tok, d);
    // No pair that teaches anything, and no SFT term on the chosen side: the run would end as it began.
    if (!kto && mix.of_difference() && train_data.same + train_data.cut_same == static_cast<int>(train_data.pairs.size()) &&
        mix.sft_weight == 0.0)
      throw UserError(cfg.get_string("data.input") + ": every pair has the same chosen and rejected tokens" +
                      (train_data.cut_same > 0 ? " once cut to dpo.max_length (" + std::to_string(max_length) + ")"
                                               : std::string()) +
                      " (the first at line " +
                      std::to_string(train_data.same == 0       ? train_data.first_cut_same_line
                                     : train_data.cut_same == 0 ? train_data.first_same_line
                                                                : std::min(train_data.first_same_line,
                                                                           train_data.first_cut_same_line)) +
                      "): the loss's gradient would be 0 for every pair, and nothing could be learned");
    if (!cfg.get_string("eval.input").empty())
      eval_data = kto ? train::load_kto(cfg.get_string("eval.input"), *tok, d)
                      : train::load_pairs(cfg.get_string("eval.input"), *tok, d);
    if (kto && cfg.get_bool("eval.accuracy"))
      throw UserError("key 'eval.accuracy' is not available in mgrl kto (its completions are desirable or not, not "
                      "answers to match): leave it out");
    if (cfg.get_bool("eval.accuracy") && !eval_data.pairs.empty()) {
      std::size_t longest_prompt = 0;
      for (const auto& p : eval_data.pairs) longest_prompt = std::max(longest_prompt, static_cast<std::size_t>(p.prompt_len));
      check_eval_generation_fits(cfg, mc, longest_prompt, "the longest held-out prompt of " + cfg.get_string("eval.input"));
    }
    // The longest sequence: DPO's chosen or rejected; KTO's completion, or (kto) a KL sequence, a prompt with
    // another example's completion, at most max_length.
    std::size_t longest = 1, longest_prompt = 0, longest_completion = 0;
    for (const auto* set : {&train_data, &eval_data})
      for (const auto& p : set->pairs) {
        longest = std::max({longest, p.chosen.size(), kto ? std::size_t{0} : p.rejected.size()});
        longest_prompt = std::max(longest_prompt, static_cast<std::size_t>(p.prompt_len));
        longest_completion = std::max(longest_completion, p.completion.size());
      }
    const bool kl_sequences = kto && cfg.get_string("kto.loss_type") == "kto";
    if (kl_sequences)
      longest = std::max(longest, std::min(longest_prompt + longest_completion, static_cast<std::size_t>(max_length)));
    // A training pass holds two sequences a pair (DPO), one an example (KTO: its KL sequences have a pass of their
    // own, a one-token placeholder in their slot); an evaluation pass holds both of KTO's (kto) too.
    const std::int64_t batch = cfg.get_int("train.batch_size"), accum = cfg.get_int("train.grad_accum");
    check_batch_fits(mc, "train.batch_size", batch,
                     (kto ? 1.0 : 2.0) * static_cast<double>(batch) / env.size() / static_cast<double>(accum),
                     static_cast<double>(longest), "lower it, or raise train.grad_accum");
    check_batch_fits(mc, "eval.batch_size", cfg.get_int("eval.batch_size"),
                     (kto && !kl_sequences ? 1.0 : 2.0) * static_cast<double>(cfg.get_int("eval.batch_size")),
                     static_cast<double>(longest), "lower it");
  });
  // Said once every start-up check has passed (an error comes alone).
  std::vector<std::string> data_notes;
  for (const auto* set : {&train_data, &eval_data})
    for (auto& note : set->notes(cfg.get_string(set == &train_data ? "data.input" : "eval.input"), max_length,
                                 mix.of_difference()))
      data_notes.push_back(std::move(note));
  if (kto) {
    // trl's check of the desirability balance: with unequal counts (trl's: desirable at least 1, undesirable the rest
    // and at least 1), desirable_weight x desirable examples / (undesirable_weight x undesirable ones) should lie in
    // [1, 4/3] (its bounds rounded to 2 decimals, as trl's message gives them).
    double nd = 0;
    for (const auto& e : train_data.pairs) nd += e.label == 1 ? 1 : 0;
    nd = std::max(nd, 1.0);
    const double nu = std::max(static_cast<double>(train_data.pairs.size()) - nd, 1.0);
    const auto r2 = [](double x) { return std::round(x * 100.0) / 100.0; };
    const double wd = cfg.get_float("kto.desirable_weight"), wu = cfg.get_float("kto.undesirable_weight");
    const bool d_ok = r2(nu * wu / nd) <= wd && wd <= r2(nu * wu / nd * 1.33);
    const bool u_ok = r2(nd * wd / nu / 1.33) <= wu && wu <= r2(nd * wd / nu);
    if (nd != nu && !d_ok && !u_ok) {
      char m[400];
      std::snprintf(m, sizeof m, "%s: %.0f desirable and %.0f undesirable examples: with kto.desirable_weight %g and "
                    "kto.undesirable_weight %g their weighted counts are out of balance (the KTO paper advises a "
                    "ratio in [1, 4/3]): set kto.desirable_weight in [%.2f, %.2f] or kto.undesirable_weight in "
                    "[%.2f, %.2f]", cfg.get_string("data.input").c_str(), nd, nu, wd, wu, r2(nu * wu / nd),
                    r2(nu * wu / nd * 1.33), r2(nd * wd / nu / 1.33), r2(nd * wd / nu));
      data_notes.emplace_back(m);
    }
  }

  TrainingModel tm = build_training_model(ctx, mc, full);
  model::Transformer& net = *tm.net;
  const train::LossScaling& scaling = tm.scaling;
  const std::uint64_t seed = tm.seed;
  const bool fresh_adapter = tm.fresh_adapter;

  train::DpoOptions o;
  o.loss.type = mix.members.front().first;
  if (kto) {
    o.loss.beta = cfg.get_float("kto.beta");
    o.loss.desirable_weight = cfg.get_float("kto.desirable_weight");
    o.loss.undesirable_weight = cfg.get_float("kto.undesirable_weight");
    // The reference: the adapter switched off, or (a starting adapter, full fine-tuning) a frozen copy of the
    // starting weights swapped in for the reference passes.
    o.frozen_reference = full || !fresh_adapter;
    o.kto_max_length = max_length;
    o.kto_kl = cfg.get_string("kto.loss_type") == "kto";
  } else {
    if (mix.members.size() > 1 || mix.members.front().second != 1.0) o.loss.mix = mix.members;
    o.loss.beta = cfg.get_float("dpo.beta");
    o.loss.label_smoothing = cfg.get_float("dpo.label_smoothing");
    o.loss.sft_weight = mix.sft_weight;
    if (mix.has(train::DpoLossType::DiscoPop)) o.loss.discopop_tau = cfg.get_float("dpo.discopop_tau");
    o.loss.f_divergence = cfg.get_string("dpo.f_divergence_type");
    if (o.loss.f_divergence == "alpha_divergence") o.loss.f_alpha = cfg.get_float("dpo.f_alpha_divergence_coef");
    o.ld_alpha = cfg.get_float("dpo.ld_alpha");
    o.loss.use_weighting = cfg.get_bool("dpo.use_weighting");
    // The reference is the starting policy (as trl): a fresh adapter switched off is the base model; full fine-tuning
    // and a starting adapter have no such switch, so their reference is scored once, before training.
    o.precompute_ref = cfg.get_bool("dpo.precompute_ref_log_probs") || full || !fresh_adapter;
  }
  o.ref_sync = ref_sync_option(cfg, sec);
  if (o.ref_sync.on()) {  // TR-DPO: the reference a frozen copy that moves, scored per batch
    o.frozen_reference = true;
    o.precompute_ref = false;
  }
  o.initial_is_base = fresh_adapter;
  read_supervised_keys(cfg, ctx.device, scaling, seed,
                       run_steps(cfg, train_data.pairs.size(), cfg.get_int("train.batch_size"), 1, kto ? "examples" : "pairs"),
                       &o);
  if (cfg.get_bool("eval.accuracy") && !eval_data.pairs.empty())  // in lockstep on a sharded base
    o.accuracy = greedy_accuracy(env, net, *tok, static_cast<int>(cfg.get_int("eval.max_new_tokens")));
  {
    const double epochs = static_cast<double>(o.max_steps) * static_cast<double>(o.global_batch) /
                          static_cast<double>(std::max<std::size_t>(1, train_data.pairs.size()));
    char line[512];
    if (kto)
      std::snprintf(line, sizeof(line),
                    "kto: %s %s, %zu training examples, %zu held-out, %s on %d rank%s, loss %s, beta %g, weights %g desirable, "
                    "%g undesirable, reference %s; %lld steps x %d examples = %.3g epochs",
                    random_init ? "random-init" : "pretrained", io::model_name(mc).c_str(), train_data.pairs.size(),
                    eval_data.pairs.size(), full ? "full fine-tuning" : "LoRA", env.size(), env.size() == 1 ? "" : "s",
                    o.kto_kl ? "kto" : "apo_zero_unpaired", o.loss.beta, o.loss.desirable_weight, o.loss.undesirable_weight,
                    reference_text(o, "the adapter switched off").c_str(),
                    static_cast<long long>(o.max_steps), o.global_batch, epochs);
    else
      std::snprintf(line, sizeof(line),
                    "dpo: %s %s, %zu training pairs, %zu held-out, %s on %d rank%s, loss %s%s%s, beta %g, reference %s; "
                    "%lld steps x %d pairs = %.3g epochs",
                    random_init ? "random-init" : "pretrained", io::model_name(mc).c_str(), train_data.pairs.size(),
                    eval_data.pairs.size(), full ? "full fine-tuning" : "LoRA", env.size(), env.size() == 1 ? "" : "s",
                    train::dpo_loss_label(o.loss).c_str(), o.loss.sft_weight != 0 ? " + sft" : "",
                    o.loss.use_weighting ? " (WPO-weighted)" : "", o.loss.beta,
                    reference_text(o, o.precompute_ref ? "log-probs of the starting weights, computed once"
                                                       : "the adapter switched off").c_str(),
                    static_cast<long long>(o.max_steps), o.global_batch, epochs);
    log::info(line);
  }
  std::unique_ptr<train::DpoTrainer> trainer;
  env.agree([&] {
    trainer = std::make_unique<train::DpoTrainer>(env, ctx.comm, net, std::move(train_data.pairs),
                                                  std::move(eval_data.pairs), o);
  });
  for (const auto& note : data_notes) log::warn_once(note);
  say_unused_keys(ctx);  // the configuration is read: what it did not read changes nothing
  trainer->run();
  return 0;
}

}  // namespace mgrl::app
