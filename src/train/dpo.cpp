// dpo.cpp: the DPO training loop.
#include "train/dpo.h"

#include <algorithm>
#include <array>
#include <sstream>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/stop.h"
#include "io/hf_config.h"
#include "train/idle_pass.h"
#include "train/run_log.h"
#include "train/stop_agreement.h"

namespace mgrl::train {

void DpoSums::add(const DpoPairIn& in, const DpoPairOut& out) {
  pairs += 1;
  loss += out.loss;
  if (in.label >= 0) {  // a KTO example: its side's reward and log-prob
    if (in.label == 1) {
      kto_desirable += 1;
      reward_chosen += out.reward_chosen;
      logp_chosen += in.chosen;
    } else {
      kto_undesirable += 1;
      reward_rejected += out.reward_rejected;
      logp_rejected += in.chosen;
    }
    return;
  }
  reward_chosen += out.reward_chosen;
  reward_rejected += out.reward_rejected;
  // trl counts a pair strictly greater. A difference within the f32 rounding of the sequence log-probs is a tie:
  // where trl's values are equal (the reference the policy itself, identical sequences once cut to max_length) mgrl's
  // separate passes (a precomputed reference, another packing) can differ in the last bits, and counted those as wins
  // (rewards/accuracies 0.625 where trl said 0; found by a DPO-vs-trl hunt, 2026-11-29).
  constexpr double kUlps = 4 * 1.1920929e-7;
  const double lc = in.chosen - in.ref_chosen, lr = in.rejected - in.ref_rejected;
  const double tol_r = kUlps * (std::fabs(in.chosen) + std::fabs(in.rejected) + std::fabs(in.ref_chosen) +
                                std::fabs(in.ref_rejected));
  accuracy += out.reward_chosen > out.reward_rejected && lc - lr > tol_r ? 1.0 : 0.0;
  margin += out.reward_chosen - out.reward_rejected;
  logp_chosen += in.chosen;
  logp_rejected += in.rejected;
  logp_accuracy += in.chosen - in.rejected > kUlps * (std::fabs(in.chosen) + std::fabs(in.rejected)) ? 1.0 : 0.0;
}

double DpoSums::total_loss(double sft_weight) const {
  return loss / std::max(1.0, pairs) + (sft_weight != 0 ? sft_weight * sft_nll / std::max(1.0, chosen_tokens) : 0.0);
}

double chosen_tokens(const std::vector<const PreferencePair*>& pairs) {
  double n = 0;
  for (const auto* p : pairs) n += p->chosen_tokens();
  return n;
}

namespace {
// Every sum of a DpoSums (const or not), in one order.
template <class Sums>
auto fields(Sums& s) {
  return std::array<decltype(&s.pairs), 22>{&s.pairs,         &s.loss,          &s.reward_chosen, &s.reward_rejected,
                                            &s.accuracy,      &s.margin,        &s.logp_chosen,   &s.logp_rejected,
                                            &s.logp_accuracy, &s.sft_nll,       &s.chosen_tokens, &s.entropy,
                                            &s.completion_tokens, &s.top1_chosen, &s.logits_chosen,
                                            &s.logits_rejected, &s.chosen_count, &s.rejected_count,
                                            &s.kto_desirable,  &s.kto_undesirable, &s.kto_kl, &s.kto_kl_count};
}
}  // namespace

void DpoSums::allreduce(const dist::MpiEnv& env) {
  for (double* x : fields(*this)) *x = env.allreduce_sum(*x);
}

void DpoSums::merge(const DpoSums& o) {
  const auto mine = fields(*this);
  const auto theirs = fields(o);
  for (std::size_t i = 0; i < mine.size(); ++i) *mine[i] += *theirs[i];
}

namespace {

// trl's metric names (a prefix: "" in training, "eval_" for the held-out set), means over the pairs.
nlohmann::json named(const DpoSums& s, const std::string& prefix, double sft_weight) {
  const double n = std::max(1.0, s.pairs);
  if (s.kto()) {  // trl's KTOTrainer's: each side's means over its own examples, the micro-batches' mean KL
    nlohmann::json j = {{prefix + "loss", s.total_loss(0.0)}, {prefix + "kl", s.kto_kl / std::max(1.0, s.kto_kl_count)}};
    if (s.kto_desirable > 0) {
      j[prefix + "rewards/chosen"] = s.reward_chosen / s.kto_desirable;
      j[prefix + "logps/chosen"] = s.logp_chosen / s.kto_desirable;
    }
    if (s.kto_undesirable > 0) {
      j[prefix + "rewards/rejected"] = s.reward_rejected / s.kto_undesirable;
      j[prefix + "logps/rejected"] = s.logp_rejected / s.kto_undesirable;
    }
    if (s.kto_desirable > 0 && s.kto_undesirable > 0)
      j[prefix + "rewards/margins"] = s.reward_chosen / s.kto_desirable - s.reward_rejected / s.kto_undesirable;
    if (s.completion_tokens > 0) {
      j[prefix + "entropy"] = s.entropy / s.completion_tokens;
      if (s.chosen_count > 0) j[prefix + "logits/chosen"] = s.logits_chosen / s.chosen_count;
      if (s.rejected_count > 0) j[prefix + "logits/rejected"] = s.logits_rejected / s.rejected_count;
    }
    return j;
  }
  nlohmann::json j = {{prefix + "loss", s.total_loss(sft_weight)},
                      {prefix + "rewards/chosen", s.reward_chosen / n},
                      {prefix + "rewards/rejected", s.reward_rejected / n},
                      {prefix + "rewards/accuracies", s.accuracy / n},
                      {prefix + "rewards/margins", s.margin / n},
                      {prefix + "logps/chosen", s.logp_chosen / n},
                      {prefix + "logps/rejected", s.logp_rejected / n},
                      {prefix + "logps/accuracies", s.logp_accuracy / n}};
  if (s.completion_tokens > 0) {  // trl's token metrics, over the tokens (training forwards only)
    j[prefix + "entropy"] = s.entropy / s.completion_tokens;
    j[prefix + "mean_token_accuracy"] = s.top1_chosen / std::max(1.0, s.chosen_count);
    j[prefix + "logits/chosen"] = s.logits_chosen / std::max(1.0, s.chosen_count);
    j[prefix + "logits/rejected"] = s.logits_rejected / std::max(1.0, s.rejected_count);
  }
  return j;
}

}  // namespace

DpoTrainer::DpoTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& model,
                       std::vector<PreferencePair> train, std::vector<PreferencePair> eval, DpoOptions opts)
    : env_(env), comm_(comm), model_(model), train_(std::move(train)), eval_(std::move(eval)), opts_(std::move(opts)),
      sampler_(train_.size(), opts_.seed, opts_.shuffle) {
  const int ranks = env_.size();
  const bool kto = opts_.loss.type == DpoLossType::Kto;
  const std::string unit = kto ? " examples" : " pairs", section = kto ? "kto." : "dpo.";
  if (opts_.global_batch % ranks != 0)
    throw UserError("train.batch_size (" + std::to_string(opts_.global_batch) + unit +
                    ") must be divisible by the number of ranks (" + std::to_string(ranks) + ")");
  if ((opts_.global_batch / ranks) % opts_.grad_accum != 0)
    throw UserError("train.batch_size / ranks (" + std::to_string(opts_.global_batch / ranks) + unit +
                    ") must be divisible by train.grad_accum (" + std::to_string(opts_.grad_accum) + ")");
  bool robust = false;
  for (const auto& m : dpo_loss_members(opts_.loss)) robust = robust || m.first == DpoLossType::Robust;
  if (robust && !(opts_.loss.label_smoothing >= 0 && opts_.loss.label_smoothing < 0.5))
    throw UserError("dpo.label_smoothing must lie in [0, 0.5) for dpo.loss_type = \"robust\" (got " +
                    std::to_string(opts_.loss.label_smoothing) + ")");
  if (!(opts_.loss.beta > 0)) throw UserError(section + "beta must be above 0");
  tr_ = trainable_of(model_, model_.base_grads() != nullptr);
  opts_.checkpoint.reference = reference_identity(model_.ops(), model_, tr_, opts_.initial_is_base);
  if (opts_.frozen_reference) frozen_ = std::make_unique<FrozenCopy>(model_.ops(), tr_);  // before a resume
  MGRL_CHECK(!opts_.ref_sync.on() || (frozen_ && !opts_.precompute_ref),
             "DpoTrainer: sync_ref_model without a frozen reference scored per batch");
  model_.set_token_stats(true);  // trl's entropy, mean_token_accuracy and logits/* of the training forwards
  if (opts_.loss.use_weighting) model_.set_score_stats(true);  // WPO's weights of the held-out pairs
  opt_ = std::make_unique<Optimizer>(model_.ops(), tr_,
                                     OptimizerOptions{opts_.adamw, opts_.schedule, opts_.max_grad_norm, opts_.scaling});
  sync_ = std::make_unique<GradSync>(comm_, model_, tr_);
  ckpt_ = std::make_unique<Checkpointer>(
      env_, model_.ops(), *opt_,
      opts_.checkpoint,
      model_identity(io::architecture_name(model_.config().arch), tr_.tensors));
  if (opts_.ref_sync.on()) ckpt_->keep_synced_reference(frozen_.get(), opts_.ref_sync.every);
  guard_ = std::make_unique<DivergenceGuard>(env_, opts_.max_nonfinite_steps, opts_.scaling.enabled);
  state_.rank_rng.assign(static_cast<std::size_t>(ranks), 0);
  opt_->start(state_);  // the loss scale of a fresh run; a resume takes the checkpoint's
  // Activations planned once: a micro-batch holds at most the longest `micro` pairs (both sequences of each).
  const int micro = opts_.global_batch / ranks / opts_.grad_accum;
  std::vector<long long> lens;
  // KTO: an example and its KL sequence, which may borrow the longest completion (its prompt + that, cut)
  std::size_t longest_completion = 0;
  for (const auto& p : train_) longest_completion = std::max(longest_completion, p.completion.size());
  for (const auto& p : train_)
    lens.push_back(static_cast<long long>(
        // KTO: a training pass holds the completions and a one-token placeholder each, the KL pass before it the
        // KL sequences (kto_kl_logps)
        kto ? std::max(p.chosen.size() + 1,
                       !opts_.kto_kl ? 0
                                     : std::min<std::size_t>(static_cast<std::size_t>(p.prompt_len) + longest_completion,
                                                             static_cast<std::size_t>(opts_.kto_max_length)))
            : p.chosen.size() + p.rejected.size()));
  const auto top = std::min<std::size_t>(lens.size(), static_cast<std::size_t>(micro));
  std::partial_sort(lens.begin(), lens.begin() + static_cast<std::ptrdiff_t>(top), lens.end(), std::greater<long long>());
  long long most = 0;
  for (std::size_t i = 0; i < top; ++i) most += lens[i];
  if (most > 0 && most < (1LL << 31))
    env_.agree([&] {
      const auto refuse = [&](const std::string& why) {
        throw UserError("train.batch_size = " + std::to_string(opts_.global_batch) + " (" + std::to_string(micro) +
                        unit + " per rank and micro-batch with train.grad_accum = " + std::to_string(opts_.grad_accum) +
                        ", up to " + std::to_string(most) + " tokens at once within " + section + "max_length) needs " +
                        why + ": lower train.batch_size or " + section + "max_length, or raise train.grad_accum");
      };
      const std::string beyond = activations_beyond_memory(model_, most);
      if (!beyond.empty()) refuse(beyond);
      try {
        model_.plan(static_cast<int>(most));
      } catch (const OutOfMemory& e) {
        refuse(gib(static_cast<double>(model_.activation_bytes(static_cast<int>(most)))) + " of activations (" +
               e.what() + ")");
      }
    });
}

DpoTrainer::~DpoTrainer() = default;

std::size_t kto_partner(const std::vector<std::size_t>& global, std::size_t mb_begin, std::size_t mb_end, std::size_t s) {
  MGRL_CHECK(mb_begin <= s && s < mb_end && mb_end <= global.size(), "kto_partner: slots");
  // The slot before (cyclically), or the nearest before it that holds another example: the sampler repeats one
  // across an epoch's end, and a data set smaller than the micro-batch repeats them (until a review, 2026-11-29, such
  // an example was its own KL partner). Only a block of a single example has none other: itself.
  const std::size_t M = mb_end - mb_begin;
  for (std::size_t back = 1; back < M; ++back) {
    const std::size_t c = mb_begin + (s - mb_begin + M - back) % M;
    if (global[c] != global[s]) return c;
  }
  return s;
}

void kto_no_kl_sequence(PreferencePair& x) {
  MGRL_CHECK(!x.chosen.empty(), "kto_no_kl_sequence: an empty example");
  x.rejected.assign(1, x.chosen.front());
}

PreferencePair kto_example(const std::vector<PreferencePair>& data, const std::vector<std::size_t>& global,
                           std::size_t mb_begin, std::size_t mb_end, std::size_t s, int max_length, bool kl) {
  const PreferencePair& e = data[global[s]];
  if (!kl) {
    PreferencePair x;
    x.label = e.label;
    x.prompt_len = e.prompt_len;
    x.chosen = e.chosen;
    kto_no_kl_sequence(x);
    return x;
  }
  const PreferencePair& other = data[global[kto_partner(global, mb_begin, mb_end, s)]];
  PreferencePair x;
  x.label = e.label;
  x.prompt_len = e.prompt_len;
  x.chosen = e.chosen;
  x.rejected.assign(e.chosen.begin(), e.chosen.begin() + e.prompt_len);
  x.rejected.insert(x.rejected.end(), other.completion.begin(), other.completion.end());
  x.rejected.resize(std::min<std::size_t>(x.rejected.size(), static_cast<std::size_t>(max_length)));
  return x;
}

std::vector<PreferencePair> kto_micro_batch(const std::vector<PreferencePair>& data, const std::vector<std::size_t>& global,
                                            std::size_t mb_begin, std::size_t mb_end, std::size_t begin, std::size_t end,
                                            int max_length, bool kl) {
  std::vector<PreferencePair> out;
  for (std::size_t s = begin; s < end; ++s) out.push_back(kto_example(data, global, mb_begin, mb_end, s, max_length, kl));
  return out;
}

model::Batch dpo_batch(const std::vector<const PreferencePair*>& mb, double ld_alpha, std::vector<float>* tw) {
  model::Batch b;
  for (const auto* p : mb) {
    b.add(p->chosen);
    b.add(p->rejected);
    b.scored_from.insert(b.scored_from.end(), 2, p->prompt_len);  // the responses' log-probs alone are read
  }
  tw->assign(b.tokens.size(), 0.0f);
  for (std::size_t k = 0; k < mb.size(); ++k) {
    const auto* p = mb[k];
    // LD-DPO's weight past the shorter completion; a KTO example's two sequences are not a pair (no ld_alpha)
    const int shared = p->label >= 0 ? std::numeric_limits<int>::max() : std::min(p->chosen_tokens(), p->rejected_tokens());
    for (int s = 0; s < 2; ++s) {
      const int seq = static_cast<int>(2 * k) + s;
      for (int t = p->prompt_len; t < b.length(seq); ++t)
        (*tw)[static_cast<std::size_t>(b.offsets[seq] + t)] =
            t - p->prompt_len < shared ? 1.0f : static_cast<float>(ld_alpha);
    }
  }
  return b;
}

void dpo_token_metrics(const std::vector<const PreferencePair*>& mb, const model::Batch& b, const model::TokenStats& ts,
                       DpoSums* sums) {
  for (std::size_t k = 0; k < mb.size(); ++k) {
    if (mb[k]->label >= 0) {  // KTO: the completion's tokens (not its KL sequence's), logits by label
      const int seq = static_cast<int>(2 * k);
      for (int t = mb[k]->prompt_len; t < b.length(seq); ++t) {
        const auto i = static_cast<std::size_t>(b.offsets[seq] + t);
        sums->entropy += ts.entropy[i];
        sums->completion_tokens += 1;
        (mb[k]->label == 1 ? sums->logits_chosen : sums->logits_rejected) += ts.mean_logit[i];
        (mb[k]->label == 1 ? sums->chosen_count : sums->rejected_count) += 1;
      }
      continue;
    }
    for (int side = 0; side < 2; ++side) {  // chosen, rejected
      const int seq = static_cast<int>(2 * k) + side;
      for (int t = mb[k]->prompt_len; t < b.length(seq); ++t) {
        const auto i = static_cast<std::size_t>(b.offsets[seq] + t);
        sums->entropy += ts.entropy[i];
        sums->completion_tokens += 1;
        if (side == 0) {
          sums->top1_chosen += ts.top1[i];
          sums->logits_chosen += ts.mean_logit[i];
          sums->chosen_count += 1;
        } else {
          sums->logits_rejected += ts.mean_logit[i];
          sums->rejected_count += 1;
        }
      }
    }
  }
}

double kto_kl_sum(const std::vector<double>& pol, const std::vector<double>& ref) {
  double sum = 0;
  for (std::size_t k = 1; k < pol.size(); k += 2) sum += pol[k] - ref[k];
  return sum;
}

std::vector<double> dpo_sequence_logps(const model::Batch& b, const std::vector<float>& tw, const float* lp) {
  std::vector<double> out(static_cast<std::size_t>(b.B()), 0.0);
  for (int s = 0; s < b.B(); ++s)
    for (int r = b.offsets[s]; r < b.offsets[s + 1]; ++r)
      out[static_cast<std::size_t>(s)] += static_cast<double>(tw[static_cast<std::size_t>(r)]) * lp[r];
  return out;
}

std::vector<double> wpo_weights(const std::vector<const PreferencePair*>& mb, const model::Batch& b, const float* lp,
                                const model::TokenStats& ts) {
  std::vector<double> out;
  for (std::size_t k = 0; k < mb.size(); ++k) {
    double w = 1.0;
    for (int side = 0; side < 2; ++side) {
      const int seq = static_cast<int>(2 * k) + side;
      double sum = 0, n = 0;
      for (int t = mb[k]->prompt_len; t < b.length(seq); ++t) {
        const auto r = static_cast<std::size_t>(b.offsets[seq] + t);
        sum += static_cast<double>(lp[r]) - ts.log_sum_sq[r];
        n += 1;
      }
      w *= std::exp(sum / std::max(1.0, n));
    }
    out.push_back(w);
  }
  return out;
}

void dpo_loss_weights(const DpoLossOptions& o, const std::vector<const PreferencePair*>& mb, const model::Batch& b,
                      const std::vector<float>& tw, const float* lp, const std::vector<double>& pol,
                      const std::vector<double>& ref, double pair_factor, double sft_factor, std::vector<float>* w,
                      DpoSums* sums, const std::vector<double>* pair_weights) {
  w->assign(b.tokens.size(), 0.0f);
  std::vector<DpoPairIn> ins(mb.size());
  for (std::size_t k = 0; k < mb.size(); ++k) {
    DpoPairIn& in = ins[k];
    in.chosen = pol[2 * k];
    in.rejected = pol[2 * k + 1];
    in.ref_chosen = ref[2 * k];
    in.ref_rejected = ref[2 * k + 1];
    in.chosen_tokens = mb[k]->chosen_tokens();
    in.rejected_tokens = mb[k]->rejected_tokens();
    in.label = mb[k]->label;
    MGRL_CHECK((in.label >= 0) == (o.type == DpoLossType::Kto), "dpo: KTO examples need the kto loss, and only they");
  }
  // AOT's loss couples the micro-batch's pairs (trl: each device's micro-batch); the others are per pair. A mix of
  // loss types (dpo.loss_mix) weighs each member's loss and derivatives; the rewards are the same under every member.
  const auto members = dpo_loss_members(o);
  std::vector<DpoLossOptions> member_opts(members.size(), o);
  std::vector<std::vector<DpoPairOut>> batch_outs(members.size());
  for (std::size_t m = 0; m < members.size(); ++m) {
    member_opts[m].type = members[m].first;
    member_opts[m].mix.clear();
    if (dpo_loss_is_batch(members[m].first)) batch_outs[m] = dpo_batch_loss(member_opts[m], ins);
  }
  for (std::size_t k = 0; k < mb.size(); ++k) {
    const DpoPairIn& in = ins[k];
    DpoPairOut out;
    for (std::size_t m = 0; m < members.size(); ++m) {
      const DpoPairOut part = batch_outs[m].empty() ? dpo_pair_loss(member_opts[m], in) : batch_outs[m][k];
      const double w = members[m].second;
      out.loss += w * part.loss;
      out.d_chosen += w * part.d_chosen;
      out.d_rejected += w * part.d_rejected;
      out.reward_chosen = part.reward_chosen;
      out.reward_rejected = part.reward_rejected;
    }
    if (pair_weights) {  // WPO: the pair's loss scaled, a constant (the rewards are not)
      const double pw = (*pair_weights)[k];
      out.loss *= pw, out.d_chosen *= pw, out.d_rejected *= pw;
    }
    if (sums) sums->add(in, out);
    // d loss / d logp_i = (d loss / d sequence log-prob) x the token's weight in it; w_i is its negative. The sft
    // term adds sft_factor on every completion token of the chosen sequence (LD-DPO's weights do not apply to it).
    for (int s = 0; s < 2; ++s) {
      const int seq = static_cast<int>(2 * k) + s;
      const double g = -(s == 0 ? out.d_chosen : out.d_rejected) * pair_factor;
      for (int r = b.offsets[seq]; r < b.offsets[seq + 1]; ++r) {
        const bool completion = r - b.offsets[seq] >= mb[k]->prompt_len;
        double x = g * tw[static_cast<std::size_t>(r)];
        if (s == 0 && completion) {
          x += sft_factor;
          if (sums) sums->sft_nll -= lp[r];
        }
        (*w)[static_cast<std::size_t>(r)] = static_cast<float>(x);
      }
    }
    if (sums) sums->chosen_tokens += mb[k]->chosen_tokens();
  }
}

void DpoTrainer::reference(const std::vector<const PreferencePair*>& mb, const model::Batch& b,
                           const std::vector<float>& tw, std::vector<double>* ref) {
  if (opts_.precompute_ref) {
    ref->clear();
    for (const auto* p : mb) {
      ref->push_back(p->ref_chosen);
      ref->push_back(p->ref_rejected);
    }
    return;
  }
  std::vector<float> lp(b.tokens.size(), 0.0f);
  score_reference(b, lp.data());
  *ref = dpo_sequence_logps(b, tw, lp.data());
}

void DpoTrainer::score_reference(const model::Batch& b, float* lp) {
  if (frozen_)  // the frozen reference (starting weights, or TR-DPO's mix) swapped in for this pass
    frozen_->with_frozen([&] { model_.score(b, lp, true); });
  else
    model_.score(b, lp, false);  // the adapter switched off: the base model, no second copy of the weights
}

void DpoTrainer::precompute(std::vector<PreferencePair>& pairs) {
  // Every rank scores its share of the pairs with the starting weights; rank 0 gathers and broadcasts them all.
  const std::size_t N = pairs.size();
  const std::size_t lo = N * static_cast<std::size_t>(env_.rank()) / static_cast<std::size_t>(env_.size()),
                    hi = N * static_cast<std::size_t>(env_.rank() + 1) / static_cast<std::size_t>(env_.size());
  std::vector<double> mine;
  std::vector<float> lp, tw;
  for (std::size_t s = lo; s < hi; s += static_cast<std::size_t>(opts_.eval_batch)) {
    std::vector<const PreferencePair*> mb;
    for (std::size_t i = s; i < std::min(hi, s + static_cast<std::size_t>(opts_.eval_batch)); ++i) mb.push_back(&pairs[i]);
    const model::Batch b = dpo_batch(mb, opts_.ld_alpha, &tw);
    lp.assign(b.tokens.size(), 0.0f);
    model_.score(b, lp.data(), true);
    const auto seq = dpo_sequence_logps(b, tw, lp.data());
    mine.insert(mine.end(), seq.begin(), seq.end());
  }
  if (model_.definition().sharded()) {  // every pass gathers collectively: as many passes as the busiest rank
    const std::size_t eb = static_cast<std::size_t>(opts_.eval_batch);
    idle_passes(model_, hi - lo, N, env_.size(), eb);
  }
  std::string bytes(mine.size() * sizeof(double), '\0');
  if (!mine.empty()) std::memcpy(&bytes[0], mine.data(), bytes.size());
  std::string all;
  for (const auto& part : env_.gather_to_root(bytes)) all += part;
  all = env_.broadcast(all, 0);
  MGRL_CHECK(all.size() == 2 * N * sizeof(double), "reference log-probs: wrong size after the gather");
  std::vector<double> v(2 * N);
  std::memcpy(v.data(), all.data(), all.size());
  for (std::size_t i = 0; i < N; ++i) {
    pairs[i].ref_chosen = v[2 * i];
    pairs[i].ref_rejected = v[2 * i + 1];
  }
}

double DpoTrainer::train_step(DpoSums* sums) {
  const int ranks = env_.size(), rank = env_.rank();
  const auto global = sampler_.next(state_.cursor, opts_.global_batch);
  const int local_n = opts_.global_batch / ranks, micro = local_n / opts_.grad_accum;
  // Global micro-batch a is the step's slots [a M, (a+1) M), M = micro x ranks, rank r's share the r-th `micro` of
  // them (trl's placement: accelerate gives process p the micro-step's p-th batch). Until 2026-11-29 rank r took the
  // r-th block of the step: with ranks and grad_accum > 1 each global micro-batch was another set of pairs (AOT's
  // sort and KTO's KL estimate over it), and so depended on the rank count.
  const std::size_t M = static_cast<std::size_t>(micro) * static_cast<std::size_t>(ranks);
  const bool kto = opts_.loss.type == DpoLossType::Kto;
  std::int64_t completion_tokens = 0;
  last_tokens_ = 0;
  for (std::size_t a = 0; a < static_cast<std::size_t>(opts_.grad_accum); ++a) {
    if (kto) {  // each example's sequence and its KL sequence (its prompt + its partner's completion, cut)
      for (std::size_t s = a * M; s < (a + 1) * M; ++s) {
        const auto& e = train_[global[s]];
        const auto& other = train_[global[kto_partner(global, a * M, (a + 1) * M, s)]];
        completion_tokens += e.chosen_tokens();
        last_tokens_ += static_cast<std::int64_t>(
            e.chosen.size() + (!opts_.kto_kl ? 1
                                             : std::min<std::size_t>(static_cast<std::size_t>(e.prompt_len) + other.completion.size(),
                                                                     static_cast<std::size_t>(opts_.kto_max_length))));
      }
      continue;
    }
    for (std::size_t s = a * M; s < (a + 1) * M; ++s) {
      const auto& p = train_[global[s]];
      completion_tokens += p.chosen_tokens() + p.rejected_tokens();
      last_tokens_ += static_cast<std::int64_t>(p.chosen.size() + p.rejected.size());
    }
  }
  // The loss is the mean over the global batch's pairs: every rank weighs its pairs by 1 / global pairs, and the
  // gradients are summed over ranks.
  const double inv = 1.0 / static_cast<double>(opts_.global_batch);
  // The sft term's mean is over the chosen completion tokens of the global batch.
  double global_chosen = 0;
  for (std::size_t i : global) global_chosen += train_[i].chosen_tokens();
  const double sft_inv = opts_.loss.sft_weight / std::max(1.0, global_chosen);
  const double scale = opt_->loss_scale(state_);
  sync_->zero();
  std::vector<float> lp, w, tw;
  std::vector<double> ref, pol;
  std::vector<PreferencePair> kto_mb;
  for (int a = 0; a < opts_.grad_accum; ++a) {
    const std::size_t first = static_cast<std::size_t>(a) * M + static_cast<std::size_t>(rank) * static_cast<std::size_t>(micro);
    std::vector<const PreferencePair*> mb;
    if (kto) {
      kto_mb = kto_micro_batch(train_, global, static_cast<std::size_t>(a) * M, static_cast<std::size_t>(a + 1) * M,
                               first, first + static_cast<std::size_t>(micro), opts_.kto_max_length, opts_.kto_kl);
      for (const auto& x : kto_mb) mb.push_back(&x);
    } else {
      for (int i = 0; i < micro; ++i) mb.push_back(&train_[global[first + static_cast<std::size_t>(i)]]);
    }
    const std::uint64_t dropout = model::dropout_seed(opts_.seed, state_.step);
    // KTO: the KL sequences' log-probs (the reference's, then the policy's by a forward without a backward: trl scores
    // them under no_grad) from passes of those sequences alone; the training pass then holds the completions, a
    // placeholder in each KL slot. Until 2026-11-29 one pass held both and the backward ran over the KL tokens too,
    // with weight 0 (a third of a step's work when the two are as long).
    std::vector<double> kl_ref, kl_pol;
    if (kto && opts_.kto_kl) {
      const model::Batch kb = kto_kl_batch(kto_mb, first);
      kl_ref = kto_kl_logps(kb, kto_mb, false, dropout);
      kl_pol = kto_kl_logps(kb, kto_mb, true, dropout);
      for (auto& x : kto_mb) kto_no_kl_sequence(x);
    }
    model::Batch b = dpo_batch(mb, opts_.ld_alpha, &tw);
    reference(mb, b, tw, &ref);  // before the policy's pass, which backward() then needs untouched
    for (std::size_t k = 0; k < kl_ref.size(); ++k) ref[2 * k + 1] = kl_ref[k];
    lp.assign(b.tokens.size(), 0.0f);
    b.seq_keys.clear();  // chosen and rejected of the pair in slot g of the global batch: keys 2g and 2g + 1
    for (int k = 0; k < 2 * micro; ++k) b.seq_keys.push_back(static_cast<std::uint64_t>(2 * first + static_cast<std::size_t>(k)));
    model_.forward(b, lp.data(), true, true, dropout);
    const model::TokenStats stats = model_.token_stats();
    dpo_token_metrics(mb, b, stats, sums);
    pol = dpo_sequence_logps(b, tw, lp.data());
    for (std::size_t k = 0; k < kl_pol.size(); ++k) pol[2 * k + 1] = kl_pol[k];
    const std::vector<double> pw = opts_.loss.use_weighting ? wpo_weights(mb, b, lp.data(), stats) : std::vector<double>();
    DpoLossOptions lo = opts_.loss;
    if (kto) {  // the global micro-batch's KL estimate (trl's: each micro-batch's, gathered); NaN stays NaN (torch's clamp)
      // apo_zero_unpaired: none (trl: 0)
      const double z = opts_.kto_kl ? env_.allreduce_sum(kto_kl_sum(pol, ref)) / static_cast<double>(M) : 0.0;
      lo.kto_kl = std::isnan(z) ? z : std::max(0.0, z);
      if (rank == 0) sums->kto_kl += lo.kto_kl, sums->kto_kl_count += 1;
    }
    dpo_loss_weights(lo, mb, b, tw, lp.data(), pol, ref, inv * scale, sft_inv * scale, &w, sums,
                     pw.empty() ? nullptr : &pw);
    model_.backward(w.data(), sync_->hook(a + 1 == opts_.grad_accum));
  }
  const double norm = agreed_norm(env_, sync_->finish(scale));  // identical on every rank
  sums->allreduce(env_);
  const double loss = sums->total_loss(opts_.loss.sft_weight);
  state_.tokens_seen += completion_tokens;
  model_.ops().phase_begin(kernels::Phase::Optimizer);
  last_outcome_ = opt_->step(state_, norm, loss);  // a non-finite step is skipped on every rank together
  // TR-DPO: trl's SyncRefModelCallback at the end of every ref_model_sync_steps-th step (a skipped one too)
  if (opts_.ref_sync.due(state_.step)) frozen_->mix_in(opts_.ref_sync.alpha);
  model_.ops().phase_end(kernels::Phase::Optimizer);
  last_norm_ = norm;
  return loss;
}

model::Batch kto_kl_batch(const std::vector<PreferencePair>& mb, std::size_t first) {
  model::Batch kb;
  for (std::size_t k = 0; k < mb.size(); ++k) {
    kb.add(mb[k].rejected);
    kb.scored_from.push_back(mb[k].prompt_len);
    kb.seq_keys.push_back(static_cast<std::uint64_t>(2 * (first + k) + 1));  // the KL sequence's dropout key, as before
  }
  return kb;
}

std::vector<double> DpoTrainer::kto_kl_logps(const model::Batch& kb, const std::vector<PreferencePair>& mb, bool policy,
                                             std::uint64_t dropout) {
  std::vector<float> lp(kb.tokens.size(), 0.0f);
  if (policy)
    model_.forward(kb, lp.data(), true, true, dropout);  // the training mode (LoRA dropout, when on), no backward
  else
    score_reference(kb, lp.data());
  std::vector<double> out(mb.size(), 0.0);
  for (std::size_t k = 0; k < mb.size(); ++k)
    for (int t = mb[k].prompt_len; t < kb.length(static_cast<int>(k)); ++t)
      out[k] += lp[static_cast<std::size_t>(kb.offsets[k] + t)];
  return out;
}

DpoSums DpoTrainer::evaluate() {
  DpoSums s;
  if (eval_.empty()) return s;
  const PhasesPaused paused(model_.ops());
  const std::size_t N = eval_.size();
  const std::size_t lo = N * static_cast<std::size_t>(env_.rank()) / static_cast<std::size_t>(env_.size()),
                    hi = N * static_cast<std::size_t>(env_.rank() + 1) / static_cast<std::size_t>(env_.size());
  std::vector<float> lp, tw, w;
  std::vector<double> ref, pol;
  // KTO's losses need the KL estimate of the whole held-out set (every rank's): its examples' sequence log-probs wait
  // for it (DpoPairIn, a few numbers each).
  // Its KL sequences: the training pairing (kto_example) over fixed blocks of the held-out file, one global
  // micro-batch's worth of examples each, so that they do not depend on the ranks or eval.batch_size.
  const bool kto = opts_.loss.type == DpoLossType::Kto;
  const std::size_t block = static_cast<std::size_t>(opts_.global_batch / opts_.grad_accum);
  std::vector<std::size_t> order;
  if (kto)
    for (std::size_t i = 0; i < N; ++i) order.push_back(i);
  std::vector<DpoPairIn> held;
  std::vector<PreferencePair> kto_mb;
  double kl_sum = 0;
  for (std::size_t i0 = lo; i0 < hi; i0 += static_cast<std::size_t>(opts_.eval_batch)) {
    std::vector<const PreferencePair*> mb;
    const std::size_t i1 = std::min(hi, i0 + static_cast<std::size_t>(opts_.eval_batch));
    kto_mb.clear();
    for (std::size_t i = i0; i < i1; ++i)
      if (kto)
        kto_mb.push_back(kto_example(eval_, order, i / block * block, std::min(N, (i / block + 1) * block), i,
                                     opts_.kto_max_length, opts_.kto_kl));
      else
        mb.push_back(&eval_[i]);
    for (const auto& x : kto_mb) mb.push_back(&x);
    const model::Batch b = dpo_batch(mb, opts_.ld_alpha, &tw);
    reference(mb, b, tw, &ref);
    lp.assign(b.tokens.size(), 0.0f);
    model_.score(b, lp.data(), true);
    pol = dpo_sequence_logps(b, tw, lp.data());
    if (!kto) {
      const std::vector<double> pw =
          opts_.loss.use_weighting ? wpo_weights(mb, b, lp.data(), model_.token_stats(true)) : std::vector<double>();
      dpo_loss_weights(opts_.loss, mb, b, tw, lp.data(), pol, ref, 0.0, 0.0, &w, &s, pw.empty() ? nullptr : &pw);
      continue;
    }
    kl_sum += kto_kl_sum(pol, ref);
    for (std::size_t k = 0; k < mb.size(); ++k) {
      DpoPairIn in;
      in.chosen = pol[2 * k], in.rejected = pol[2 * k + 1];
      in.ref_chosen = ref[2 * k], in.ref_rejected = ref[2 * k + 1];
      in.chosen_tokens = mb[k]->chosen_tokens(), in.rejected_tokens = mb[k]->rejected_tokens();
      in.label = mb[k]->label;
      held.push_back(in);
    }
  }
  if (model_.definition().sharded()) {  // every pass gathers collectively: the passes of the busiest rank
    const std::size_t eb = static_cast<std::size_t>(opts_.eval_batch);
    idle_passes(model_, hi - lo, N, env_.size(), eb, opts_.precompute_ref ? 1 : 2);  // and reference()'s pass
  }
  if (kto) {
    DpoLossOptions o = opts_.loss;
    const double z = opts_.kto_kl ? env_.allreduce_sum(kl_sum) / static_cast<double>(N) : 0.0;
    o.kto_kl = std::isnan(z) ? z : std::max(0.0, z);
    for (const DpoPairIn& in : held) s.add(in, dpo_pair_loss(o, in));
    if (env_.rank() == 0) s.kto_kl = o.kto_kl, s.kto_kl_count = 1;
  }
  s.allreduce(env_);
  return s;
}

DpoResult DpoTrainer::run() {
  DpoResult res;
  const auto t0 = Clock::now();
  // The reference from the starting weights, before a resume replaces them: no copy of the weights is kept.
  if (opts_.precompute_ref) {
    const PhasesPaused paused(model_.ops());
    precompute(train_);
    precompute(eval_);
  }
  const std::string resumed = ckpt_->resume(state_, nullptr);
  const std::int64_t end = opts_.stop_at_step > 0 ? std::min(opts_.stop_at_step, opts_.max_steps) : opts_.max_steps;
  if (nothing_to_train(resumed, state_.step, end)) {
    res.steps = state_.step;
    return res;
  }
  RunLog rlog(env_, opts_.log_dir, resumed.empty() ? -1 : state_.step, ckpt_->log_position_to_trim());
  const auto log_attached = ckpt_->attach_log([&rlog] { return rlog.position(); });
  const bool rank0 = rlog.rank0();
  auto emit = [&](const nlohmann::json& j) { rlog.emit(j, state_.step); };
  const std::int64_t first = state_.step;
  // The log window (the steps since the last line): its steps' seconds (not the evaluations' and checkpoints' between
  // them, which the wall clock counted until 2026-11-28), tokens and sums (the line showed its last step's).
  double window_seconds = 0;
  std::int64_t window_tokens = 0;
  DpoSums window_sums;
  double step_seconds = 0, run_tokens = 0;
  model_.ops().phase_reset();
  stop::arm();
  auto eval_line = [&](const DpoSums& s, const char* what) {
    const double n = std::max(1.0, s.pairs);
    char line[200];
    if (s.kto()) {  // each side's mean reward, "-" for a side without examples
      const auto side = [](double sum, double n) {
        char v[32];
        if (n > 0) std::snprintf(v, sizeof v, "%.4f", sum / n);
        else std::snprintf(v, sizeof v, "-");
        return std::string(v);
      };
      std::snprintf(line, sizeof(line), "%s step %lld | loss %.4f | kl %.4f | rewards desirable %s, undesirable %s",
                    what, static_cast<long long>(state_.step), s.total_loss(0.0), s.kto_kl / std::max(1.0, s.kto_kl_count),
                    side(s.reward_chosen, s.kto_desirable).c_str(), side(s.reward_rejected, s.kto_undesirable).c_str());
    } else {
      std::snprintf(line, sizeof(line),
                    "%s step %lld | loss %.4f | preference accuracy %.1f%% | margin %.4f | chosen more likely %.1f%%", what,
                    static_cast<long long>(state_.step), s.total_loss(opts_.loss.sft_weight), 100.0 * s.accuracy / n,
                    s.margin / n, 100.0 * s.logp_accuracy / n);
    }
    rlog.line(line);
    nlohmann::json j = named(s, "eval_", opts_.loss.sft_weight);
    j["step"] = state_.step;
    emit(j);
  };
  // Greedy exact-match accuracy of the held-out prompts against the chosen completions (eval.accuracy).
  auto greedy = [&](const char* what) {
    if (!opts_.accuracy || eval_.empty()) return -1.0;
    std::vector<Example> ex;
    for (const auto& p : eval_) {
      Example e;
      e.tokens.assign(p.chosen.begin(), p.chosen.begin() + p.prompt_len);
      e.prompt_len = p.prompt_len;
      e.completion = p.chosen_text;
      ex.push_back(std::move(e));
    }
    const double acc = opts_.accuracy(ex);
    char line[200];
    std::snprintf(line, sizeof(line), "%s step %lld | held-out accuracy %.1f%% (greedy completions equal to the chosen one)",
                  what, static_cast<long long>(state_.step), 100.0 * acc);
    rlog.line(line);
    emit({{"step", state_.step}, {"eval_accuracy", acc}});
    return acc;
  };
  // A fresh run starts with the held-out figures of the starting policy (its rewards are 0: it is the reference).
  if (first == 0 && !eval_.empty() && state_.step < end) {
    eval_line(evaluate(), "eval before");
    greedy("eval before");
  }
  while (state_.step < end) {
    const double lr = opt_->lr(state_);
    const auto step_t0 = Clock::now();
    DpoSums sums;
    const double loss = train_step(&sums);
    const double dt_step = seconds_since(step_t0);
    step_seconds += dt_step;
    window_seconds += dt_step;
    if (std::isfinite(loss)) window_sums.merge(sums);  // a skipped step's non-finite figures are left out (as SFT)
    window_tokens += last_tokens_;
    run_tokens += static_cast<double>(last_tokens_);
    res.final_loss = loss;
    const bool last = state_.step == end || stop_agreed(env_, state_.step, ckpt_->enabled());
    if (rank0 && (state_.step % std::max(1, opts_.log_every) == 0 || last)) {
      const double dt = window_seconds;
      const double tps = dt > 0 ? static_cast<double>(window_tokens) / dt : 0;
      const DpoSums& w = window_sums.pairs > 0 ? window_sums : sums;  // none finite: the last step's
      const double n = std::max(1.0, w.pairs);
      char line[320];
      int k = w.kto() ? std::snprintf(line, sizeof(line),
                                      "step %lld/%lld | loss %.4f | kl %.4f | lr %.2e | grad norm %.3f | %.0f tok/s",
                                      static_cast<long long>(state_.step), static_cast<long long>(opts_.max_steps),
                                      w.total_loss(0.0), w.kto_kl / std::max(1.0, w.kto_kl_count), lr, last_norm_, tps)
                      : std::snprintf(line, sizeof(line),
                            "step %lld/%lld | loss %.4f | accuracy %.2f | margin %.4f | lr %.2e | grad norm %.3f | %.0f tok/s",
                            static_cast<long long>(state_.step), static_cast<long long>(opts_.max_steps),
                            w.total_loss(opts_.loss.sft_weight), w.accuracy / n, w.margin / n, lr, last_norm_, tps);
      k += shard_text(line + k, sizeof(line) - static_cast<std::size_t>(k), model_.definition());
      scaler_text(line + k, sizeof(line) - static_cast<std::size_t>(k), state_, opt_->scaling());
      rlog.line(line);
      nlohmann::json j = named(w, "", opts_.loss.sft_weight);
      j["step"] = state_.step;
      j["lr"] = lr;
      j["grad_norm"] = last_norm_;
      j["tokens_per_second"] = tps;
      j["skipped_steps"] = state_.skipped_steps;
      shard_record(j, model_.definition());
      if (opt_->scaling()) scaler_record(j, state_, last_outcome_);
      emit(j);
      window_seconds = 0;
      window_tokens = 0;
      window_sums = DpoSums();
    }
    rlog.progress(state_.step, first, opts_.max_steps, seconds_since(t0));
    if (opts_.eval_every > 0 && state_.step % opts_.eval_every == 0 && !last && !eval_.empty()) {
      const DpoSums e = evaluate();
      eval_line(e, "eval");
      // The checkpoints' best held-out loss so far (as SFT's; it stayed inf in DPO's until 2026-11-28).
      const double el = e.total_loss(opts_.loss.sft_weight);
      if (std::isfinite(el)) state_.best_eval_loss = std::min(state_.best_eval_loss, el);
    }
    guard_->after_step(last_outcome_, state_.step, ckpt_->last_checkpoint());
    if (ckpt_->due(state_.step) && !last) {
      if (guard_->diverging())
        rlog.line("step " + std::to_string(state_.step) +
                  ": no checkpoint (the step's loss or gradient norm was not finite; it changed nothing)");
      else
        ckpt_->save(state_);
    }
    if (last) break;
  }
  rlog.end_progress();
  const std::string phases = phase_table(model_.ops().phase_seconds(), state_.step - first, step_seconds);
  if (rank0 && state_.step > first) std::fputs(phases.c_str(), stdout);
  const auto phase_rec = phase_record(env_, model_.ops().phase_seconds(), state_.step - first, step_seconds, run_tokens);
  if (state_.step > first) emit({{"step", state_.step}, {"phases", phase_rec}});
  // The final checkpoint before the final evaluation (the work is kept first, as in SFT and GRPO).
  if (ckpt_->enabled() && state_.step > first) ckpt_->save(state_);
  if (!stop::stopped_early() && !eval_.empty()) {
    const DpoSums s = evaluate();
    eval_line(s, "held-out");
    res.eval_loss = s.total_loss(opts_.loss.sft_weight);
    res.eval_preference_accuracy = s.accuracy / std::max(1.0, s.pairs);
    res.eval_accuracy = greedy("held-out");
  }
  res.steps = state_.step;
  res.skipped = state_.skipped_steps;
  res.seconds = seconds_since(t0);
  rlog.flush();
  if (rank0 && !opts_.log_dir.empty()) {
    std::ostringstream s;  // job_summary.txt, written whole (RunLog::write_summary)
    const bool kto = opts_.loss.type == DpoLossType::Kto;
    s << "mgrl " << build_info().version << (kto ? " kto (" : " dpo (")
      << (kto && !opts_.kto_kl ? std::string("apo_zero_unpaired") : dpo_loss_label(opts_.loss)) << ", beta "
      << opts_.loss.beta << ")\n"
      << "ranks: " << env_.size() << "\n"
      << "wall time: " << human_time(res.seconds) << " (" << res.seconds << " s)\n"
      << "steps: " << res.steps << " (skipped: " << res.skipped << ")\n"
      << scaler_summary(state_, opt_->scaling())
      << "final train loss: " << res.final_loss << "\n";
    if (res.eval_loss >= 0) {
      s << "held-out loss: " << res.eval_loss << "\n";
      if (!kto) s << "held-out preference accuracy: " << res.eval_preference_accuracy << "\n";
    }
    if (res.eval_accuracy >= 0) s << "held-out accuracy: " << res.eval_accuracy << "\n";
    if (state_.step > first) s << "rank 0 " << phases;
    rlog.write_summary(s.str());
  }
  return res;
}

}  // namespace mgrl::train
