// ppo.cpp: the PPO training loop: rollouts, scoring, GAE, epochs of clipped updates over mini-batches, rollout files,
// metrics and checkpoints at update boundaries.
#include "rl/ppo.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/stop.h"
#include "io/hf_config.h"
#include "rl/generator.h"
#include "rl/rollout.h"
#include "train/run_log.h"
#include "train/stop_agreement.h"

namespace mgrl::rl {

PpoTrainer::PpoTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& model, const io::Tokenizer& tok,
                       const Rewards& rewards, std::vector<PromptRow> train, std::vector<PromptRow> eval,
                       PpoTrainOptions opts)
    : env_(env), comm_(comm), model_(model), tok_(tok), rewards_(rewards), train_(std::move(train)),
      eval_(std::move(eval)), opts_(std::move(opts)), sampler_(train_.size(), opts_.seed, opts_.shuffle) {
  const int ranks = env_.size();
  if (opts_.batch_prompts % ranks != 0)
    throw UserError("train.batch_size (" + std::to_string(opts_.batch_prompts) +
                    " prompts) must be divisible by the number of ranks (" + std::to_string(ranks) + ")");
  if (opts_.batch_prompts % opts_.num_mini_batches != 0)
    throw UserError("ppo.num_mini_batches (" + std::to_string(opts_.num_mini_batches) +
                    ") must divide train.batch_size (" + std::to_string(opts_.batch_prompts) + ")");
  const auto spu = static_cast<std::int64_t>(steps_per_update());
  if (opts_.max_steps % spu != 0)
    throw UserError("train.max_steps (" + std::to_string(opts_.max_steps) + ") must be a multiple of " +
                    "ppo.num_ppo_epochs x ppo.num_mini_batches (" + std::to_string(spu) +
                    " optimizer steps per rollout batch)");
  if (opts_.stop_at_step % spu != 0)
    throw UserError("train.stop_at_step (" + std::to_string(opts_.stop_at_step) + ") must be a multiple of " +
                    std::to_string(spu) + " (checkpoints fall between rollout batches)");
  if (rewards_.size() == 0) throw UserError("ppo needs at least one [[reward]] table");
  // The reference is the model with the adapter switched off: with full fine-tuning that is the policy itself.
  if (model_.base_grads() != nullptr && opts_.ppo.kl_coef > 0)
    throw UserError("ppo's reference policy is the model with the LoRA adapter switched off: with "
                    "train.full_finetune = true there is none, so set ppo.kl_coef = 0 (or train with LoRA)");
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  if (opts_.kl_target > 0 && !(opts_.ppo.kl_coef > 0))
    throw UserError("ppo.kl_target (" + num(opts_.kl_target) + ") adapts ppo.kl_coef by factors, so it "
                    "needs a starting ppo.kl_coef > 0");
  // A horizon below the batch would let one update move the coefficient by more than 20%, and below a fifth of it
  // make the coefficient negative (trl 0.x allowed both).
  if (opts_.kl_target > 0 && opts_.kl_horizon < opts_.batch_prompts)
    throw UserError("ppo.kl_horizon (" + num(opts_.kl_horizon) + ") must be at least train.batch_size (" +
                    std::to_string(opts_.batch_prompts) + " responses): one update may move ppo.kl_coef by at most "
                    "20%");
  kl_coef_ = opts_.ppo.kl_coef;
  tr_ = train::trainable_of(model_, model_.base_grads() != nullptr);
  opt_ = std::make_unique<train::Optimizer>(model_.ops(), tr_, opts_.optim);
  sync_ = std::make_unique<train::GradSync>(comm_, model_, tr_);
  ckpt_ = std::make_unique<train::Checkpointer>(
      env_, model_.ops(), *opt_, opts_.checkpoint,
      train::model_identity(io::architecture_name(model_.config().arch), tr_.tensors) + " + ppo value head");
  guard_ = std::make_unique<train::DivergenceGuard>(env_, opts_.max_nonfinite_steps, opts_.optim.scaling.enabled);
  // A training pass at its largest (the responses of one mini-batch that this rank holds: at worst all of them,
  // each of the longest prompt + ppo.response_length) must fit the memory the rank has: refused at the start
  // naming the keys, rather than failing at the update whose mini-batch first falls that way (as GRPO and SFT).
  {
    std::size_t longest = 0;
    for (const auto& p : train_) longest = std::max(longest, p.tokens.size());
    const int most = std::min(opts_.batch_prompts / ranks, opts_.batch_prompts / opts_.num_mini_batches);
    const long long worst = static_cast<long long>(most) *
                            static_cast<long long>(longest + static_cast<std::size_t>(opts_.ppo.response_length));
    train::refuse_activations_beyond_memory(
        env_, model_, worst,
        "a training mini-batch of up to " + std::to_string(most) +
            " responses on a rank (train.batch_size / ppo.num_mini_batches, at most train.batch_size / ranks), each "
            "up to " + std::to_string(longest) + " prompt tokens + ppo.response_length = " +
            std::to_string(opts_.ppo.response_length),
        "lower train.batch_size or ppo.response_length, raise ppo.num_mini_batches");
  }
  vh_ = std::make_unique<ValueHead>(static_cast<int>(model_.config().hidden_size));
  vh_buf_ = static_cast<float*>(model_.ops().alloc(vh_->params().size() * sizeof(float)));
  state_.rank_rng.assign(static_cast<std::size_t>(ranks), 0);
  opt_->start(state_);
  accuracy_fn_ = rewards_.accuracy_index(opts_.accuracy_reward);  // the reward that decides correctness in evaluation
}

PpoEval PpoTrainer::evaluate() {
  PpoEval res;
  if (eval_.empty()) return res;
  const train::PhasesPaused paused(model_.ops());
  const std::size_t N = eval_.size();
  const std::size_t lo = N * static_cast<std::size_t>(env_.rank()) / static_cast<std::size_t>(env_.size());
  const std::size_t hi = N * static_cast<std::size_t>(env_.rank() + 1) / static_cast<std::size_t>(env_.size());
  res.prompts = N;
  double reward = 0;
  long long right = 0;
  std::vector<Prompt> prompts;
  for (std::size_t i = lo; i < hi; ++i) prompts.push_back({static_cast<std::int64_t>(i), eval_[i].tokens});
  // On a sharded base every generation step gathers the layers collectively: a rank with fewer held-out prompts (or
  // none: more ranks than prompts) keeps stepping until every rank is done.
  const bool lockstep = model_.definition().sharded();
  if (!prompts.empty() || lockstep) {
    GenerationOptions g;
    g.max_new_tokens = opts_.eval_max_new_tokens;
    g.sampling.temperature = 0;  // greedy
    g.eos_ids = stop_ids(model_.config(), &tok_);
    opts_.cache.apply(g);
    if (lockstep) g.lockstep = lockstep_over(env_);
    Generator gen(model_, g, [&](const std::vector<std::int32_t>& ids) { return tok_.decode(ids, true); });
    std::vector<RewardSample> samples;
    for (const auto& c : gen.generate(prompts))
      samples.push_back(reward_sample(eval_[static_cast<std::size_t>(c.prompt_index)], c.text,
                                      static_cast<int>(c.tokens.size()), c.finish_reason));
    for (const auto& v : rewards_.score(samples, opts_.log_dir.empty() ? "." : opts_.log_dir, opts_.threads)) {
      const double t = rewards_.total(v);
      if (std::isnan(t))
        throw UserError("no [[reward]] gave a value (each printed null) for a held-out completion: ppo needs a score "
                        "for every completion");
      reward += t;
      right += accuracy_fn_ >= 0 && v[static_cast<std::size_t>(accuracy_fn_)] >= 1.0 - 1e-9 ? 1 : 0;
    }
  }
  wait_for_rewards(env_, rewards_, (N + static_cast<std::size_t>(env_.size()) - 1) / static_cast<std::size_t>(env_.size()),
                   opts_.threads);
  res.mean_reward = env_.allreduce_sum(reward) / static_cast<double>(N);
  if (accuracy_fn_ >= 0) res.accuracy = static_cast<double>(env_.allreduce_sum(right)) / static_cast<double>(N);
  return res;
}

PpoTrainer::~PpoTrainer() {
  if (vh_buf_) model_.ops().release(vh_buf_);
}

void PpoTrainer::update(nlohmann::json* metrics) {
  const int ranks = env_.size(), rank = env_.rank(), P = opts_.batch_prompts, per = P / ranks;
  const std::size_t lo = static_cast<std::size_t>(rank) * static_cast<std::size_t>(per);
  const std::int64_t first_step = state_.step, update_index = state_.step / steps_per_update();
  const auto indices = sampler_.next(state_.cursor, P);
  const float temperature = opts_.sampling.temperature;
  PpoOptions o = opts_.ppo;
  o.kl_coef = kl_coef_;

  // 1. One response per prompt of this rank's block; its draws depend on the seed, the update and the prompt's
  //    position in the global batch only.
  std::vector<PpoSample> local;
  std::vector<std::int64_t> prompt_index;
  std::vector<std::string> finish;
  std::vector<std::vector<float>> sample_logps;
  {
    GenerationOptions g;
    g.max_new_tokens = o.response_length;
    g.num_generations = 1;
    g.sampling = opts_.sampling;
    g.seed = random_bits(opts_.seed ^ 0x70706f726f6c6c73ull, static_cast<std::uint64_t>(update_index));
    g.eos_ids = stop_ids(model_.config(), &tok_);
    opts_.cache.apply(g);
    g.use_lora = true;
    // A sharded base: the ranks' responses end at different steps, so the ranks agree on every generation step.
    if (model_.definition().sharded()) g.lockstep = lockstep_over(env_);
    std::vector<Prompt> prompts;
    for (std::size_t j = lo; j < lo + static_cast<std::size_t>(per); ++j)
      prompts.push_back({static_cast<std::int64_t>(j), train_[indices[j]].tokens});
    Generator gen(model_, g, [&](const std::vector<std::int32_t>& ids) { return tok_.decode(ids, true); });
    for (auto& c : gen.generate(prompts)) {
      const PromptRow& p = train_[indices[static_cast<std::size_t>(c.prompt_index)]];
      MGRL_CHECK(!c.tokens.empty(), "ppo: an empty response");
      PpoSample s;
      s.slot = c.prompt_index;  // its position in the global batch
      s.prompt = p.tokens;
      s.response = std::move(c.tokens);
      s.seq.has_eos = c.finish_reason == "eos";
      prompt_index.push_back(p.index);
      finish.push_back(c.finish_reason);
      sample_logps.push_back(std::move(c.logprobs));
      local.push_back(std::move(s));
    }
    MGRL_CHECK(local.size() == static_cast<std::size_t>(per), "ppo: responses lost");
  }
  // 2. Scores from the reward functions.
  std::vector<std::vector<double>> rewards_fn;
  {
    std::vector<RewardSample> samples;
    for (std::size_t i = 0; i < local.size(); ++i)
      samples.push_back(reward_sample(train_[indices[lo + i]], tok_.decode(local[i].response, true),
                                      static_cast<int>(local[i].response.size()), finish[i]));
    rewards_fn = rewards_.score(samples, opts_.log_dir.empty() ? "." : opts_.log_dir, opts_.threads);
    for (std::size_t i = 0; i < local.size(); ++i) {
      local[i].seq.score = rewards_.total(rewards_fn[i]);
      if (std::isnan(local[i].seq.score))  // PPO's GAE needs a score at every response's end (GRPO gives advantage 0)
        throw UserError("no [[reward]] gave a value (each printed null) for a completion of prompt " +
                        std::to_string(indices[lo + i]) + ": ppo needs a score for every completion");
    }
  }
  wait_for_rewards(env_, rewards_, static_cast<std::size_t>(per), opts_.threads);
  // 3. The rollout's log-probs (policy, reference) and values; rewards, GAE and whitening over the global batch.
  ppo_score(model_, *vh_, temperature, o.response_length, per, local);
  {
    std::vector<PpoSequence> seqs;
    for (auto& s : local) seqs.push_back(std::move(s.seq));
    ppo_advantages(o, seqs, [&](double* v, int n) {
      for (int i = 0; i < n; ++i) v[i] = env_.allreduce_sum(v[i]);
    });
    for (std::size_t i = 0; i < local.size(); ++i) local[i].seq = std::move(seqs[i]);
  }
  say_if_no_signal(local, finish, first_step + 1);
  PpoRolloutSums rs;
  {
    std::vector<PpoSequence> seqs;
    for (const auto& s : local) seqs.push_back(s.seq);
    rs = ppo_rollout_sums(o, seqs);
    for (int i = 0; i < PpoRolloutSums::kCount; ++i) rs.data()[i] = env_.allreduce_sum(rs.data()[i]);
  }
  write_rollouts(local, prompt_index, rewards_fn, finish, first_step + 1);  // collective

  // 4. Epochs over the global batch in an order every rank draws alike; each rank trains the sequences of a
  //    mini-batch it holds (possibly none: a zero-weight pass, as the gradient reduction is collective).
  const train::Sampler order(static_cast<std::size_t>(P),
                             random_bits(opts_.seed ^ 0x70706f65706f6368ull, static_cast<std::uint64_t>(update_index)));
  const int MB = P / opts_.num_mini_batches;
  std::vector<PpoLoss> losses;
  double last_norm = 0, last_loss = 0, last_lr = 0;
  const double max_norm = opts_.optim.max_grad_norm;
  for (int e = 0; e < opts_.num_ppo_epochs; ++e) {
    const auto perm = order.order(e);
    for (int mb = 0; mb < opts_.num_mini_batches; ++mb) {
      std::vector<std::size_t> idx;
      double counts[2] = {0, 0};
      for (int k = mb * MB; k < (mb + 1) * MB; ++k) {
        const std::size_t gpos = perm[static_cast<std::size_t>(k)];
        if (gpos < lo || gpos >= lo + static_cast<std::size_t>(per)) continue;
        idx.push_back(gpos - lo);
        counts[0] += local[gpos - lo].seq.n();
        counts[1] += static_cast<double>(local[gpos - lo].seq.values.size());
      }
      for (double& c : counts) c = env_.allreduce_sum(c);
      const double scale = opt_->loss_scale(state_);
      sync_->zero();
      vh_->zero_grad();
      const std::uint64_t seed = model::dropout_seed(opts_.seed, state_.step);
      PpoTerms t = ppo_minibatch(model_, *vh_, o, temperature, local, idx, counts[0], counts[1], scale, true, seed,
                                 sync_->hook(true));
      const double norm = train::agreed_norm(env_, sync_->finish(scale));
      // The value head's gradients, summed over ranks (f32 through the backend's buffer, as the LoRA gradients).
      auto& vg = vh_->grads();
      {
        std::vector<float> f(vg.begin(), vg.end());
        model_.ops().upload(vh_buf_, f.data(), f.size() * sizeof(float));
        comm_.allreduce_sum(vh_buf_, f.size(), DType::F32, sync_->stream());
        model_.ops().download(f.data(), vh_buf_, f.size() * sizeof(float));
        for (std::size_t i = 0; i < f.size(); ++i) vg[i] = f[i];
      }
      const double vnorm = std::sqrt(vh_->grad_norm_squared()) / scale;
      const double total = std::sqrt(norm * norm + vnorm * vnorm);  // one clip over policy and value head (trl)
      for (int i = 0; i < PpoTerms::kCount; ++i) t.data()[i] = env_.allreduce_sum(t.data()[i]);
      const PpoLoss l = ppo_loss(o, t);
      losses.push_back(l);
      kernels::Ops::AdamW hp = opts_.optim.adamw;
      // value_lr follows the schedule by its multiplier: value_lr * lr / train.lr was 0/0 = NaN at train.lr = 0 (a
      // value-head warm-up), every loss NaN and exit 0, until 2026-11-28.
      hp.lr = static_cast<float>(opts_.value_lr > 0 ? opts_.value_lr * opt_->lr_factor(state_) : opt_->lr(state_));
      hp.step = state_.step + 1 - state_.skipped_steps;
      const double clip = max_norm > 0 && total > max_norm ? max_norm / total : 1.0;
      hp.grad_scale = static_cast<float>(clip / scale);
      last_lr = opt_->lr(state_);  // this optimizer step's
      const train::StepOutcome out = opt_->step(state_, total, l.loss);
      if (out == train::StepOutcome::Updated) vh_->step(hp);
      guard_->after_step(out, state_.step, ckpt_->last_checkpoint());
      last_norm = total;
      last_loss = l.loss;
    }
  }
  for (const auto& [k, v] : ppo_metrics(rs, losses)) (*metrics)[k] = v;
  (*metrics)["objective/kl_coef"] = kl_coef_;  // the coefficient of this batch's rewards (trl 0.x logs it so)
  // The adaptive controller after the update, as trl 0.x's step(): objective/kl of the global batch (every rank has
  // the same reduced sums) and the global batch's response count.
  if (opts_.kl_target > 0)
    kl_coef_ = ppo_adaptive_kl_coef(kl_coef_, rs.kl / rs.sequences, opts_.kl_target, opts_.kl_horizon, rs.sequences);
  (*metrics)["loss"] = last_loss;
  (*metrics)["grad_norm"] = last_norm;
  (*metrics)["lr"] = last_lr;  // of the update's last optimizer step (until 2026-11-28: the next update's)
  (*metrics)["skipped_steps"] = state_.skipped_steps;
  double len = 0;
  for (const auto& s : local) len += static_cast<double>(s.response.size());
  (*metrics)["completions/mean_length"] = env_.allreduce_sum(len) / P;
  const auto& names = rewards_.names();
  for (std::size_t f = 0; f < names.size(); ++f) {
    double sum = 0;
    for (const auto& r : rewards_fn) sum += r[f];
    (*metrics)["rewards/" + names[f] + "/mean"] = env_.allreduce_sum(sum) / P;
  }
}

// An update whose responses all scored alike (the score after missing_eos_penalty, what the rewards add to the last
// token) teaches the policy nothing about the task: its advantages come from the KL penalty and the value head's
// errors alone. Five in a row, once a run, are said with the likely cause (as GRPO's say_if_no_signal): until
// 2026-11-28 such a run went on to exit 0 with a steady score on every line. Every rank computes the same figures.
void PpoTrainer::say_if_no_signal(const std::vector<PpoSample>& local, const std::vector<std::string>& finish,
                                  std::int64_t first_step) {
  constexpr int kUpdates = 5;
  double hi = -std::numeric_limits<double>::infinity(), lo = std::numeric_limits<double>::infinity(), cut = 0;
  for (std::size_t i = 0; i < local.size(); ++i) {
    hi = std::max(hi, local[i].seq.penalised_score);
    lo = std::min(lo, local[i].seq.penalised_score);
    cut += finish[i] == "length" ? 1 : 0;
  }
  hi = env_.allreduce_max(hi);
  lo = -env_.allreduce_max(-lo);
  cut = env_.allreduce_sum(cut);
  const double n = env_.allreduce_sum(static_cast<double>(local.size()));
  if (!(hi > lo) && std::isfinite(hi)) {
    if (no_signal_updates_++ == 0) no_signal_since_ = first_step;
  } else {
    no_signal_updates_ = 0;
  }
  if (no_signal_updates_ < kUpdates || no_signal_said_) return;
  no_signal_said_ = true;
  char score[32];
  std::snprintf(score, sizeof score, "%.4g", hi);
  log::warn_once("no learning signal from the rewards in " + std::to_string(kUpdates) + " updates in a row (from step " +
                 std::to_string(no_signal_since_) + "): every response scored " + score +
                 (cut == n ? " (and every one reached ppo.response_length, " + std::to_string(opts_.ppo.response_length) +
                                 " tokens, without ending: if the answer comes later, raise it)"
                           : std::string()) +
                 ": the rewards tell no response from another, and PPO learns from their differences");
}

void PpoTrainer::write_rollouts(const std::vector<PpoSample>& local, const std::vector<std::int64_t>& prompt_index,
                                const std::vector<std::vector<double>>& rewards_fn,
                                const std::vector<std::string>& finish, std::int64_t step) {
  // The update trains steps [step, its last]: written when they hold a multiple of rollouts.every_steps, the first
  // step or the last (until 2026-11-28 only an update that began on a multiple).
  const std::int64_t last_of = step + steps_per_update() - 1;
  const bool due = !opts_.log_dir.empty() && opts_.rollouts_every > 0 &&
                   (step == 1 || last_of >= opts_.max_steps || last_of / opts_.rollouts_every != (step - 1) / opts_.rollouts_every);
  if (!due) return;
  nlohmann::json js = nlohmann::json::array();
  for (std::size_t i = 0; i < local.size(); ++i) {
    const PpoSequence& q = local[i].seq;
    std::vector<float> adv(q.advantages.begin(), q.advantages.end()), val(q.values.begin(), q.values.end()),
        ret(q.returns.begin(), q.returns.end()), ref(q.ref.begin(), q.ref.end()), lp(q.logp.begin(), q.logp.end());
    js.push_back({prompt_index[i], local[i].prompt, local[i].response, finish[i], nums(rewards_fn[i]), num(q.score),
                  nums(adv), nums(val), nums(ret), nums(ref), nums(lp)});
  }
  const auto parts = env_.gather_to_root(js.dump());
  if (env_.rank() != 0) return;
  std::vector<Rollout> all;
  for (const auto& p : parts)
    for (const auto& x : nlohmann::json::parse(p)) {
      Rollout r;
      r.slot = static_cast<std::int64_t>(all.size());
      r.prompt_index = x[0].get<std::int64_t>();
      r.prompt = x[1].get<std::vector<std::int32_t>>();
      r.completion = x[2].get<std::vector<std::int32_t>>();
      r.finish_reason = x[3].get<std::string>();
      r.rewards = nums_of<double>(x[4]);
      r.reward = num_of(x[5]);
      r.advantage = std::numeric_limits<double>::quiet_NaN();  // per token in PPO: token_advantages
      r.token_advantages = nums_of<float>(x[6]);
      r.values = nums_of<float>(x[7]);
      r.returns = nums_of<float>(x[8]);
      r.ref_logps = nums_of<float>(x[9]);
      r.old_logps = nums_of<float>(x[10]);
      r.sample_logps = r.old_logps;
      all.push_back(std::move(r));
    }
  write_rollouts_of_step(opts_.log_dir + "/rollouts", all, {step, opts_.seed, opts_.config_text, rewards_.names()});
}

std::int64_t PpoTrainer::run() {
  std::string extra;
  const std::string resumed = ckpt_->resume(state_, &extra, [&](const std::string& x) {
    if (x.empty()) return;
    try {
      const auto js = nlohmann::json::parse(x);
      vh_->restore(js.at("value_head"));
      // The adaptive coefficient continues from the checkpoint; a fixed one is the configuration's.
      if (opts_.kl_target > 0 && js.contains("kl_coef")) kl_coef_ = js.at("kl_coef").get<double>();
    } catch (const nlohmann::json::exception& e) {
      throw UserError(std::string("the checkpoint's PPO state is unreadable: ") + e.what());
    }
  });
  const std::int64_t end = opts_.stop_at_step > 0 ? std::min(opts_.stop_at_step, opts_.max_steps) : opts_.max_steps;
  if (train::nothing_to_train(resumed, state_.step, end)) return state_.step;
  train::RunLog rlog(env_, opts_.log_dir, resumed.empty() ? -1 : state_.step, ckpt_->log_position_to_trim());
  const auto log_attached = ckpt_->attach_log([&rlog] { return rlog.position(); });
  const std::int64_t first = state_.step;
  const auto t0 = train::Clock::now();
  stop::arm();
  auto head_state = [&]() {
    if (!vh_->finite())
      throw UserError(train::checkpoint_path(opts_.checkpoint.dir, state_.step) + ": not written: the value head holds "
                      "non-finite values (the run diverged; lower ppo.value_lr?); " +
                      (ckpt_->last_checkpoint().empty() ? std::string("no checkpoint was written before it")
                                                        : "the last checkpoint before it: " + ckpt_->last_checkpoint()));
    return nlohmann::json{{"value_head", vh_->state()}, {"kl_coef", kl_coef_}}.dump();
  };
  auto extra_state = [&]() {
    // As the trainable weights (train::Checkpointer): a diverged value head is not written (it was, as JSON nulls that
    // no resume could read, until 2026-11-28). The head is the same on every rank: all refuse alike, agreed.
    std::string out;
    env_.agree([&] { out = head_state(); });
    return out;
  };
  auto eval_line = [&](const char* when) {
    const PpoEval e = evaluate();
    if (e.prompts == 0) return e;
    char line[256];
    int k = std::snprintf(line, sizeof(line), "eval %s step %lld | held-out mean reward %.4f", when,
                          static_cast<long long>(state_.step), e.mean_reward);
    if (e.accuracy >= 0)
      std::snprintf(line + k, sizeof(line) - static_cast<std::size_t>(k), " | held-out accuracy %.1f%% (%lld/%zu)",
                    100.0 * e.accuracy,
                    static_cast<long long>(std::llround(e.accuracy * static_cast<double>(e.prompts))), e.prompts);
    rlog.line(line);
    nlohmann::json j = {{"step", state_.step}, {"eval_reward", e.mean_reward}};
    if (e.accuracy >= 0) j["eval_accuracy"] = e.accuracy;
    rlog.emit(j, state_.step);
    return e;
  };
  PpoEval eval_before, eval_after;
  double final_score = 0;
  std::int64_t updates = 0;
  if (state_.step == 0 && first < end) eval_before = eval_line("before");
  while (state_.step < end) {
    nlohmann::json j = {{"step", state_.step + steps_per_update()}};
    const std::int64_t before = state_.step;
    update(&j);
    ++updates;
    final_score = j["objective/scores"].get<double>();
    train::shard_record(j, model_.definition());
    // log.every_steps counts optimizer steps: the update that reaches a multiple is logged, to metrics.jsonl too
    // (until 2026-11-28 every update was recorded and the line printed only when an update ended on a multiple).
    const bool last = state_.step >= end || train::stop_agreed(env_, state_.step, ckpt_->enabled());
    const int every = std::max(1, opts_.log_every);
    const bool logged = state_.step / every != before / every || last;
    if (logged) rlog.emit(j, state_.step);
    if (rlog.rank0() && logged) {
      char line[400];
      int k = std::snprintf(line, sizeof(line),
                            "step %lld/%lld | score %.3f | kl %.4f | policy loss %.4f | value loss %.4f | clipfrac %.3f | "
                            "len %.1f | lr %.2e",
                            static_cast<long long>(state_.step), static_cast<long long>(opts_.max_steps),
                            j["objective/scores"].get<double>(), j["objective/kl"].get<double>(),
                            j["loss/policy_avg"].get<double>(), j["loss/value_avg"].get<double>(),
                            j["policy/clipfrac_avg"].get<double>(), j["completions/mean_length"].get<double>(),
                            j["lr"].get<double>());
      train::shard_text(line + k, sizeof(line) - static_cast<std::size_t>(k), model_.definition());
      rlog.line(line);
    }
    rlog.progress(state_.step, first, opts_.max_steps, train::seconds_since(t0));
    if (opts_.eval_every > 0 && state_.step / opts_.eval_every != before / opts_.eval_every && !last) eval_line("at");
    // checkpoint.every_steps counts optimizer steps; a checkpoint falls at the end of the update that reaches one.
    const int ck_every = opts_.checkpoint.every;
    const bool due = ckpt_->enabled() && ck_every > 0 && state_.step / ck_every != before / ck_every;
    if (due && !last && !guard_->diverging()) ckpt_->save(state_, extra_state());
    if (last && ckpt_->enabled()) ckpt_->save(state_, extra_state());
    if (last) break;
  }
  rlog.end_progress();
  if (!stop::stopped_early()) eval_after = eval_line("after");
  rlog.flush();
  // job_summary.txt, as SFT, DPO and GRPO write it (PPO wrote none until 2026-11-28; docs/cluster.md promised it).
  if (rlog.rank0() && !opts_.log_dir.empty()) {
    const double seconds = train::seconds_since(t0);
    std::ostringstream s;
    s << "mgrl " << build_info().version << " ppo\n"
      << "ranks: " << env_.size() << "\n"
      << "wall time: " << train::human_time(seconds) << " (" << seconds << " s)\n"
      << "steps: " << state_.step << " (skipped: " << state_.skipped_steps << "), " << updates
      << " rollout batches in this run\n"
      << train::scaler_summary(state_, opt_->scaling())
      << "last rollout batch's mean score: " << final_score << "\n";
    auto ev = [&](const char* name, const PpoEval& e) {
      if (e.prompts == 0) return;
      s << "held-out " << name << ": mean reward " << e.mean_reward;
      if (e.accuracy >= 0) s << ", accuracy " << e.accuracy;
      s << "\n";
    };
    ev("before", eval_before);
    ev("after", eval_after);
    rlog.write_summary(s.str());
  }
  return state_.step;
}

}  // namespace mgrl::rl
