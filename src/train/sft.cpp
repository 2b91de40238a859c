// sft.cpp: the supervised fine-tuning loop.
#include "train/sft.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "dist/device.h"
#include "io/hf_config.h"
#include "io/tfevents.h"

#if MGRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mgrl::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string human_time(double s) {
  char buf[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof(buf), "%lds", t);
  return buf;
}

double host_peak_rss_gib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is in KiB on Linux
}

void mkdir_p(const std::string& dir) {
  std::string path;
  for (std::size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!path.empty()) ::mkdir(path.c_str(), 0755);
    }
    if (i < dir.size()) path += dir[i];
  }
}

// The padded batch of some examples, and the loss weights (1 / n_tokens at completion positions).
model::Batch make_batch(const std::vector<const Example*>& ex, double inv_tokens, std::vector<float>* weights) {
  std::vector<std::vector<std::int32_t>> seqs;
  for (const auto* e : ex) seqs.push_back(e->tokens);
  model::Batch b = model::Batch::from_sequences(seqs);
  weights->assign(b.tokens.size(), 0.0f);
  for (int i = 0; i < b.B; ++i)
    for (int t = ex[i]->prompt_len; t < b.lengths[i]; ++t) (*weights)[static_cast<std::size_t>(i) * b.L + t] = static_cast<float>(inv_tokens);
  return b;
}

std::int64_t loss_tokens(const Example& e) { return static_cast<std::int64_t>(e.tokens.size()) - e.prompt_len; }

}  // namespace

Trainable trainable_of(model::Transformer& m, bool full_finetune) {
  Trainable t;
  if (full_finetune) {
    if (m.ops().storage() != DType::F32)
      throw UserError("full fine-tuning (train.full_finetune) needs f32 weights: use the CPU backend, or LoRA on the GPU");
    t.params = static_cast<float*>(m.base_weights());
    t.grads = m.base_grads();
    MGRL_CHECK(t.grads != nullptr, "the model was built without full_finetune");
    t.n = m.base_numel();
    for (const auto& b : m.base_tensors()) t.tensors.push_back({b.name, b.shape, b.offset});
    return t;
  }
  model::LoraParams* lora = m.lora();
  if (!lora) throw UserError("nothing to train: no LoRA adapter and train.full_finetune = false");
  t.params = lora->params();
  t.grads = lora->grads();
  t.n = lora->numel();
  for (const auto& s : lora->slots()) {
    t.tensors.push_back({model::LoraParams::peft_name(s, true), {lora->config().r, s.in}, s.a_offset});
    t.tensors.push_back({model::LoraParams::peft_name(s, false), {s.out, lora->config().r}, s.b_offset});
  }
  return t;
}

SftTrainer::SftTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& model, const io::Tokenizer& tok,
                       std::vector<Example> train, std::vector<Example> eval, SftOptions opts)
    : env_(env), comm_(comm), model_(model), tok_(tok), train_(std::move(train)), eval_(std::move(eval)),
      opts_(std::move(opts)), sampler_(train_.size(), opts_.seed) {
  const int ranks = env_.size();
  if (opts_.global_batch % ranks != 0)
    throw UserError("train.batch_size (" + std::to_string(opts_.global_batch) + ") must be divisible by the number of ranks (" +
                    std::to_string(ranks) + ")");
  if ((opts_.global_batch / ranks) % opts_.grad_accum != 0)
    throw UserError("train.batch_size / ranks (" + std::to_string(opts_.global_batch / ranks) +
                    ") must be divisible by train.grad_accum (" + std::to_string(opts_.grad_accum) + ")");
  tr_ = trainable_of(model_, model_.base_grads() != nullptr);
  m_ = static_cast<float*>(model_.ops().alloc(tr_.n * sizeof(float)));
  v_ = static_cast<float*>(model_.ops().alloc(tr_.n * sizeof(float)));
  identity_ = model_identity(io::architecture_name(model_.config().arch), tr_.tensors);
  state_.rank_rng.assign(static_cast<std::size_t>(ranks), 0);
  if (model_.ops().storage() == DType::F16) state_.loss_scale = 65536.0;  // halved on every overflow
#if MGRL_WITH_CUDA
  stream_ = kernels::cuda_stream(model_.ops());
#endif
  // Gradient buckets, one per layer: the LoRA slots of a layer are contiguous in the flat buffer. Every
  // trainable value must be in exactly one bucket, else one reduction of the whole buffer is used.
  if (model::LoraParams* lora = model_.lora(); lora && model_.base_grads() == nullptr) {
    layer_ranges_.assign(static_cast<std::size_t>(model_.config().num_hidden_layers), {0, 0});
    std::size_t covered = 0;
    for (const auto& s : lora->slots()) {
      auto& r = layer_ranges_[static_cast<std::size_t>(s.layer)];
      const std::size_t begin = s.a_offset, end = s.b_offset + static_cast<std::size_t>(s.out) * lora->config().r;
      if (r.second == 0) r = {begin, end};
      r.first = std::min(r.first, begin);
      r.second = std::max(r.second, end);
      covered += end - begin;
    }
    std::size_t spans = 0;
    for (const auto& r : layer_ranges_) spans += r.second - r.first;
    if (covered != tr_.n || spans != tr_.n) layer_ranges_.clear();
  }
}

SftTrainer::~SftTrainer() {
  model_.ops().release(m_);
  model_.ops().release(v_);
}

std::string SftTrainer::params_hash() {
  std::vector<float> host(tr_.n);
  model_.ops().download(host.data(), tr_.params, tr_.n * sizeof(float));
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes
  const auto* p = reinterpret_cast<const unsigned char*>(host.data());
  for (std::size_t i = 0; i < tr_.n * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void SftTrainer::save_checkpoint() {
  // Every rank must hold the same weights: compare a hash with rank 0's before writing.
  const std::string mine = params_hash();
  const std::string root = env_.broadcast(mine, 0);
  const int mismatch = env_.allreduce_max(mine != root ? 1 : 0);
  if (mismatch) {
    const int first = env_.allreduce_min(mine != root ? env_.rank() : env_.size());
    throw FatalError("the trainable weights of rank " + std::to_string(first) + " differ from rank 0's at step " +
                     std::to_string(state_.step) + " (hash " + (env_.rank() == first ? mine : std::string("?")) +
                     " vs " + root + "): the ranks have diverged; stopping instead of writing a checkpoint");
  }
  if (env_.rank() != 0) return;
  Checkpoint ck;
  ck.state = state_;
  for (auto& c : ck.state.rank_rng) c = static_cast<std::uint64_t>(state_.step);
  ck.tensors = tr_.tensors;
  ck.params.resize(tr_.n);
  ck.adam_m.resize(tr_.n);
  ck.adam_v.resize(tr_.n);
  auto& ops = model_.ops();
  ops.download(ck.params.data(), tr_.params, tr_.n * 4);
  ops.download(ck.adam_m.data(), m_, tr_.n * 4);
  ops.download(ck.adam_v.data(), v_, tr_.n * 4);
  ck.config_text = opts_.config_text;
  ck.model_identity = identity_;
  ck.mgrl_version = build_info().version;
  write_checkpoint(opts_.checkpoint_dir, ck);
  prune_checkpoints(opts_.checkpoint_dir, opts_.keep_last);
}

void SftTrainer::load_checkpoint(const std::string& path) {
  Checkpoint ck = read_checkpoint(path, identity_);
  if (ck.params.size() != tr_.n) throw UserError(path + ": holds " + std::to_string(ck.params.size()) +
                                                 " trainable values, this run has " + std::to_string(tr_.n));
  if (static_cast<int>(ck.state.rank_rng.size()) != env_.size())
    log::warn_once(path + ": written by " + std::to_string(ck.state.rank_rng.size()) + " ranks, resumed on " +
                   std::to_string(env_.size()) + " (the data order is the same; per-rank random streams restart)");
  auto& ops = model_.ops();
  ops.upload(tr_.params, ck.params.data(), tr_.n * 4);
  ops.upload(m_, ck.adam_m.data(), tr_.n * 4);
  ops.upload(v_, ck.adam_v.data(), tr_.n * 4);
  state_ = ck.state;
  state_.rank_rng.assign(static_cast<std::size_t>(env_.size()), static_cast<std::uint64_t>(state_.step));
}

double SftTrainer::train_step() {
  auto& ops = model_.ops();
  const int ranks = env_.size(), rank = env_.rank();
  const auto global = sampler_.next(state_.cursor, opts_.global_batch);
  const int local_n = opts_.global_batch / ranks, micro = local_n / opts_.grad_accum;
  std::vector<const Example*> local;
  for (int i = 0; i < local_n; ++i) local.push_back(&train_[global[static_cast<std::size_t>(rank * local_n + i)]]);
  std::int64_t n_tokens = 0;
  for (std::size_t i : global) n_tokens += loss_tokens(train_[i]);  // every rank knows the global batch
  const double inv = 1.0 / static_cast<double>(std::max<std::int64_t>(1, n_tokens));

  // fp16 storage: dynamic loss scaling (the loss weights are multiplied by the scale, the update divides it
  // out); bf16 and f32 need none.
  const bool scaling = ops.storage() == DType::F16;
  const double scale = scaling ? state_.loss_scale : 1.0;
  ops.zero(tr_.grads, tr_.n * sizeof(float));
  double loss_local = 0;
  std::vector<float> w, lp;
  for (int a = 0; a < opts_.grad_accum; ++a) {
    std::vector<const Example*> mb(local.begin() + a * micro, local.begin() + (a + 1) * micro);
    const model::Batch b = make_batch(mb, inv, &w);
    lp.assign(b.tokens.size(), 0.0f);
    const std::uint64_t seed = random_bits(random_bits(opts_.seed, static_cast<std::uint64_t>(state_.step)),
                                           static_cast<std::uint64_t>(rank * opts_.grad_accum + a));
    model_.forward(b, lp.data(), true, true, seed);
    for (std::size_t i = 0; i < lp.size(); ++i) loss_local -= static_cast<double>(w[i]) * lp[i];
    if (scaling)
      for (auto& x : w) x = static_cast<float>(x * scale);
    // LoRA: in the last micro-batch, each layer's gradients are reduced over ranks as soon as the backward
    // has finished them (asynchronously on the GPU, overlapping the layers still to come).
    const bool buckets = a + 1 == opts_.grad_accum && !layer_ranges_.empty();
    model_.backward(w.data(), buckets ? std::function<void(int)>([&](int l) {
                      const auto [begin, end] = layer_ranges_[static_cast<std::size_t>(l)];
                      if (end > begin) comm_.allreduce_sum_async(tr_.grads + begin, end - begin, DType::F32, stream_);
                    })
                                      : std::function<void(int)>());
  }
  if (layer_ranges_.empty()) comm_.allreduce_sum(tr_.grads, tr_.n, DType::F32, stream_);
  comm_.wait(stream_);
  comm_.synchronize();
  const double norm = std::sqrt(ops.sum_squares(tr_.grads, tr_.n)) / scale;  // identical on every rank
  const double loss = env_.allreduce_sum(loss_local);
  state_.tokens_seen += n_tokens;
  if (!std::isfinite(norm)) {  // every rank sees the same reduced gradients, so every rank skips
    ++state_.skipped_steps;
    ++state_.step;
    if (scaling) {
      state_.loss_scale = std::max(1.0, state_.loss_scale / 2);
      state_.scaler_good_steps = 0;
    }
    last_norm_ = norm;
    return loss;
  }
  if (scaling && ++state_.scaler_good_steps >= 1000) {  // grow again after 1000 good steps
    state_.loss_scale = std::min(65536.0 * 256, state_.loss_scale * 2);
    state_.scaler_good_steps = 0;
  }
  kernels::Ops::AdamW hp = opts_.adamw;
  hp.lr = static_cast<float>(opts_.schedule.at(state_.step));
  hp.step = state_.step + 1 - state_.skipped_steps;
  const double clip = opts_.max_grad_norm > 0 && norm > opts_.max_grad_norm ? opts_.max_grad_norm / norm : 1.0;
  hp.grad_scale = static_cast<float>(clip / scale);
  ops.adamw(tr_.params, tr_.grads, m_, v_, tr_.n, hp);
  ++state_.step;
  last_norm_ = norm;
  return loss;
}

std::pair<double, double> SftTrainer::evaluate(bool accuracy) {
  if (eval_.empty()) return {-1, -1};
  const std::size_t N = eval_.size();
  const std::size_t lo = N * env_.rank() / env_.size(), hi = N * (env_.rank() + 1) / env_.size();
  double loss = 0;
  long long tokens = 0;
  std::vector<float> w, lp;
  for (std::size_t s = lo; s < hi; s += static_cast<std::size_t>(opts_.eval_batch)) {
    std::vector<const Example*> mb;
    for (std::size_t i = s; i < std::min(hi, s + opts_.eval_batch); ++i) mb.push_back(&eval_[i]);
    const model::Batch b = make_batch(mb, 1.0, &w);
    lp.assign(b.tokens.size(), 0.0f);
    model_.forward(b, lp.data(), true, false);
    for (std::size_t i = 0; i < lp.size(); ++i) loss -= static_cast<double>(w[i]) * lp[i];
    for (const auto* e : mb) tokens += loss_tokens(*e);
  }
  const double mean = env_.allreduce_sum(loss) / static_cast<double>(std::max(1LL, env_.allreduce_sum(tokens)));
  const double acc = accuracy && opts_.accuracy ? opts_.accuracy(eval_) : -1;
  return {mean, acc};
}

SftResult SftTrainer::run() {
  SftResult res;
  const auto t0 = Clock::now();
  // Resume.
  std::string resume_from;
  if (opts_.resume == "auto") {
    if (!opts_.checkpoint_dir.empty())
      if (auto p = newest_checkpoint(opts_.checkpoint_dir)) resume_from = *p;
  } else if (!opts_.resume.empty() && opts_.resume != "none") {
    resume_from = opts_.resume;
  }
  env_.agree([&] {
    if (!resume_from.empty()) load_checkpoint(resume_from);
  });
  if (!resume_from.empty()) log::info("resumed from " + resume_from + " at step " + std::to_string(state_.step));

  const bool rank0 = env_.rank() == 0;
  std::unique_ptr<std::ofstream> metrics;
  std::unique_ptr<io::TfEventsWriter> tb;
  if (rank0 && !opts_.log_dir.empty()) {
    mkdir_p(opts_.log_dir);
    metrics = std::make_unique<std::ofstream>(opts_.log_dir + "/metrics.jsonl", std::ios::app);
    tb = std::make_unique<io::TfEventsWriter>(opts_.log_dir);
  }
  // The progress line: on a terminal, and not under mpirun (Open MPI gives ranks a pseudo-terminal even
  // when its own output goes to a file).
  const bool tty = rank0 && ::isatty(STDOUT_FILENO) && !std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("SLURM_JOB_ID");
  const double flops_per_token =
      (model_.base_grads() ? 6.0 : 4.0) * static_cast<double>(model_.base_numel());  // full FT: 6N; LoRA: ~4N
  auto emit = [&](const nlohmann::json& j) {
    if (metrics) *metrics << j.dump() << "\n" << std::flush;
    if (tb)
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it.value().is_number() && it.key() != "step") tb->scalar(it.key(), it.value().get<double>(), state_.step);
  };

  const std::int64_t first = state_.step;
  auto window = Clock::now();
  std::int64_t window_tokens = 0;
  double loss = 0;
  const std::int64_t end = opts_.stop_at_step > 0 ? std::min(opts_.stop_at_step, opts_.max_steps) : opts_.max_steps;
  while (state_.step < end) {
    const std::int64_t before = state_.tokens_seen;
    const double lr = opts_.schedule.at(state_.step);
    loss = train_step();
    window_tokens += state_.tokens_seen - before;
    res.final_loss = loss;
    const bool last = state_.step == end;
    if (rank0 && (state_.step % std::max(1, opts_.log_every) == 0 || last)) {
      const double dt = seconds_since(window);
      const double tps = dt > 0 ? static_cast<double>(window_tokens) / dt : 0;
      char line[256];
      int n = std::snprintf(line, sizeof(line), "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s",
                            static_cast<long long>(state_.step), static_cast<long long>(opts_.max_steps), loss, lr,
                            last_norm_, tps);
      if (opts_.gpu_peak_tflops > 0)
        n += std::snprintf(line + n, sizeof(line) - n, " | MFU %.1f%%",
                           100.0 * tps * flops_per_token / (opts_.gpu_peak_tflops * 1e12 * env_.size()));
      peak_gpu_ = std::max(peak_gpu_, dist::gpu_memory_used());
      if (peak_gpu_ > 0)
        std::snprintf(line + n, sizeof(line) - n, " | peak GPU mem %.2f GiB", static_cast<double>(peak_gpu_) / (1 << 30));
      else
        std::snprintf(line + n, sizeof(line) - n, " | peak host mem %.2f GiB", host_peak_rss_gib());
      if (tty) std::printf("\r\033[K");
      log::info(line);
      emit({{"step", state_.step}, {"loss", loss}, {"lr", lr}, {"grad_norm", last_norm_}, {"tokens_per_second", tps},
            {"skipped_steps", state_.skipped_steps}});
      window = Clock::now();
      window_tokens = 0;
    }
    if (tty) {
      const double done = static_cast<double>(state_.step - first), left = static_cast<double>(opts_.max_steps - state_.step);
      const double eta = done > 0 ? seconds_since(t0) / done * left : 0;
      std::printf("\r\033[K[%3.0f%%] step %lld/%lld, ETA %s", 100.0 * state_.step / opts_.max_steps,
                  static_cast<long long>(state_.step), static_cast<long long>(opts_.max_steps), human_time(eta).c_str());
      std::fflush(stdout);
    }
    if (opts_.eval_every > 0 && state_.step % opts_.eval_every == 0 && !last) {
      const auto [el, acc] = evaluate(false);
      if (el >= 0) {
        state_.best_eval_loss = std::min(state_.best_eval_loss, el);
        if (tty) std::printf("\r\033[K");
        char line[128];
        std::snprintf(line, sizeof(line), "eval step %lld | loss %.4f", static_cast<long long>(state_.step), el);
        log::info(line);
        emit({{"step", state_.step}, {"eval_loss", el}});
      }
    }
    if (!opts_.checkpoint_dir.empty() && opts_.checkpoint_every > 0 && state_.step % opts_.checkpoint_every == 0 && !last) {
      save_checkpoint();
      ++res.checkpoints;
    }
  }
  if (tty) std::printf("\r\033[K");
  // The end: evaluation, final checkpoint, summary.
  const auto [el, acc] = evaluate(true);
  if (el >= 0) {
    state_.best_eval_loss = std::min(state_.best_eval_loss, el);
    res.final_eval_loss = el;
    res.best_eval_loss = state_.best_eval_loss;
    char line[160];
    int n = std::snprintf(line, sizeof(line), "held-out loss %.4f", el);
    if (acc >= 0) std::snprintf(line + n, sizeof(line) - n, " | held-out accuracy %.1f%% (%lld/%zu exact)", 100.0 * acc,
                                static_cast<long long>(std::llround(acc * static_cast<double>(eval_.size()))), eval_.size());
    log::info(line);
    nlohmann::json j = {{"step", state_.step}, {"eval_loss", el}};
    if (acc >= 0) j["eval_accuracy"] = acc;
    emit(j);
  }
  res.eval_accuracy = acc;
  if (!opts_.checkpoint_dir.empty() && state_.step > first) {
    save_checkpoint();
    ++res.checkpoints;
  }
  res.steps = state_.step;
  res.skipped = state_.skipped_steps;
  res.seconds = seconds_since(t0);
  res.tokens_per_second = res.seconds > 0 ? static_cast<double>(state_.tokens_seen) / res.seconds : 0;
  if (tb) tb->flush();
  if (rank0 && !opts_.log_dir.empty()) {
    std::ofstream s(opts_.log_dir + "/job_summary.txt");
    s << "mgrl " << build_info().version << " sft\n"
      << "ranks: " << env_.size() << "\n"
      << "wall time: " << human_time(res.seconds) << " (" << res.seconds << " s)\n"
      << "steps: " << res.steps << " (skipped: " << res.skipped << ")\n"
      << "tokens: " << state_.tokens_seen << " (" << res.tokens_per_second << " tokens/s over the run)\n"
      << "final train loss: " << res.final_loss << "\n"
      << "final eval loss: " << (res.final_eval_loss >= 0 ? std::to_string(res.final_eval_loss) : "none") << "\n"
      << "best eval loss: " << (res.best_eval_loss >= 0 ? std::to_string(res.best_eval_loss) : "none") << "\n";
    if (acc >= 0) s << "held-out accuracy: " << acc << "\n";
    s << "checkpoints written: " << res.checkpoints << (opts_.checkpoint_dir.empty() ? "" : " in " + opts_.checkpoint_dir) << "\n";
  }
  return res;
}

}  // namespace mgrl::train
