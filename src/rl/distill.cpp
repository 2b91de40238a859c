// distill.cpp: on-policy knowledge distillation (distill.h).
#include "rl/distill.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/stop.h"
#include "dist/device.h"
#include "io/hf_config.h"
#include "train/idle_pass.h"
#include "train/run_log.h"
#include "train/stop_agreement.h"

namespace mgrl::rl {

using train::Clock;
using train::seconds_since;

DistillTrainer::DistillTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& student,
                               model::Transformer& teacher, const io::Tokenizer& tok, std::vector<PromptRow> train,
                               std::vector<PromptRow> eval, DistillOptions opts)
    : env_(env), comm_(comm), model_(student), teacher_(teacher), tok_(tok), train_(std::move(train)),
      eval_(std::move(eval)), opts_(std::move(opts)), sampler_(train_.size(), opts_.seed, opts_.shuffle) {
  const int ranks = env_.size();
  if (opts_.batch_prompts % ranks != 0)
    throw UserError("train.batch_size (" + std::to_string(opts_.batch_prompts) +
                    " prompts) must be divisible by the number of ranks (" + std::to_string(ranks) + ")");
  if ((opts_.batch_prompts / ranks) % opts_.grad_accum != 0)
    throw UserError("train.batch_size / ranks (" + std::to_string(opts_.batch_prompts / ranks) +
                    ") must be divisible by train.grad_accum (" + std::to_string(opts_.grad_accum) + ")");
  // Refused before with the keys named (mode_distill: the teacher's config.json; the schema: distill.temperature).
  MGRL_CHECK(teacher_.config().vocab_size == model_.config().vocab_size,
             "DistillTrainer: a teacher of another vocabulary than the student's");
  MGRL_CHECK(opts_.sampling.temperature > 0, "DistillTrainer: a temperature that is not above 0");
  tr_ = train::trainable_of(model_, model_.base_grads() != nullptr);
  // The teacher is the objective: a resume under another (another distill.teacher, or its files changed) is refused
  // (Checkpointer), as another reference policy is.
  opts_.checkpoint.reference = "teacher\n" + teacher_.definition().base_fingerprint();
  opt_ = std::make_unique<train::Optimizer>(model_.ops(), tr_, opts_.optim);
  sync_ = std::make_unique<train::GradSync>(comm_, model_, tr_);
  ckpt_ = std::make_unique<train::Checkpointer>(
      env_, model_.ops(), *opt_, opts_.checkpoint,
      train::model_identity(io::architecture_name(model_.config().arch), tr_.tensors));
  guard_ = std::make_unique<train::DivergenceGuard>(env_, opts_.max_nonfinite_steps, opts_.optim.scaling.enabled);
  state_.rank_rng.assign(static_cast<std::size_t>(ranks), 0);
  acc_ = static_cast<double*>(model_.ops().alloc(2 * sizeof(double)));
  // The student's training micro-batch at its largest: its `micro` longest prompts with full-length completions.
  const int micro = opts_.batch_prompts / ranks / opts_.grad_accum;
  std::vector<long long> lens;
  for (const auto& p : train_) lens.push_back(static_cast<long long>(p.tokens.size()) + opts_.max_completion_length);
  const auto top = std::min<std::size_t>(lens.size(), static_cast<std::size_t>(micro));
  std::partial_sort(lens.begin(), lens.begin() + static_cast<std::ptrdiff_t>(top), lens.end(), std::greater<long long>());
  long long most = 0;
  for (std::size_t i = 0; i < top; ++i) most += lens[i];
  if (most > 0 && most < (1LL << 31)) {
    train::refuse_activations_beyond_memory(
        env_, model_, most,
        "a training micro-batch of " + std::to_string(micro) +
            " completions (train.batch_size / ranks / train.grad_accum), each up to its prompt + "
            "distill.max_completion_length = " + std::to_string(opts_.max_completion_length) + " tokens",
        "lower train.batch_size or distill.max_completion_length, raise train.grad_accum");
    // and the teacher's no-grad pass over the same micro-batch (its scoring arena only), planned now so that a run
    // that does not fit fails at the start, not at its first step
    env_.agree([&] {
      model_.plan(static_cast<int>(most));
      try {
        teacher_.plan_scoring(static_cast<int>(most));
      } catch (const OutOfMemory& e) {
        throw UserError("the teacher's pass over a training micro-batch of " + std::to_string(micro) +
                        " completions (" + std::to_string(most) + " tokens) does not fit beside the student (" +
                        e.what() + "): lower train.batch_size or distill.max_completion_length, raise "
                        "train.grad_accum");
      }
    });
  }
  opt_->start(state_);  // the loss scale of a fresh run; a resume takes the checkpoint's
}

DistillTrainer::~DistillTrainer() { model_.ops().release(acc_); }

DistillTrainer::Sampled DistillTrainer::sample(const std::vector<PromptRow>& rows,
                                               const std::vector<std::size_t>& indices, std::size_t lo,
                                               std::size_t hi, std::uint64_t seed) {
  const train::PhasesPaused paused(model_.ops());  // generation is timed on the host
  GenerationOptions g;
  g.max_new_tokens = opts_.max_completion_length;
  g.num_generations = 1;
  g.sampling = opts_.sampling;
  g.repetition_penalty = opts_.repetition_penalty;
  g.seed = seed;
  g.eos_ids = stop_ids(model_.config(), &tok_);
  g.stop_strings = opts_.stop;
  opts_.cache.apply(g);
  g.use_lora = true;
  if (model_.definition().sharded()) g.lockstep = lockstep_over(env_);  // every rank steps (and gathers) together
  // Each completion's draws depend on the seed and its slot in the global batch only (Prompt::index): any rank
  // count samples the same completions.
  std::vector<Prompt> prompts;
  for (std::size_t j = lo; j < hi; ++j) prompts.push_back({static_cast<std::int64_t>(j), rows[indices[j]].tokens});
  Generator gen(model_, g, [&](const std::vector<std::int32_t>& ids) { return tok_.decode(ids, true); });
  Sampled s;
  for (auto& c : gen.generate(prompts)) {
    const PromptRow& p = rows[indices[static_cast<std::size_t>(c.prompt_index)]];
    std::vector<std::int32_t> seq = p.tokens;
    seq.insert(seq.end(), c.tokens.begin(), c.tokens.end());
    s.prompt_len.push_back(static_cast<int>(p.tokens.size()));
    s.slots.push_back(c.prompt_index);
    s.finish.push_back(c.finish_reason);
    s.completion_tokens += static_cast<std::int64_t>(c.tokens.size());
    s.sequences.push_back(std::move(seq));
  }
  return s;
}

model::Batch DistillTrainer::batch_of(const Sampled& s, std::size_t lo, std::size_t hi, double inv,
                                      std::vector<float>* w) const {
  model::Batch b;
  w->clear();
  for (std::size_t k = lo; k < hi; ++k) {
    const auto& seq = s.sequences[k];
    b.add(seq);  // an empty completion (max_completion_length 0 aside, an EOS is kept) scores nothing
    b.scored_from.push_back(s.prompt_len[k]);
    b.seq_keys.push_back(static_cast<std::uint64_t>(s.slots[k]));  // LoRA dropout by the global slot
    for (int t = 0; t < static_cast<int>(seq.size()); ++t)
      w->push_back(t >= s.prompt_len[k] ? static_cast<float>(inv) : 0.0f);
  }
  return b;
}

double DistillTrainer::train_step() {
  const int ranks = env_.size(), rank = env_.rank();
  const auto indices = sampler_.next(state_.cursor, opts_.batch_prompts);
  const std::size_t local_n = static_cast<std::size_t>(opts_.batch_prompts / ranks);
  const std::size_t micro = local_n / static_cast<std::size_t>(opts_.grad_accum);
  // 1. The student samples a completion of each of this rank's prompts.
  const auto t_gen = Clock::now();
  const Sampled s = sample(train_, indices, static_cast<std::size_t>(rank) * local_n,
                           static_cast<std::size_t>(rank + 1) * local_n,
                           random_bits(opts_.seed ^ 0x64697374696c6c73ull, static_cast<std::uint64_t>(state_.step)));
  last_gen_seconds_ = seconds_since(t_gen);
  // The loss: the divergence summed over the step's completion tokens (every rank's), divided by their number.
  const long long n_tokens = env_.allreduce_sum(static_cast<long long>(s.completion_tokens));
  const double inv = 1.0 / static_cast<double>(std::max(1LL, n_tokens));
  {
    long long all = 0, clipped = 0;
    int shortest = std::numeric_limits<int>::max(), longest = 0;
    for (std::size_t k = 0; k < s.sequences.size(); ++k) {
      const int len = static_cast<int>(s.sequences[k].size()) - s.prompt_len[k];
      all += static_cast<long long>(s.sequences[k].size());
      clipped += s.finish[k] != "eos" ? 1 : 0;  // as trl: not ended by EOS (cut at the length, or by a stop string)
      shortest = std::min(shortest, len);
      longest = std::max(longest, len);
    }
    // Four collectives: one statement each, so that every rank runs them in the same written order.
    last_tokens_ = env_.allreduce_sum(all);
    const long long clipped_all = env_.allreduce_sum(clipped);
    len_min_ = env_.allreduce_min(shortest);
    len_max_ = env_.allreduce_max(longest);
    len_mean_ = static_cast<double>(n_tokens) / opts_.batch_prompts;
    clipped_ = static_cast<double>(clipped_all) / opts_.batch_prompts;
  }
  // 2. Per micro-batch: the teacher's pass to its LM head's input, the student's forward with the divergence as its
  //    loss (the LM head's backward in it), the backward.
  const double scale = opt_->loss_scale(state_);
  kernels::Ops& ops = model_.ops();
  sync_->zero();
  ops.zero(acc_, 2 * sizeof(double));
  const std::uint64_t dropout = model::dropout_seed(opts_.seed, state_.step);
  const float inv_t = 1.0f / opts_.sampling.temperature;
  std::vector<float> w;
  for (int a = 0; a < opts_.grad_accum; ++a) {
    const model::Batch b = batch_of(s, static_cast<std::size_t>(a) * micro, static_cast<std::size_t>(a + 1) * micro,
                                    inv, &w);
    const auto hook = sync_->hook(a + 1 == opts_.grad_accum);
    const model::Transformer::Teacher t = teacher_.as_teacher(b);
    model_.forward_with_divergence(b, w.data(), scale, acc_, t, opts_.beta, inv_t, dropout, acc_ + 1);
    model_.backward(nullptr, hook);
  }
  const double norm = train::agreed_norm(env_, sync_->finish(scale));  // identical on every rank; synchronises
  double local[2] = {0, 0};
  ops.download(local, acc_, sizeof local);
  const double loss = env_.allreduce_sum(local[0]);
  last_entropy_ = env_.allreduce_sum(local[1]);
  state_.tokens_seen += n_tokens;
  ops.phase_begin(kernels::Phase::Optimizer);
  last_outcome_ = opt_->step(state_, norm, loss);  // a non-finite step is skipped on every rank together
  ops.phase_end(kernels::Phase::Optimizer);
  last_norm_ = norm;
  return loss;
}

std::pair<double, double> DistillTrainer::evaluate() {
  if (eval_.empty()) return {-1, -1};
  const train::PhasesPaused paused(model_.ops());
  const std::size_t N = eval_.size();
  const std::size_t lo = N * static_cast<std::size_t>(env_.rank()) / static_cast<std::size_t>(env_.size()),
                    hi = N * static_cast<std::size_t>(env_.rank() + 1) / static_cast<std::size_t>(env_.size());
  std::vector<std::size_t> order(N);
  for (std::size_t i = 0; i < N; ++i) order[i] = i;
  // The same completions at any rank count: the eval seed and each prompt's line (its slot here) only.
  const Sampled s = sample(eval_, order, lo, hi, random_bits(opts_.seed ^ 0x6576616c64697374ull, 0));
  kernels::Ops& ops = model_.ops();
  ops.zero(acc_, 2 * sizeof(double));
  const std::size_t chunk = std::max<std::size_t>(1, static_cast<std::size_t>(opts_.batch_prompts / env_.size() / opts_.grad_accum));
  std::vector<float> w;
  for (std::size_t k = 0; k < s.sequences.size(); k += chunk) {
    const model::Batch b = batch_of(s, k, std::min(s.sequences.size(), k + chunk), 1.0, &w);
    const model::Transformer::Teacher t = teacher_.as_teacher(b);
    model_.score_divergence(b, w.data(), acc_, t, opts_.beta, 1.0f / opts_.sampling.temperature, acc_ + 1);
  }
  // model.shard_base: each pass gathers the layers collectively; a rank with fewer held-out chunks runs as many
  // one-token passes more, the teacher's and the student's in the order of a chunk's.
  train::idle_passes({&teacher_, &model_}, hi - lo, N, env_.size(), chunk);
  double local[2] = {0, 0};
  ops.download(local, acc_, sizeof local);
  const long long tokens = env_.allreduce_sum(static_cast<long long>(s.completion_tokens));
  const double div = env_.allreduce_sum(local[0]);
  const double ent = env_.allreduce_sum(local[1]);
  const double n = static_cast<double>(std::max(1LL, tokens));
  return {div / n, ent / n};
}

DistillResult DistillTrainer::run() {
  DistillResult res;
  const auto t0 = Clock::now();
  const std::string resumed = ckpt_->resume(state_, nullptr);
  const std::int64_t end = opts_.stop_at_step > 0 ? std::min(opts_.stop_at_step, opts_.max_steps) : opts_.max_steps;
  if (train::nothing_to_train(resumed, state_.step, end)) {
    res.steps = state_.step;
    return res;
  }
  train::RunLog rlog(env_, opts_.log_dir, resumed.empty() ? -1 : state_.step, ckpt_->log_position_to_trim());
  const auto log_attached = ckpt_->attach_log([&rlog] { return rlog.position(); });
  const bool rank0 = rlog.rank0();
  auto emit = [&](const nlohmann::json& j) { rlog.emit(j, state_.step); };
  const std::int64_t first = state_.step;
  double window_seconds = 0, window_loss = 0, window_entropy = 0, window_gen = 0;
  std::int64_t window_all = 0, window_steps = 0;
  double step_seconds = 0, run_all = 0, run_gen = 0;
  model_.ops().phase_reset();
  double loss = 0;
  stop::arm();  // from here a stop signal ends the run after its step, with a checkpoint
  while (state_.step < end) {
    const double lr = opt_->lr(state_);
    const auto step_t0 = Clock::now();
    loss = train_step();
    const double dt_step = seconds_since(step_t0);
    step_seconds += dt_step;
    window_seconds += dt_step;
    window_gen += last_gen_seconds_;
    run_gen += last_gen_seconds_;
    if (std::isfinite(loss)) {
      window_loss += loss;
      window_entropy += last_entropy_;
      ++window_steps;
    }
    window_all += last_tokens_;
    run_all += static_cast<double>(last_tokens_);
    res.final_loss = loss;
    const bool last = state_.step == end || train::stop_agreed(env_, state_.step, ckpt_->enabled());
    if (rank0 && (state_.step % std::max(1, opts_.log_every) == 0 || last)) {
      const double tps = window_seconds > 0 ? static_cast<double>(window_all) / window_seconds : 0;
      const double mean_loss = window_steps > 0 ? window_loss / static_cast<double>(window_steps) : loss;
      const double mean_entropy = window_steps > 0 ? window_entropy / static_cast<double>(window_steps) : 0;
      char line[480];
      int n = std::snprintf(line, sizeof(line),
                            "step %lld/%lld | loss %.4f | entropy %.3f | lr %.2e | grad norm %.3f | completion length "
                            "%.1f | %.0f tok/s | generation %.0f%%",
                            static_cast<long long>(state_.step), static_cast<long long>(opts_.max_steps), mean_loss,
                            mean_entropy, lr, last_norm_, len_mean_, tps,
                            window_seconds > 0 ? 100.0 * window_gen / window_seconds : 0.0);
      const std::size_t peak = dist::gpu_memory_used();
      if (peak > 0)
        n += std::snprintf(line + n, sizeof(line) - static_cast<std::size_t>(n), " | peak GPU mem %.2f GiB",
                           static_cast<double>(peak) / (1 << 30));
      else
        n += std::snprintf(line + n, sizeof(line) - static_cast<std::size_t>(n), " | peak host mem %.2f GiB",
                           train::host_peak_rss_gib());
      n += train::shard_text(line + n, sizeof(line) - static_cast<std::size_t>(n), model_.definition());
      n += train::shard_text(line + n, sizeof(line) - static_cast<std::size_t>(n), teacher_.definition(), "teacher");
      train::scaler_text(line + n, sizeof(line) - static_cast<std::size_t>(n), state_, opt_->scaling());
      rlog.line(line);
      nlohmann::json rec = {{"step", state_.step},
                            {"loss", mean_loss},
                            {"entropy", mean_entropy},
                            {"lr", lr},
                            {"grad_norm", last_norm_},
                            {"completions/mean_length", len_mean_},
                            {"completions/min_length", len_min_},
                            {"completions/max_length", len_max_},
                            {"completions/clipped_ratio", clipped_},
                            {"tokens_per_second", tps},
                            {"generation_seconds", window_gen},
                            {"skipped_steps", state_.skipped_steps}};
      if (opt_->scaling()) train::scaler_record(rec, state_, last_outcome_);
      train::shard_record(rec, model_.definition());
      train::shard_record(rec, teacher_.definition(), "teacher");
      emit(rec);
      window_seconds = window_loss = window_entropy = window_gen = 0;
      window_all = window_steps = 0;
    }
    rlog.progress(state_.step, first, opts_.max_steps, seconds_since(t0));
    if (opts_.eval_every > 0 && state_.step % opts_.eval_every == 0 && !last) {
      const auto [el, ee] = evaluate();
      if (el >= 0) {
        char line[128];
        std::snprintf(line, sizeof(line), "eval step %lld | loss %.4f | entropy %.3f",
                      static_cast<long long>(state_.step), el, ee);
        rlog.line(line);
        emit({{"step", state_.step}, {"eval_loss", el}, {"eval_entropy", ee}});
      }
    }
    guard_->after_step(last_outcome_, state_.step, ckpt_->last_checkpoint());
    if (ckpt_->due(state_.step) && !last) {
      if (guard_->diverging()) {
        rlog.line("step " + std::to_string(state_.step) +
                  ": no checkpoint (the step's loss or gradient norm was not finite; it changed nothing)");
      } else {
        ckpt_->save(state_);
        ++res.checkpoints;
      }
    }
    if (last) break;
  }
  rlog.end_progress();
  // generation is timed on the host (its kernels are left out of the op phases)
  const std::vector<std::pair<std::string, double>> host = {{"generation", run_gen}};
  const std::string phases = train::phase_table(model_.ops().phase_seconds(), state_.step - first, step_seconds, host);
  if (rank0 && state_.step > first) std::fputs(phases.c_str(), stdout);
  const auto phase_rec =
      train::phase_record(env_, model_.ops().phase_seconds(), state_.step - first, step_seconds, run_all, host);
  if (state_.step > first) emit({{"step", state_.step}, {"phases", phase_rec}});
  if (ckpt_->enabled() && state_.step > first) {
    ckpt_->save(state_);
    ++res.checkpoints;
  }
  const auto [el, ee] = stop::stopped_early() ? std::pair<double, double>(-1, -1) : evaluate();
  if (el >= 0) {
    res.final_eval_loss = el;
    char line[128];
    std::snprintf(line, sizeof(line), "held-out loss %.4f | entropy %.3f", el, ee);
    log::info(line);
    emit({{"step", state_.step}, {"eval_loss", el}, {"eval_entropy", ee}});
  }
  res.steps = state_.step;
  res.skipped = state_.skipped_steps;
  res.seconds = seconds_since(t0);
  rlog.flush();
  if (rank0 && !opts_.log_dir.empty()) {
    std::ostringstream s;  // job_summary.txt, written whole (RunLog::write_summary)
    s << "mgrl " << build_info().version << " distill (beta " << opts_.beta << ", temperature "
      << opts_.sampling.temperature << ")\n"
      << "ranks: " << env_.size() << "\n"
      << "wall time: " << train::human_time(res.seconds) << " (" << res.seconds << " s)\n"
      << "steps: " << res.steps << " (skipped: " << res.skipped << ")\n"
      << train::scaler_summary(state_, opt_->scaling())
      << "completion tokens in the loss since step 0: " << state_.tokens_seen << "\n"
      << "this run: " << run_all << " tokens in its batches over " << step_seconds << " s of steps\n"
      << "final train loss: " << res.final_loss << "\n"
      << "final eval loss: " << (res.final_eval_loss >= 0 ? std::to_string(res.final_eval_loss) : "none") << "\n"
      << "checkpoints written: " << res.checkpoints
      << (opts_.checkpoint.dir.empty() ? "" : " in " + opts_.checkpoint.dir) << "\n";
    if (state_.step > first) s << "rank 0 " << phases;
    rlog.write_summary(s.str());
  }
  return res;
}

}  // namespace mgrl::rl
