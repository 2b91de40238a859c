// grad_sync.cpp: per-layer gradient buckets, the allreduce of the gradients and their global norm.
#include "train/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace mgrl::train {

GradSync::GradSync(dist::Comm& comm, model::Transformer& model, const Trainable& tr)
    : comm_(comm), model_(model), tr_(tr) {
  stream_ = model_.ops().device_stream().cuda;  // null on the CPU
  // One bucket per layer: the LoRA slots of a layer are contiguous in the flat buffer. Every trainable value must
  // be in exactly one bucket, else one reduction of the whole buffer is used.
  model::LoraParams* lora = model_.lora();
  if (!lora || model_.base_grads() != nullptr || tr_.grads != lora->grads()) return;
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

void GradSync::zero() { model_.ops().zero(tr_.grads, tr_.n * sizeof(float)); }

void GradSync::overflow_at(std::size_t i) {
  static const float inf = std::numeric_limits<float>::infinity();  // static: an asynchronous copy reads it
  model_.ops().upload(tr_.grads + i, &inf, sizeof(float));  // on the compute stream, before the reduction
  overflow_ = false;
}

std::function<void(int)> GradSync::hook(bool last) {
  if (!last || layer_ranges_.empty()) return {};
  return [this](int l) {
    const auto [begin, end] = layer_ranges_[static_cast<std::size_t>(l)];
    if (end <= begin) return;
    if (overflow_) overflow_at(begin);
    if (comm_.backend() == dist::Backend::Cuda) {
      comm_.allreduce_sum_async(tr_.grads + begin, end - begin, DType::F32, stream_);
      return;
    }
    // MPI on the host blocks inside the backward: its time (waiting for the slower rank included) is communication,
    // not backward, in the phase table.
    const auto t0 = std::chrono::steady_clock::now();
    comm_.allreduce_sum_async(tr_.grads + begin, end - begin, DType::F32, stream_);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    model_.ops().phase_add(kernels::Phase::Backward, -dt);
    model_.ops().phase_add(kernels::Phase::Communication, dt);
  };
}

double GradSync::finish(double scale) {
  kernels::Ops& ops = model_.ops();
  // Communication: from the end of the backward to the reduced gradients, on the backend's stream (on a GPU the
  // stream waits for the collectives, so this is the part of the reduction that the backward did not hide).
  if (overflow_ && tr_.n > 0) overflow_at(0);  // not reduced by a hook (the whole buffer at once)
  ops.phase_begin(kernels::Phase::Communication);
  if (layer_ranges_.empty()) comm_.allreduce_sum(tr_.grads, tr_.n, DType::F32, stream_);
  comm_.wait(stream_);
  ops.phase_end(kernels::Phase::Communication);
  const auto t0 = std::chrono::steady_clock::now();
  comm_.synchronize();
  ops.phase_add(kernels::Phase::HostWait, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (overflow_local_ && tr_.n > 0) {
    overflow_at(0);
    overflow_local_ = false;
  }
  return std::sqrt(ops.sum_squares(tr_.grads, tr_.n)) / scale;
}

double agreed_norm(const dist::MpiEnv& env, double norm) {
  const int bad = env.allreduce_max(std::isfinite(norm) ? 0 : 1);
  return bad ? std::numeric_limits<double>::infinity() : norm;
}

}  // namespace mgrl::train
