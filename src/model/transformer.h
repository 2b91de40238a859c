// transformer.h: the decoder-only transformer (Llama / Qwen2 / Qwen3) with LoRA: weights from a
// Hugging Face directory, forward to per-token log-probs (the LM head fused with log-softmax) and
// backward to LoRA (or, for full fine-tuning, base) gradients, written once against kernels::Ops.
// Single-device: the model knows nothing of ranks.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "kernels/ops.h"
#include "model/kv_cache.h"
#include "model/lora.h"

namespace mgrl::model {

struct ModelOptions {
  bool full_finetune = false;  // base weights trainable (gradients for every tensor)
  bool recompute = false;      // keep only each layer's input; recompute the layer in the backward
  // Full fine-tuning keeps fp32 master weights (what the optimizer updates and checkpoints hold) beside the
  // storage-dtype weights the kernels read whenever storage is not f32 (the GPU); true keeps them on f32 storage
  // too (tests: the same logic on the CPU backend).
  bool master_weights = false;
};

// A packed batch: B sequences stored back to back, no padding. Sequence b is tokens[offsets[b] .. offsets[b+1]);
// every per-token array of the model (log-probs, loss weights) has the same packed layout, [T].
struct Batch {
  std::vector<std::int32_t> tokens;        // [T]
  std::vector<std::int32_t> offsets{0};    // [B + 1], offsets[0] = 0, offsets[B] = T
  int B() const { return static_cast<int>(offsets.size()) - 1; }
  int T() const { return offsets.back(); }
  int length(int b) const { return offsets[b + 1] - offsets[b]; }
  int max_len() const;
  void add(const std::vector<std::int32_t>& seq);  // appends a sequence
  static Batch from_sequences(const std::vector<std::vector<std::int32_t>>& seqs);
  // From a right-padded [B, L] layout (fixture files): row b's first lengths[b] tokens.
  static Batch from_padded(const std::int32_t* tokens, const std::int32_t* lengths, int B, int L);
};

class Transformer {
 public:
  Transformer(io::ModelConfig cfg, kernels::Ops& ops, ModelOptions opts = {});
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // Base weights from a Hugging Face directory (safetensors, single or sharded; f32, bf16 or f16),
  // checked against the config: a missing tensor or a wrong shape is a UserError naming it.
  void load_weights(const std::string& dir);
  // Random weights (normal(0, std) for matrices, 1 for norm weights, 0 for biases).
  void init_random(std::uint64_t seed, float std);
  // Adds LoRA adapters (replacing any); they start as PEFT initialises them unless loaded.
  LoraParams& add_lora(const LoraConfig& cfg, std::uint64_t seed);
  LoraParams* lora() { return lora_.get(); }
  const io::ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opts_; }
  kernels::Ops& ops() { return ops_; }

  // Forward. logprobs (host, packed [T]; may be null: not read back): at row offsets[b] + t, log p(token t of b | tokens < t of b) for
  // 1 <= t < length(b); 0 at each sequence's first row. Every sequence needs 1 <= length <= max_position_embeddings. use_lora = false runs the base model (GRPO's reference policy).
  // train = true keeps what backward() needs and applies LoRA dropout (seeded by dropout_seed).
  // logit_scale multiplies the logits before the log-softmax (1 / temperature: GRPO's tempered policy).
  void forward(const Batch& batch, float* logprobs, bool use_lora = true, bool train = false,
               std::uint64_t dropout_seed = 0, float logit_scale = 1.0f);
  // Allocates the activations for batches of up to max_tokens tokens now (training arena; scoring arena too when
  // `scoring`), so that no later forward allocates: memory is planned once, from the run's maxima.
  void plan(int max_tokens, bool scoring = false);
  // A no-grad scoring pass (e.g. GRPO's reference or old-policy log-probs), as forward(train = false) but in
  // activation buffers of its own: it never disturbs what a pending backward() needs.
  void score(const Batch& batch, float* logprobs, bool use_lora = true, float logit_scale = 1.0f);
  // For the last training forward: uploads the loss weights (host, packed [T] as logprobs) and adds the loss
  // -sum_i weights[i] * logprobs[i] to *loss_acc (one double in backend memory) on the device, without a
  // synchronisation; a following backward(nullptr) uses these weights. (forward's logprobs may then be null: no
  // download, so a training step queues its micro-batches without waiting for the device.)
  void add_loss(const float* weights, double* loss_acc);
  // Backward of loss = -sum_i weights[i] * logprobs[i] (weights host, packed [T] as logprobs; null: those of
  // add_loss) for the last
  // forward(train = true). Gradients accumulate into lora()->grads() (and base_grads() when full FT).
  // layer_done(l), when given, runs as soon as layer l's gradients are complete (layers finish from the last
  // to the first), e.g. to start reducing that layer's LoRA gradients while the backward goes on.
  // dhidden (host [T, hidden]; null: none) is a gradient with respect to the final hidden state (final_hidden()) of
  // a loss term computed from it outside the model (PPO's value head), added to what the LM head gives.
  void backward(const float* weights, const std::function<void(int)>& layer_done = {},
                const float* dhidden = nullptr);
  // The final hidden state (after the final norm: what the LM head reads) of the last forward() (training or not;
  // score() passes have buffers of their own), host [T, hidden] in packed rows (PPO's value head reads it).
  std::vector<float> final_hidden() const;
  // Gradient of the last backward's loss with respect to the input embeddings, host [T, hidden].
  std::vector<float> input_embedding_grad() const;
  // Full logits of the last forward, host [T, vocab] (tests, debugging).
  std::vector<float> logits() const;

  // Bytes of the training arena for micro-batches of up to T tokens (what plan(T) allocates), without allocating.
  std::size_t activation_bytes(int T);

  // Inference with a KV cache. Row t of the packed rows is token tokens[t] of sequence slot[t] at position
  // pos[t]; earlier positions of that sequence are in the cache or earlier rows of this call (a prompt
  // prefill and the decode steps of other sequences may share one call). Returns the f32 logits
  // [out_rows.size(), vocab] of the rows named by out_rows (a row may be named several times), in backend
  // memory, valid until the next call. Calls whose rows are all output rows (decode steps) of at most
  // kMaxRecordedRows rows are recorded once per row count and cache and replayed (Ops::run_recorded).
  static constexpr int kMaxRecordedRows = 1024;
  const float* infer(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& slot,
                     const std::vector<std::int32_t>& pos, const std::vector<std::int32_t>& out_rows, KvCache& cache,
                     bool use_lora = true);

  // Full fine-tuning: all base tensors in one flat f32 gradient buffer, in expected_tensors() order.
  struct BaseTensor {
    std::string name;
    io::Shape shape;
    std::size_t offset;  // elements into the base arena / gradient buffer
  };
  const std::vector<BaseTensor>& base_tensors() const { return base_; }
  std::size_t base_numel() const { return base_numel_; }
  void* base_weights() { return weights_; }  // storage dtype
  float* base_grads() { return base_grads_; }  // nullptr unless full_finetune
  // Full fine-tuning: the f32 weights an optimizer updates: the fp32 master copy when there is one, else the
  // weights themselves (f32 storage). After writing them, call master_weights_changed().
  float* trainable_base();
  bool has_master_weights() const { return master_ != nullptr; }
  // Rounds the master weights into the storage-dtype weights (no-op without a master copy).
  void master_weights_changed();
  std::vector<float> base_tensor_host(const std::string& name) const;

 private:
  struct Acts;
  struct LayerW;
  struct Arena;
  void forward_pass(const Batch& batch, float* logprobs, bool use_lora, bool train, std::uint64_t dropout_seed,
                    float logit_scale);
  void reserve(int T, int B);
  void reserve_arena(int T, int B);  // reserve without the clean-up of a failed allocation
  void upload_loss_weights(const float* weights);
  // The buffers of one pass through a decoder block (training keeps them per layer; inference reuses one set,
  // with the residual stream updated in place: x_in == x_mid == x_out).
  struct BlockIO {
    const void* x_in;
    void *x_mid, *x_out, *h1, *q, *k, *v, *q_pre, *k_pre, *attn, *h2, *gate, *up, *act, *tmp;
    float *rstd1, *rstd_q, *rstd_k, *rstd2;
    const std::int32_t* pos;
  };
  // One decoder block: lin(module, y, x) applies a linear layer (with its adapter), attend() fills io.attn
  // from io.q / io.k / io.v (plain causal attention in training, the KV cache in inference).
  void block_forward(int l, const BlockIO& io, int T, const std::function<void(Module, void*, const void*)>& lin,
                     const std::function<void()>& attend);
  void layer_forward(int l, const void* x_in, void* x_out, Acts& a, bool use_lora, bool train, std::uint64_t seed);
  void layer_backward(int l, Acts& a, void* dx);
  void linear_with_lora(int l, Module m, void* y, const void* x, const void* W, const void* bias, int T, Acts& a,
                        bool use_lora, bool train, std::uint64_t seed);
  void lora_add(int l, Module m, void* y, const void* x, int T, float* xa);
  void linear_with_lora_backward(int l, Module m, void* dx, const void* dy, const void* x, const void* W, float* dW,
                                 float* dbias, int T, Acts& a, bool accumulate);
  const void* w(const std::string& name) const;

  float* g(const std::string& name);

  io::ModelConfig cfg_;
  kernels::Ops& ops_;
  ModelOptions opts_;
  std::vector<BaseTensor> base_;
  std::size_t base_numel_ = 0;
  void* weights_ = nullptr;
  float* master_ = nullptr;  // fp32 master copy of weights_ (full fine-tuning on non-f32 storage)
  bool counting_ = false;    // reserve() adds up its sizes in counted_ instead of allocating (activation_bytes)
  std::size_t counted_ = 0;
  float* base_grads_ = nullptr;
  std::vector<LayerW> layers_;
  std::unique_ptr<LoraParams> lora_;
  float* inv_freq_ = nullptr;
  // Looked up once: the embeddings, the final norm, and lm_head.weight (the embeddings when tied).
  const void* embed_ = nullptr;
  const void* final_norm_ = nullptr;
  const void* head_ = nullptr;

  // Activation arenas: training forwards (+ backward) and no-grad scoring passes; cur_ is the one in use.
  struct Work;
  std::unique_ptr<Arena> train_arena_, score_arena_;
  Arena* cur_ = nullptr;
  struct InferWork;
  std::unique_ptr<InferWork> infer_;
  void reserve_infer(int T, int R);
};

}  // namespace mgrl::model
