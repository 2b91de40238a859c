// transformer.h: the decoder-only transformer (Llama / Qwen2 / Qwen3) with LoRA, as one object for the callers
// (train/, rl/, app/): a thin facade that owns the three parts and forwards to them: the model definition
// (model_def.h: config, weights by typed handle, LoRA attachment), the training executor (train_executor.h:
// arenas, forward/backward over packed batches) and the inference engine (inference_engine.h: paged KV cache).
// Single-device: the model knows nothing of ranks.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "kernels/ops.h"
#include "model/batch.h"
#include "model/inference_engine.h"
#include "model/kv_cache.h"
#include "model/lora.h"
#include "model/model_def.h"
#include "model/train_executor.h"

namespace mgrl::model {

class Transformer {
 public:
  // gatherer: the ranks a shard_base model is sharded over (ModelDef).
  Transformer(io::ModelConfig cfg, kernels::Ops& ops, ModelOptions opts = {}, Gatherer* gatherer = nullptr);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // The three parts.
  ModelDef& definition() { return *def_; }
  const ModelDef& definition() const { return *def_; }
  TrainExecutor& executor() { return *train_; }
  InferenceEngine& engine() { return *infer_; }

  // ---- model definition (model_def.h) ----
  void load_weights(const std::string& dir) { def_->load_weights(dir); }
  void init_random(std::uint64_t seed, float std) { def_->init_random(seed, std); }
  // Adds LoRA adapters (replacing any); the executors' buffers are rebuilt for them when next used.
  LoraParams& add_lora(const LoraConfig& cfg, std::uint64_t seed);
  LoraParams* lora() { return def_->lora(); }
  const io::ModelConfig& config() const { return def_->config(); }
  const ModelOptions& options() const { return def_->options(); }
  kernels::Ops& ops() { return def_->ops(); }
  using BaseTensor = ModelDef::BaseTensor;
  const std::vector<BaseTensor>& base_tensors() const { return def_->base_tensors(); }
  std::size_t base_numel() const { return def_->base_numel(); }
  void* base_weights() { return def_->base_weights(); }
  float* base_grads() { return def_->base_grads(); }
  float* trainable_base() { return def_->trainable_base(); }
  bool has_master_weights() const { return def_->has_master_weights(); }
  void master_weights_changed() { def_->master_weights_changed(); }
  std::vector<float> base_tensor_host(const std::string& name) const { return def_->base_tensor_host(name); }

  // ---- training executor (train_executor.h) ----
  void forward(const Batch& batch, float* logprobs, bool use_lora = true, bool train = false,
               std::uint64_t dropout_seed = 0, float logit_scale = 1.0f) {
    train_->forward(batch, logprobs, use_lora, train, dropout_seed, logit_scale);
  }
  void plan(int max_tokens, bool scoring = false) { train_->plan(max_tokens, scoring); }
  void plan_scoring(int max_tokens) { train_->plan_scoring(max_tokens); }
  void score(const Batch& batch, float* logprobs, bool use_lora = true, float logit_scale = 1.0f) {
    train_->score(batch, logprobs, use_lora, logit_scale);
  }
  void add_loss(const float* weights, double* loss_acc, double* stats_acc = nullptr) {
    train_->add_loss(weights, loss_acc, stats_acc);
  }
  void set_token_stats(bool on) { train_->set_token_stats(on); }
  void set_embedding_noise(float alpha) { train_->set_embedding_noise(alpha); }  // NEFTune (TrainExecutor)
  TokenStats token_stats(bool scoring = false) const { return train_->token_stats(scoring); }
  void set_score_stats(bool on) { train_->set_score_stats(on); }
  void forward_with_loss(const Batch& batch, const float* weights, double grad_scale, double* loss_acc,
                         std::uint64_t dropout_seed = 0, double* stats_acc = nullptr) {
    train_->forward_with_loss(batch, weights, grad_scale, loss_acc, dropout_seed, stats_acc);
  }
  void backward(const float* weights, const std::function<void(int)>& layer_done = {},
                const float* dhidden = nullptr, const float* entropy_weights = nullptr) {
    train_->backward(weights, layer_done, dhidden, entropy_weights);
  }
  std::vector<float> final_hidden() const { return train_->final_hidden(); }
  // Knowledge distillation (TrainExecutor::head_input, forward_with_divergence)
  using Teacher = TrainExecutor::Teacher;
  // This model as the teacher of a student's batch: its LM head's input rows (a no-grad pass) and its head.
  Teacher as_teacher(const Batch& batch) {
    Teacher t;
    t.rows = train_->head_input(batch, &t.R);
    t.Dt = static_cast<int>(def_->config().hidden_size);
    t.head = def_->head();
    t.softcap = def_->final_softcap();
    return t;
  }
  void forward_with_divergence(const Batch& batch, const float* weights, double grad_scale, double* loss_acc,
                               const Teacher& teacher, float beta, float inv_temperature,
                               std::uint64_t dropout_seed = 0, double* entropy_acc = nullptr) {
    train_->forward_with_divergence(batch, weights, grad_scale, loss_acc, teacher, beta, inv_temperature,
                                    dropout_seed, entropy_acc);
  }
  void score_divergence(const Batch& batch, const float* weights, double* loss_acc, const Teacher& teacher, float beta,
                        float inv_temperature, double* entropy_acc = nullptr) {
    train_->score_divergence(batch, weights, loss_acc, teacher, beta, inv_temperature, entropy_acc);
  }
  std::vector<float> input_embedding_grad() const { return train_->input_embedding_grad(); }
  std::vector<float> logits() const { return train_->logits(); }
  std::size_t activation_bytes(int T) const { return train_->activation_bytes(T); }

  // ---- inference engine (inference_engine.h) ----
  static constexpr int kMaxRecordedRows = InferenceEngine::kMaxRecordedRows;
  const float* infer(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& slot,
                     const std::vector<std::int32_t>& pos, const std::vector<std::int32_t>& out_rows, KvCache& cache,
                     bool use_lora = true) {
    return infer_->infer(tokens, slot, pos, out_rows, cache, use_lora);
  }

 private:
  // Declared in destruction order's reverse: the engine (which forgets the backend's recordings) goes first, the
  // definition (the weights every part reads) last.
  std::unique_ptr<ModelDef> def_;
  std::unique_ptr<TrainExecutor> train_;
  std::unique_ptr<InferenceEngine> infer_;
};

}  // namespace mgrl::model
