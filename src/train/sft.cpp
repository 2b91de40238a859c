// sft.cpp: the supervised fine-tuning loop.
#include "train/sft.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/build_info.h"
#include "core/env.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/random.h"
#include "core/stop.h"
#include "dist/device.h"
#include "io/hf_config.h"
#include "io/tfevents.h"
#include "train/idle_pass.h"
#include "train/run_log.h"
#include "train/stop_agreement.h"

namespace mgrl::train {
namespace {

// The packed batch of some examples, and the loss weights (1 / n_tokens at completion positions).
model::Batch make_batch(const std::vector<const Example*>& ex, double inv_tokens, std::vector<float>* weights,
                        std::uint64_t first_slot = 0) {
  model::Batch b;
  for (const auto* e : ex) {
    b.add(e->tokens);
    b.seq_keys.push_back(first_slot + b.seq_keys.size());  // its slot in the step's global batch (LoRA dropout)
  }
  weights->assign(b.tokens.size(), 0.0f);
  b.scored_from.assign(static_cast<std::size_t>(b.B()), 0);
  for (int i = 0; i < b.B(); ++i) {
    int first = b.length(i);  // the LM head runs from the first weighted token on (Batch::scored_from)
    for (int t = ex[i]->loss_mask.empty() ? ex[i]->prompt_len : 0; t < b.length(i); ++t)
      if (ex[i]->loss_mask.empty() || ex[i]->loss_mask[static_cast<std::size_t>(t)]) {
        (*weights)[static_cast<std::size_t>(b.offsets[i] + t)] = static_cast<float>(inv_tokens);
        first = std::min(first, t);
      }
    b.scored_from[static_cast<std::size_t>(i)] = first;
  }
  return b;
}

// MGRL_FUSED_LM_HEAD=0 runs the LM head's backward in the backward (its logits computed again), as before the fused
// pass (TrainExecutor::forward_with_loss): for comparison and as a fallback. Read once.
bool fused_lm_head() {
  static const bool on = env::switch_on("MGRL_FUSED_LM_HEAD");
  return on;
}

std::int64_t loss_tokens(const Example& e) {
  if (!e.loss_mask.empty()) return std::count(e.loss_mask.begin(), e.loss_mask.end(), std::uint8_t{1});
  return static_cast<std::int64_t>(e.tokens.size()) - e.prompt_len;
}

}  // namespace

std::vector<std::vector<std::size_t>> sft_rows(const std::vector<Example>& examples, int pack_capacity) {
  if (pack_capacity > 0) {
    std::vector<std::size_t> lengths;
    for (const auto& e : examples) lengths.push_back(e.tokens.size());
    return pack_bfd(lengths, static_cast<std::size_t>(pack_capacity));
  }
  std::vector<std::vector<std::size_t>> rows(examples.size());
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = {i};
  return rows;
}

SftTrainer::SftTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& model, const io::Tokenizer& tok,
                       std::vector<Example> train, std::vector<Example> eval,
                       std::vector<std::vector<std::size_t>> rows, SftOptions opts)
    : env_(env), comm_(comm), model_(model), tok_(tok), train_(std::move(train)), eval_(std::move(eval)),
      opts_(std::move(opts)), rows_(std::move(rows)), sampler_(rows_.size(), opts_.seed, opts_.shuffle) {
  for (const auto& row : rows_)
    for (const std::size_t i : row) MGRL_CHECK(i < train_.size(), "an SFT row names an example that is not there");
  const int ranks = env_.size();
  if (opts_.global_batch % ranks != 0)
    throw UserError("train.batch_size (" + std::to_string(opts_.global_batch) + ") must be divisible by the number of ranks (" +
                    std::to_string(ranks) + ")");
  if ((opts_.global_batch / ranks) % opts_.grad_accum != 0)
    throw UserError("train.batch_size / ranks (" + std::to_string(opts_.global_batch / ranks) +
                    ") must be divisible by train.grad_accum (" + std::to_string(opts_.grad_accum) + ")");
  tr_ = trainable_of(model_, model_.base_grads() != nullptr);
  opt_ = std::make_unique<Optimizer>(model_.ops(), tr_,
                                     OptimizerOptions{opts_.adamw, opts_.schedule, opts_.max_grad_norm, opts_.scaling});
  sync_ = std::make_unique<GradSync>(comm_, model_, tr_);
  ckpt_ = std::make_unique<Checkpointer>(
      env_, model_.ops(), *opt_,
      opts_.checkpoint,
      model_identity(io::architecture_name(model_.config().arch), tr_.tensors));
  guard_ = std::make_unique<DivergenceGuard>(env_, opts_.max_nonfinite_steps, opts_.scaling.enabled);
  state_.rank_rng.assign(static_cast<std::size_t>(ranks), 0);
  // The loss, then trl's token metrics (the mean entropy and top-1 accuracy over the loss tokens), summed on the device.
  loss_acc_ = static_cast<double*>(model_.ops().alloc(4 * sizeof(double)));
  model_.set_token_stats(true);
  model_.set_embedding_noise(opts_.neftune_alpha);  // training forwards only: evaluation scores without it
  model_.set_score_stats(true);  // and of the held-out passes (eval_entropy, eval_mean_token_accuracy)
  // Activation memory planned once: a micro-batch holds at most the `micro` longest rows.
  const int micro = opts_.global_batch / ranks / opts_.grad_accum;
  std::vector<int> lens;
  for (const auto& row : rows_) {
    int n = 0;
    for (std::size_t i : row) n += static_cast<int>(train_[i].tokens.size());
    lens.push_back(n);
  }
  const auto top = std::min<std::size_t>(lens.size(), static_cast<std::size_t>(micro));
  std::partial_sort(lens.begin(), lens.begin() + static_cast<std::ptrdiff_t>(top), lens.end(), std::greater<int>());
  std::vector<long long> upto(top + 1, 0);  // upto[m]: tokens of the m longest examples
  for (std::size_t i = 0; i < top; ++i) upto[i + 1] = upto[i] + lens[i];
  const long long most = upto[top];
  // A micro-batch too large for this rank's memory is the user's setting: one line naming the keys that decide it
  // and the micro-batch that would fit, on every rank together; checked before allocating, and the allocation's own
  // failure said the same way.
  if (most > 0 && most < (1LL << 31))
    env_.agree([&] {
      const auto refuse = [&](const std::string& why) {
        // The largest micro-batch (of the longest examples) whose activations fit what is available.
        const std::size_t avail = model_.ops().available_memory();
        std::size_t lo = 0, hi = top;
        while (lo < hi) {
          const std::size_t mid = (lo + hi + 1) / 2;
          if (model_.activation_bytes(static_cast<int>(upto[mid])) <= avail) lo = mid;
          else hi = mid - 1;
        }
        const bool rc = model_.options().recompute;
        const std::string seqs = opts_.pack_capacity > 0 ? " packed rows" : " sequences";
        throw UserError("train.batch_size = " + std::to_string(opts_.global_batch) + " (" + std::to_string(micro) +
                        seqs + " per rank and micro-batch with train.grad_accum = " +
                        std::to_string(opts_.grad_accum) + ", up to " + std::to_string(most) +
                        " tokens at once, the longest" + (opts_.pack_capacity > 0 ? " rows" : " examples") +
                        " within train.max_seq_len) needs " + why + (rc ? "" : " (model.recompute = false)") + "; " +
                        (lo > 0 ? "about " + std::to_string(lo) + seqs + " per micro-batch fit"
                                : std::string("not one") + (opts_.pack_capacity > 0 ? " row" : " sequence") + " fits") +
                        ": lower train.batch_size or train.max_seq_len, raise train.grad_accum" +
                        (rc ? std::string() : ", or set model.recompute = true"));
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
  if (!fused_lm_head())
    log::info("MGRL_FUSED_LM_HEAD=0: the LM head's gradient is taken in the backward (its logits computed again)");
  opt_->start(state_);  // the loss scale of a fresh run; a resume takes the checkpoint's
}

SftTrainer::~SftTrainer() { model_.ops().release(loss_acc_); }

double SftTrainer::train_step() {
  const int ranks = env_.size(), rank = env_.rank();
  const auto global = sampler_.next(state_.cursor, opts_.global_batch);  // rows (an example each, or packed)
  const int local_n = opts_.global_batch / ranks, micro = local_n / opts_.grad_accum;
  // first[r]: the slot in the step's examples (over all ranks) of global row r's first example.
  std::vector<std::size_t> first(global.size() + 1, 0);
  std::int64_t n_tokens = 0;
  last_tokens_all_ = 0;
  for (std::size_t r = 0; r < global.size(); ++r) {  // every rank knows the global batch
    first[r + 1] = first[r] + rows_[global[r]].size();
    for (std::size_t i : rows_[global[r]]) {
      n_tokens += loss_tokens(train_[i]);
      last_tokens_all_ += static_cast<std::int64_t>(train_[i].tokens.size());
    }
  }
  // Micro-batch a of this rank: the examples of its rows [rank local_n + a micro, + micro).
  const auto micro_batch = [&](int a) {
    std::vector<const Example*> mb;
    for (int k = 0; k < micro; ++k)
      for (std::size_t i : rows_[global[static_cast<std::size_t>(rank * local_n + a * micro + k)]])
        mb.push_back(&train_[i]);
    return mb;
  };
  const double inv = 1.0 / static_cast<double>(std::max<std::int64_t>(1, n_tokens));

  // Dynamic loss scaling (fp16 storage, or train.loss_scaling = dynamic): the loss weights of the backward are
  // multiplied by the scale; the gradient norm and the update divide it out. The loss itself is not scaled.
  const double scale = opt_->loss_scale(state_);
  sync_->zero();
  if (fault::fires("grad_overflow", rank, state_.step + 1)) sync_->inject_overflow(true);  // tests (core/fault.h)
  else sync_->inject_overflow(fault::fires("grad_overflow_local", rank, state_.step + 1), true);
  kernels::Ops& ops = model_.ops();
  ops.zero(loss_acc_, 4 * sizeof(double));
  std::vector<float> w;
  const std::uint64_t seed = model::dropout_seed(opts_.seed, state_.step);
  // The micro-batches are queued without waiting for the device: the loss is summed there (add_loss) and read
  // once, after the gradient norm's synchronisation; the host prepares the next micro-batch while the device
  // computes this one.
  for (int a = 0; a < opts_.grad_accum; ++a) {
    const std::vector<const Example*> mb = micro_batch(a);
    const model::Batch b = make_batch(mb, inv, &w, first[static_cast<std::size_t>(rank * local_n + a * micro)]);
    // LoRA: in the last micro-batch, each layer's gradients are reduced over ranks as soon as the backward
    // has finished them (asynchronously on the GPU, overlapping the layers still to come).
    const auto hook = sync_->hook(a + 1 == opts_.grad_accum);
    if (opts_.dft) {
      // The log-probs first (a download: the weights depend on them), the statistics under the plain weights (a
      // scratch sum takes their NLL), then the loss and the backward under the DFT weights w x p.
      lp_.resize(b.tokens.size());
      model_.forward(b, lp_.data(), true, true, seed);
      model_.add_loss(w.data(), loss_acc_ + 3, loss_acc_ + 1);
      for (std::size_t i = 0; i < w.size(); ++i)
        if (w[i] != 0.0f) w[i] = static_cast<float>(static_cast<double>(w[i]) * std::exp(static_cast<double>(lp_[i])));
      model_.add_loss(w.data(), loss_acc_);
      if (scale != 1.0)
        for (auto& x : w) x = static_cast<float>(x * scale);
      model_.backward(scale != 1.0 ? w.data() : nullptr, hook);
      continue;
    }
    if (fused_lm_head()) {
      // The weights are known before the forward: the LM head's backward runs in the forward, on each chunk of
      // logits while it is computed (not again in the backward), bitwise as the three calls below.
      model_.forward_with_loss(b, w.data(), scale, loss_acc_, seed, loss_acc_ + 1);
      model_.backward(nullptr, hook);
      continue;
    }
    model_.forward(b, nullptr, true, true, seed);
    model_.add_loss(w.data(), loss_acc_, loss_acc_ + 1);
    if (scale != 1.0)
      for (auto& x : w) x = static_cast<float>(x * scale);
    model_.backward(scale != 1.0 ? w.data() : nullptr, hook);
  }
  const double norm = agreed_norm(env_, sync_->finish(scale));  // identical on every rank; synchronises
  double local[3] = {0, 0, 0};
  ops.download(local, loss_acc_, sizeof local);  // the device is idle: no wait
  // Three collectives: one statement each, so that every rank runs them in the same written order.
  const double loss = env_.allreduce_sum(local[0]);
  last_entropy_ = env_.allreduce_sum(local[1]);
  last_accuracy_ = env_.allreduce_sum(local[2]);
  state_.tokens_seen += n_tokens;
  model_.ops().phase_begin(kernels::Phase::Optimizer);
  last_outcome_ = opt_->step(state_, norm, loss);  // a non-finite step is skipped on every rank together
  model_.ops().phase_end(kernels::Phase::Optimizer);
  last_norm_ = norm;
  return loss;
}

std::pair<double, double> SftTrainer::evaluate(bool accuracy) {
  if (eval_.empty()) return {-1, -1};
  const PhasesPaused paused(model_.ops());  // evaluation is not part of a step
  const std::size_t N = eval_.size();
  const std::size_t lo = N * env_.rank() / env_.size(), hi = N * (env_.rank() + 1) / env_.size();
  double loss = 0, entropy = 0, top1 = 0;
  long long tokens = 0;
  std::vector<float> w, lp;
  for (std::size_t s = lo; s < hi; s += static_cast<std::size_t>(opts_.eval_batch)) {
    std::vector<const Example*> mb;
    for (std::size_t i = s; i < std::min(hi, s + opts_.eval_batch); ++i) mb.push_back(&eval_[i]);
    const model::Batch b = make_batch(mb, 1.0, &w);
    lp.assign(b.tokens.size(), 0.0f);
    model_.score(b, lp.data(), true);  // its own activations: the training arena keeps its planned size
    const model::TokenStats ts = model_.token_stats(true);
    for (std::size_t i = 0; i < lp.size(); ++i) {
      loss -= static_cast<double>(w[i]) * lp[i];
      entropy += static_cast<double>(w[i]) * ts.entropy[i];
      top1 += static_cast<double>(w[i]) * ts.top1[i];
    }
    for (const auto* e : mb) tokens += loss_tokens(*e);
  }
  if (model_.definition().sharded()) {
    // A sharded base gathers each layer collectively in every pass: a rank with fewer held-out batches than another
    // runs as many one-token passes more, so that all ranks gather alike.
    const std::size_t eb = static_cast<std::size_t>(opts_.eval_batch);
    idle_passes(model_, hi - lo, N, env_.size(), eb);
  }
  // Two collectives: one statement each, so that every rank runs them in the same written order.
  const double loss_sum = env_.allreduce_sum(loss);
  const long long token_sum = env_.allreduce_sum(tokens);
  const double entropy_sum = env_.allreduce_sum(entropy);
  const double top1_sum = env_.allreduce_sum(top1);
  const double mean = loss_sum / static_cast<double>(std::max(1LL, token_sum));
  eval_entropy_ = entropy_sum / static_cast<double>(std::max(1LL, token_sum));
  eval_token_accuracy_ = top1_sum / static_cast<double>(std::max(1LL, token_sum));
  const double acc = accuracy && opts_.accuracy ? opts_.accuracy(eval_) : -1;
  return {mean, acc};
}

SftResult SftTrainer::run() {
  SftResult res;
  const auto t0 = Clock::now();
  const std::string resumed = ckpt_->resume(state_, nullptr);
  const std::int64_t end = opts_.stop_at_step > 0 ? std::min(opts_.stop_at_step, opts_.max_steps) : opts_.max_steps;
  if (nothing_to_train(resumed, state_.step, end)) {
    res.steps = state_.step;
    return res;
  }
  RunLog rlog(env_, opts_.log_dir, resumed.empty() ? -1 : state_.step, ckpt_->log_position_to_trim());
  const auto log_attached = ckpt_->attach_log([&rlog] { return rlog.position(); });
  const bool rank0 = rlog.rank0();
  const double flops_per_token =
      (model_.base_grads() ? 6.0 : 4.0) * static_cast<double>(model_.base_numel());  // full FT: 6N; LoRA: ~4N
  auto emit = [&](const nlohmann::json& j) { rlog.emit(j, state_.step); };

  const std::int64_t first = state_.step;
  // The log window (the steps since the last line): its steps' seconds (not the evaluations' and checkpoints' between
  // them, which the wall clock counted until 2026-11-28), tokens and losses.
  double window_seconds = 0, window_loss = 0, window_entropy = 0, window_accuracy = 0;
  std::int64_t window_tokens = 0, window_all = 0, window_steps = 0;
  double step_seconds = 0, run_all = 0;  // run_all: every token of the batches of this run
  model_.ops().phase_reset();
  double loss = 0;
  stop::arm();  // from here a stop signal ends the run after its step, with a checkpoint
  while (state_.step < end) {
    const std::int64_t before = state_.tokens_seen;
    const double lr = opt_->lr(state_);
    const auto step_t0 = Clock::now();
    loss = train_step();
    const double dt_step = seconds_since(step_t0);
    step_seconds += dt_step;
    window_seconds += dt_step;
    if (std::isfinite(loss)) {  // a skipped step's non-finite loss is left out, as transformers' nan/inf filter does
      window_loss += loss;
      window_entropy += last_entropy_;
      window_accuracy += last_accuracy_;
      ++window_steps;
    }
    window_tokens += state_.tokens_seen - before;
    window_all += last_tokens_all_;
    run_all += static_cast<double>(last_tokens_all_);
    res.final_loss = loss;
    const bool last = state_.step == end || stop_agreed(env_, state_.step, ckpt_->enabled());  // a stop signal: checkpoint, exit 3
    if (rank0 && (state_.step % std::max(1, opts_.log_every) == 0 || last)) {
      const double dt = window_seconds;
      // Every token of the batch (as llm.c and transformers count them), and the tokens in the loss beside it.
      const double tps = dt > 0 ? static_cast<double>(window_all) / dt : 0;
      const double trained_tps = dt > 0 ? static_cast<double>(window_tokens) / dt : 0;
      // The mean loss of the window's steps (as transformers' Trainer logs it; until 2026-11-28 its last step's); the
      // last step's when none had a finite loss.
      const double mean_loss = window_steps > 0 ? window_loss / static_cast<double>(window_steps) : loss;
      char line[320];
      int n = std::snprintf(line, sizeof(line),
                            "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s (trained %.0f tok/s)",
                            static_cast<long long>(state_.step), static_cast<long long>(opts_.max_steps), mean_loss,
                            lr, last_norm_, tps, trained_tps);
      if (opts_.gpu_peak_tflops > 0)
        n += std::snprintf(line + n, sizeof(line) - n, " | MFU %.1f%%",
                           100.0 * tps * flops_per_token / (opts_.gpu_peak_tflops * 1e12 * env_.size()));
      peak_gpu_ = std::max(peak_gpu_, dist::gpu_memory_used());
      if (peak_gpu_ > 0)
        n += std::snprintf(line + n, sizeof(line) - n, " | peak GPU mem %.2f GiB",
                           static_cast<double>(peak_gpu_) / (1 << 30));
      else
        n += std::snprintf(line + n, sizeof(line) - n, " | peak host mem %.2f GiB", host_peak_rss_gib());
      n += shard_text(line + n, sizeof(line) - static_cast<std::size_t>(n), model_.definition());
      n += scaler_text(line + n, sizeof(line) - static_cast<std::size_t>(n), state_, opt_->scaling());
      rlog.line(line);
      nlohmann::json rec = {{"step", state_.step}, {"loss", mean_loss}, {"lr", lr}, {"grad_norm", last_norm_},
                            {"tokens_per_second", tps}, {"trained_tokens_per_second", trained_tps},
                            {"skipped_steps", state_.skipped_steps}};
      // trl's SFTTrainer metrics: the window's mean of each step's mean over its loss tokens (trl: of each
      // micro-batch's; the same with grad_accum 1).
      if (window_steps > 0) {
        rec["entropy"] = window_entropy / static_cast<double>(window_steps);
        rec["mean_token_accuracy"] = window_accuracy / static_cast<double>(window_steps);
      }
      if (peak_gpu_ > 0) rec["peak_gpu_gib"] = static_cast<double>(peak_gpu_) / (1 << 30);
      shard_record(rec, model_.definition());
      if (opt_->scaling()) scaler_record(rec, state_, last_outcome_);
      emit(rec);
      window_seconds = window_loss = window_entropy = window_accuracy = 0;
      window_tokens = window_all = window_steps = 0;
    }
    rlog.progress(state_.step, first, opts_.max_steps, seconds_since(t0));
    if (opts_.eval_every > 0 && state_.step % opts_.eval_every == 0 && !last) {
      const auto [el, acc] = evaluate(false);
      if (el >= 0) {
        state_.best_eval_loss = std::min(state_.best_eval_loss, el);
        char line[128];
        std::snprintf(line, sizeof(line), "eval step %lld | loss %.4f", static_cast<long long>(state_.step), el);
        rlog.line(line);
        emit({{"step", state_.step}, {"eval_loss", el}, {"eval_entropy", eval_entropy_},
              {"eval_mean_token_accuracy", eval_token_accuracy_}});
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
  const std::string phases = phase_table(model_.ops().phase_seconds(), state_.step - first, step_seconds);
  if (rank0 && state_.step > first) std::fputs(phases.c_str(), stdout);
  const auto phase_rec = phase_record(env_, model_.ops().phase_seconds(), state_.step - first, step_seconds, run_all);
  if (state_.step > first) emit({{"step", state_.step}, {"phases", phase_rec}});  // the table as data (perf/scaling)
  // The end: the final checkpoint first (the work is kept before a final evaluation that may take long, and that a
  // preemption's SIGKILL may cut short: before 2026-11-28 the checkpoint came after it), then the evaluation (not
  // when stopped by a signal; its loss is in metrics and the summary, not in that checkpoint's best_eval_loss),
  // the summary.
  if (ckpt_->enabled() && state_.step > first) {
    ckpt_->save(state_);
    ++res.checkpoints;
  }
  const auto [el, acc] = stop::stopped_early() ? std::pair<double, double>(-1, -1) : evaluate(true);
  if (el >= 0) {
    state_.best_eval_loss = std::min(state_.best_eval_loss, el);
    res.final_eval_loss = el;
    res.best_eval_loss = state_.best_eval_loss;
    char line[160];
    int n = std::snprintf(line, sizeof(line), "held-out loss %.4f", el);
    if (acc >= 0) std::snprintf(line + n, sizeof(line) - n, " | held-out accuracy %.1f%% (%lld/%zu exact)", 100.0 * acc,
                                static_cast<long long>(std::llround(acc * static_cast<double>(eval_.size()))), eval_.size());
    log::info(line);
    nlohmann::json j = {{"step", state_.step}, {"eval_loss", el}, {"eval_entropy", eval_entropy_},
                        {"eval_mean_token_accuracy", eval_token_accuracy_}};
    if (acc >= 0) j["eval_accuracy"] = acc;
    emit(j);
  }
  res.eval_accuracy = acc;
  res.steps = state_.step;
  res.skipped = state_.skipped_steps;
  res.overflows = state_.overflow_steps;
  res.seconds = seconds_since(t0);
  // This run's tokens (every token of its batches) per second of its training steps: until 2026-11-28 the loss tokens
  // since step 0 (a resumed run's earlier steps included) over this process's wall time.
  res.tokens_per_second = step_seconds > 0 ? run_all / step_seconds : 0;
  rlog.flush();
  if (rank0 && !opts_.log_dir.empty()) {
    std::ostringstream s;  // job_summary.txt, written whole (RunLog::write_summary)
    s << "mgrl " << build_info().version << " sft\n"
      << "ranks: " << env_.size() << "\n"
      << "wall time: " << human_time(res.seconds) << " (" << res.seconds << " s)\n"
      << "steps: " << res.steps << " (skipped: " << res.skipped << ")\n"
      << scaler_summary(state_, opt_->scaling())
      << "tokens in the loss since step 0: " << state_.tokens_seen << "\n"
      << "this run: " << run_all << " tokens in its batches, " << res.tokens_per_second
      << " tokens/s over its training steps (" << step_seconds << " s)\n"
      << "final train loss: " << res.final_loss << "\n"
      << "final eval loss: " << (res.final_eval_loss >= 0 ? std::to_string(res.final_eval_loss) : "none") << "\n"
      << "best eval loss: " << (res.best_eval_loss >= 0 ? std::to_string(res.best_eval_loss) : "none") << "\n";
    if (acc >= 0) s << "held-out accuracy: " << acc << "\n";
    s << "checkpoints written: " << res.checkpoints << (opts_.checkpoint.dir.empty() ? "" : " in " + opts_.checkpoint.dir) << "\n";
    if (state_.step > first) s << "rank 0 " << phases;
    rlog.write_summary(s.str());
  }
  return res;
}

}  // namespace mgrl::train
