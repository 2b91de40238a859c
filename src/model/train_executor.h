// train_executor.h: the training executor: activation arenas planned from the run's maxima, the forward over packed
// batches to per-token log-probs (the LM head fused with log-softmax), no-grad scoring passes, loss weights, and the
// backward to LoRA (or, for full fine-tuning, base) gradients, written once against kernels::Ops.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/batch.h"
#include "model/model_def.h"

namespace mgrl::model {

// What TrainExecutor::token_stats gives per position: the entropy of the predicted distribution, 1 where the token
// is its most likely one (else 0), the mean of its logits (trl's "entropy", "mean_token_accuracy", "logits/..."), and
// log sum_v p_v^2 (trl's log_sum_sq_probs: DPO's WPO weights).
struct TokenStats {
  std::vector<float> entropy, top1, mean_logit, log_sum_sq;
};

class TrainExecutor {
 public:
  explicit TrainExecutor(ModelDef& def);
  ~TrainExecutor();
  TrainExecutor(const TrainExecutor&) = delete;
  TrainExecutor& operator=(const TrainExecutor&) = delete;

  // Forward. logprobs (host, packed [T]; may be null: not read back): at row offsets[b] + t, log p(token t of b |
  // tokens < t of b) for 1 <= t < length(b); 0 at each sequence's first row. Every sequence needs 1 <= length <=
  // max_position_embeddings. use_lora = false runs the base model (GRPO's reference policy). train = true keeps what
  // backward() needs and applies LoRA dropout (seeded by dropout_seed). logit_scale multiplies the logits before the
  // log-softmax (1 / temperature: GRPO's tempered policy).
  void forward(const Batch& batch, float* logprobs, bool use_lora = true, bool train = false,
               std::uint64_t dropout_seed = 0, float logit_scale = 1.0f);
  // SFT's training forward, whose loss weights (host, packed [T], as add_loss) are known before it runs:
  // forward(batch, nullptr, true, true, dropout_seed) then add_loss(weights, loss_acc), with the LM head's backward
  // done in the same pass over each chunk of logits (which the backward would otherwise compute again): the gradient
  // into the final hidden state for the weights weights * grad_scale (dynamic loss scaling; the loss takes the
  // unscaled ones), and the head's own gradient when it is trained. backward(nullptr) then starts after the LM head;
  // everything is bitwise what forward + add_loss + backward(weights * grad_scale, rounded to f32) give.
  // GRPO, DPO, PPO and scoring keep forward/add_loss/backward: their weights depend on this forward's log-probs.
  void forward_with_loss(const Batch& batch, const float* weights, double grad_scale, double* loss_acc,
                         std::uint64_t dropout_seed = 0, double* stats_acc = nullptr);
  // Knowledge distillation's teacher (trl's DistillationTrainer; `mgrl distill`): what the LM head would read.
  struct Teacher {
    const void* rows = nullptr;  // the teacher's head_input() rows [R, Dt] (storage dtype, backend memory)
    int R = 0, Dt = 0;
    const void* head = nullptr;  // its LM head [V, Dt] (storage dtype)
    float softcap = 0.0f;        // its final-logit soft-capping (0: none)
  };
  // A no-grad pass (the scoring arena's buffers, as score()) up to the LM head: its input rows, the final norm's
  // output of the rows that predict a scored token (Batch::scored_from; all rows when the head would run on all),
  // [*rows, hidden] in backend memory, valid until this executor's next scoring pass. The teacher of
  // forward_with_divergence runs this on the student's batch: the same rows in the same order.
  const void* head_input(const Batch& batch, int* rows);
  // The distillation's training forward: forward_with_loss with the loss sum_i weights[i] * D_i instead of the
  // log-likelihood, D_i the divergence (Ops::lm_head_divergence: beta 0 forward KL, 1 reverse KL, else the generalized
  // JSD) between this model's and the teacher's next-token distributions at temperature 1 / inv_temperature, both
  // predicting token i; its gradient into the final hidden state for weights * grad_scale, added to *loss_acc with
  // the unscaled weights; entropy_acc (one double, backend memory, optional): adds sum_i weights[i] * H_i, H_i the
  // entropy of this model's distribution. backward(nullptr) then starts after the LM head.
  void forward_with_divergence(const Batch& batch, const float* weights, double grad_scale, double* loss_acc,
                               const Teacher& teacher, float beta, float inv_temperature,
                               std::uint64_t dropout_seed = 0, double* entropy_acc = nullptr);
  // The same without a gradient, in the scoring arena (held-out evaluation): sum_i weights[i] * D_i into *loss_acc,
  // the entropies into *entropy_acc (optional).
  void score_divergence(const Batch& batch, const float* weights, double* loss_acc, const Teacher& teacher, float beta,
                        float inv_temperature, double* entropy_acc = nullptr);
  // Allocates the activations for batches of up to max_tokens tokens now (training arena; scoring arena too when
  // `scoring`), so that no later forward allocates: memory is planned once, from the run's maxima.
  void plan(int max_tokens, bool scoring = false);
  // The scoring arena alone (a model that only scores: distillation's teacher).
  void plan_scoring(int max_tokens);
  // A no-grad scoring pass, as forward(train = false) but in activation buffers of its own: it never disturbs what a
  // pending backward() needs.
  void score(const Batch& batch, float* logprobs, bool use_lora = true, float logit_scale = 1.0f);
  // For the last training forward: uploads the loss weights (host, packed [T]) and adds -sum_i weights[i] *
  // logprobs[i] to *loss_acc (one double in backend memory) without a synchronisation; backward(nullptr) then uses
  // these weights. stats_acc (two doubles in backend memory, optional; forward_with_loss takes it too): adds
  // sum_i weights[i] * entropy[i] and sum_i weights[i] * top1[i], the LM head's per-row entropy and top-1 hit
  // (Ops::lm_head_logprob_forward's stats: trl's SFT metrics; with weights 1 / loss tokens, their means), which a
  // training forward computes while set_token_stats(true).
  void add_loss(const float* weights, double* loss_acc, double* stats_acc = nullptr);
  void set_token_stats(bool on) { token_stats_ = on; }
  // NEFTune (SFT's train.neftune_noise_alpha): training forwards add uniform noise of magnitude
  // alpha / sqrt(sequence length x hidden) to the input embeddings (Ops::add_uniform_noise, keyed by Batch::seq_keys
  // and the forward's dropout_seed); 0: none. Scoring and evaluation passes never do.
  void set_embedding_noise(float alpha) { embedding_noise_ = alpha; }
  void set_score_stats(bool on) { score_stats_ = on; }  // the same for score() passes (token_stats(true))
  // The LM head's per-token statistics of the last training forward (set_token_stats), host [T] each in packed rows as
  // its log-probs (position i: the distribution that predicted token i; 0 at each sequence's first position, at
  // positions not scored and where the target was ignored).
  // scoring: of the last score() pass instead.
  TokenStats token_stats(bool scoring = false) const;
  // Backward of loss = -sum_i weights[i] * logprobs[i] (weights host, packed [T]; null: those of add_loss) for the
  // last forward(train = true); after forward_with_loss, weights must be null (that call took them). Gradients
  // accumulate into the LoRA gradients (and the base gradients when full FT).
  // layer_done(l), when given, runs as soon as layer l's gradients are complete (from the last layer to the first).
  // dhidden (host [T, hidden]; null: none) is a gradient with respect to the final hidden state (final_hidden()) of
  // a loss term computed from it outside the model (PPO's value head), added to what the LM head gives.
  // entropy_weights (host, packed [T] as weights; null: none; GRPO's entropy bonus): the loss also holds
  // -sum_i entropy_weights[i] * H_i, H_i the entropy of the distribution that predicted token i (the forward's, which
  // needs set_token_stats(true)); not after forward_with_loss.
  void backward(const float* weights, const std::function<void(int)>& layer_done = {},
                const float* dhidden = nullptr, const float* entropy_weights = nullptr);
  // The final hidden state (after the final norm: what the LM head reads) of the last forward() (training or not;
  // score() passes have buffers of their own), host [T, hidden] in packed rows (PPO's value head reads it).
  std::vector<float> final_hidden() const;
  // Gradient of the last backward's loss with respect to the input embeddings, host [T, hidden].
  std::vector<float> input_embedding_grad() const;
  // Full logits of the last forward, host [T, vocab] (tests, debugging).
  std::vector<float> logits() const;
  // Drops every arena (their LoRA buffers depend on the adapter: rebuilt when next used).
  void reset();

  // Bytes of the training arena for micro-batches of up to T tokens (what plan(T) allocates), without allocating.
  std::size_t activation_bytes(int T) const;
  // The same from the configuration alone (nothing allocated, no model needed): lora null for no adapter;
  // head_scratch_bytes is the backend's Ops::lm_head_scratch_bytes(vocab_size). grads = false: the no-grad scoring
  // arena of score() instead (one activation set, no backward buffers).
  static std::size_t activation_bytes(const io::ModelConfig& cfg, const ModelOptions& opts, const LoraConfig* lora,
                                      DType storage, std::size_t head_scratch_bytes, int T, int B = 1,
                                      bool grads = true);

 private:
  struct LayerActs;
  struct PassBuffers;
  struct Arena;
  struct ArenaSpec;
  ArenaSpec spec(bool grads) const;
  static void layout(const ArenaSpec& s, int T, Arena& arena, const std::function<void*(std::size_t)>& raw);
  struct FusedLoss {  // forward_with_loss's arguments (and forward_with_divergence's)
    const float* weights;
    double grad_scale;
    double* loss_acc;
    double* stats_acc;
    const Teacher* teacher = nullptr;  // the divergence instead of the log-likelihood
    float beta = 0.0f;
  };
  bool head_input_only_ = false;         // head_input(): the pass stops before the LM head
  const void* head_input_rows_ = nullptr;  // where it left them
  bool token_stats_ = false;  // training forwards compute the LM head's entropy and top-1 stats (add_loss)
  float embedding_noise_ = 0;  // NEFTune's alpha (set_embedding_noise)
  bool score_stats_ = false;  // score() passes do
  void add_stats(double* stats_acc);
  // fused non-null: forward_with_loss (the LM head's backward in the forward)
  void forward_pass(const Batch& batch, float* logprobs, bool use_lora, bool train, std::uint64_t dropout_seed,
                    float logit_scale, const FusedLoss* fused = nullptr);
  void reserve(int T, int B);
  void release(Arena& a);
  void upload_loss_weights(const float* weights);
  // Per-token values (host, packed [T], position i for the row that predicts token i) by LM-head row [R].
  void head_rows(const float* per_token, std::vector<float>* rows) const;
  void select_scored_rows(const Batch& batch);
  void layer_forward(int l, const void* x_in, void* x_out, LayerActs& a, bool use_lora, bool train,
                     std::uint64_t seed);
  void layer_backward(int l, LayerActs& a, void* dx);
  void linear_with_lora(int l, Module m, void* y, const void* x, const void* W, const void* bias, int T, LayerActs& a,
                        bool use_lora, bool train, std::uint64_t seed);
  void linear_with_lora_backward(int l, Module m, void* dx, const void* dy, const void* x, const void* W, float* dW,
                                 float* dbias, int T, LayerActs& a, bool accumulate);
  // The layers ms[0..n) that read x, forward and backward, their adapters as one group (block.h lora_add_group;
  // Ops::lora_group_backward): used when lora_groups_enabled() and no dropout mask makes their inputs differ. The
  // backward writes dx (the first layer's product), then adds to it.
  bool grouped_lora(bool train) const;
  void linears_with_lora(int l, const LayerWeights& Lw, const Module* ms, void* const* ys, int n, const void* x, int T,
                         LayerActs& a, bool use_lora);
  // The same through Ops::linear_lora_group_forward when every layer of the group has an adapter and the backend
  // has a fused path for them (CUDA, MGRL_LORA_CONCAT=1); false, nothing done, otherwise.
  bool linears_with_lora_fused(int l, const LayerWeights& Lw, const Module* ms, void* const* ys, int n, const void* x,
                               int T, LayerActs& a);
  void linears_with_lora_backward(int l, const LayerWeights& Lw, const LayerGrads& Lg, const Module* ms,
                                  const void* const* dys, int n, void* dx, const void* x, int T, LayerActs& a);

  ModelDef& def_;
  const io::ModelConfig& cfg_;
  kernels::Ops& ops_;
  const ModelOptions& opts_;
  // Training forwards (+ backward) and no-grad scoring passes; cur_ is the one in use.
  std::unique_ptr<Arena> train_arena_, score_arena_;
  Arena* cur_ = nullptr;
};

}  // namespace mgrl::model
