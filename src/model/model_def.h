// model_def.h: the model definition: the config, the base weights (loaded or random) behind typed handles resolved
// once per layer, full fine-tuning's gradients and master weights, the LoRA attachment and the rotary frequencies.
// The executors (train_executor.h, inference_engine.h) read a layer's weights through layer(l) only, so they do not
// know how a weight is stored.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "kernels/ops.h"
#include "model/gatherer.h"
#include "model/lora.h"

namespace mgrl::model {

// Whether a bitsandbytes config's llm_int8_skip_modules keeps the module `module` (transformers' name, without
// ".weight") dense, as transformers 5.24's should_convert_module decides (model_def.cpp).
bool bnb_skipped(const std::string& module, const std::vector<std::string>& skip);

// How the frozen base projections are held when the directory does not say (a bitsandbytes 4-bit directory is NF4
// whatever this says): as loaded (dense, storage dtype) or NF4-quantized at load (QLoRA).
enum class Quantize { None, Nf4 };

struct ModelOptions {
  bool full_finetune = false;  // base weights trainable (gradients for every tensor)
  bool recompute = false;      // keep only each layer's input; recompute the layer in the backward
  // Full fine-tuning keeps fp32 master weights (what the optimizer updates and checkpoints hold) beside the
  // storage-dtype weights the kernels read whenever storage is not f32 (the GPU); true keeps them on f32 storage
  // too (tests: the same logic on the CPU backend).
  bool master_weights = false;
  // Each rank stores 1/P of every decoder layer's base weights (the layer's stored bytes as one flat range: its dense
  // tensors, then its NF4 projections' codes and absmax state; padded to P equal parts); layer(l) all-gathers layer l
  // into a double-buffered workspace (model.shard_base), NF4 projections then dequantized from the gathered copy.
  // The embeddings, the final norm and the LM head stay whole on every rank. Not with full_finetune.
  bool shard_base = false;
  // With shard_base: the layers gathered by a training forward stay gathered until the end of its backward (one
  // workspace per layer: no gather in the backward, no memory saved at the peak of a step).
  bool shard_keep = false;
  // model.quantize / model.quantize_double: the q/k/v/o and gate/up/down weights as NF4 (bitsandbytes' layout,
  // kernels/cpu/nf4.h), the absmax double-quantized or not. LoRA only: refused with full_finetune.
  Quantize quantize = Quantize::None;
  bool quantize_double = false;
};

// Where a base weight is held. Dense: the whole tensor on this rank. Shard: this rank's part of a decoder layer's
// weights, the layer gathered from all ranks on demand by ModelDef::layer(). Either may be NF4-quantized blocks
// (ModelDef::is_nf4), which layer() dequantizes into a dense workspace before an executor reads them (a sharded NF4
// projection is gathered as NF4 bytes and dequantized from the gathered copy).
enum class WeightKind { Dense, Shard };

// One base tensor: its kind and its place among base_tensors(). A default handle is absent (e.g. no bias).
struct WeightHandle {
  WeightKind kind = WeightKind::Dense;
  int tensor = -1;  // index into ModelDef::base_tensors(); -1: absent
  int layer = -1;   // Shard: the decoder layer whose gathered weights hold it
  bool present() const { return tensor >= 0; }
};

// A decoder layer's base tensors by handle, resolved once when the model is built. Gemma: attn_norm is
// input_layernorm, post_attn_norm post_attention_layernorm (on the attention's output), mlp_norm
// pre_feedforward_layernorm and post_mlp_norm post_feedforward_layernorm (on the MLP's output); elsewhere mlp_norm is
// post_attention_layernorm and the post norms are absent.
struct LayerHandles {
  WeightHandle attn_norm, q_norm, k_norm, mlp_norm;  // q_norm / k_norm: Qwen3, Gemma 3
  WeightHandle post_attn_norm, post_mlp_norm;        // Gemma 2/3 only
  WeightHandle W[kNumModules];
  WeightHandle bias[kNumModules];  // Qwen2 has q/k/v biases
};

// A decoder layer's weights as the kernels read them (storage dtype, backend memory); null where absent.
struct LayerWeights {
  const void *attn_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr, *mlp_norm = nullptr;
  const void *post_attn_norm = nullptr, *post_mlp_norm = nullptr;
  const void* W[kNumModules] = {};
  const void* bias[kNumModules] = {};
};

// Full fine-tuning: the f32 gradients of a layer's weights; all null otherwise.
struct LayerGrads {
  float *attn_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr, *mlp_norm = nullptr;
  float *post_attn_norm = nullptr, *post_mlp_norm = nullptr;
  float* W[kNumModules] = {};
  float* bias[kNumModules] = {};
};

// One line of ModelDef::base_fingerprint ("<name> <checksum>", "<name> nf4 <checksum>") for a dense tensor's values
// or an NF4 tensor's stored codes: what `mgrl export` compares a merge's base with.
std::string fingerprint_line(const std::string& name, const std::vector<float>& values);
std::string fingerprint_line_nf4(const std::string& name, const std::vector<std::uint8_t>& codes);

class ModelDef {
 public:
  // gatherer: the ranks a shard_base model is sharded over (null: one part, this process).
  ModelDef(io::ModelConfig cfg, kernels::Ops& ops, ModelOptions opts = {}, Gatherer* gatherer = nullptr);
  ~ModelDef();
  ModelDef(const ModelDef&) = delete;
  ModelDef& operator=(const ModelDef&) = delete;

  // Base weights from a Hugging Face directory (safetensors, single or sharded; f32, bf16 or f16),
  // checked against the config: a missing tensor or a wrong shape is a UserError naming it.
  void load_weights(const std::string& dir);
  // Random weights (normal(0, std) for matrices, 1 for norm weights (Gemma: 0, as its norms scale by 1 + w), 0 for
  // biases).
  void init_random(std::uint64_t seed, float std);
  // Adds LoRA adapters (replacing any); they start as PEFT initialises them unless loaded. Executors sized for
  // another adapter must drop their buffers (Transformer::add_lora does).
  LoraParams& add_lora(const LoraConfig& cfg, std::uint64_t seed);
  LoraParams* lora() { return lora_.get(); }
  const LoraParams* lora() const { return lora_.get(); }
  const io::ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opts_; }
  kernels::Ops& ops() const { return ops_; }

  // The dense weights of decoder layer l, materialised first for a kind that is not dense. shard_base: a collective
  // all-gather unless the layer is still in the workspace (every rank must then ask for the same layers in the same
  // order); the pointers stay valid until layer() is asked for a layer two further on, and the next layer in the
  // direction of the walk (up in a forward, down in a backward) is prefetched into the other slot. NF4 projections
  // are dequantized into one per-layer workspace (queued on the backend's stream), so the pointers of layer(l) are
  // valid until layer(k) of another layer k is asked for. Asking again for the layer the workspace holds costs nothing.
  const LayerWeights& layer(int l) const;
  // shard_base with shard_keep: the training pass that kept its layers gathered is over (the backward's end).
  void end_of_pass() const;
  bool sharded() const { return opts_.shard_base; }
  // Bytes of base weights this rank holds (its parts and the unsharded tensors, NF4 bytes included), and of the
  // gather workspace.
  std::size_t base_bytes_held() const {
    return stored_numel_ * ops_.storage_size() + (opts_.shard_base ? parts_bytes_ : nf4_bytes_);
  }
  std::size_t gather_workspace_bytes() const;
  std::uint64_t gathers() const { return gathers_; }  // layers gathered so far
  // Forget which layer the NF4 workspace holds, so that the next layer(l) dequantizes again (a recorded op sequence
  // must contain its dequantizations: the inference engine calls this at the start of each forward it may record).
  void invalidate_workspace() const { ws_layer_ = -1; }
  // Base parameters held dense (the arena of base_weights() when unsharded) and the bytes of the NF4 weights
  // (codes + absmax state, backend memory; the whole model's, of which a sharded rank holds its parts); the NF4
  // workspace (one layer's projections, storage dtype) is nf4_workspace_bytes().
  std::size_t dense_numel() const { return dense_numel_; }
  std::size_t nf4_bytes() const { return nf4_bytes_; }
  std::size_t nf4_workspace_bytes() const { return ws_bytes_; }
  bool quantized() const { return !nf4_.empty(); }
  const LayerHandles& layer_handles(int l) const { return layers_[static_cast<std::size_t>(l)]; }
  const LayerGrads& layer_grads(int l) const { return grads_[static_cast<std::size_t>(l)]; }
  // The dense data of one handle (storage dtype); null for an absent handle. Not for an NF4 handle (layer() holds
  // its dequantized copy).
  const void* dense(const WeightHandle& h) const;
  bool is_nf4(const WeightHandle& h) const { return h.present() && base_[static_cast<std::size_t>(h.tensor)].nf4 >= 0; }
  // The embeddings, the final norm and the LM head (the embeddings when tied), and their gradients (full FT only).
  const void* embed() const { return dense(embed_); }
  const void* final_norm() const { return dense(final_norm_); }
  const void* head() const { return dense(head_); }
  float* embed_grad() const { return grad(embed_); }
  float* final_norm_grad() const { return grad(final_norm_); }
  float* head_grad() const { return grad(head_); }
  // Rotary inverse frequencies, f32 [head_dim / 2], backend memory: of the global layers, and of layer l (Gemma 3's
  // sliding layers have their own base).
  const float* inv_freq() const { return inv_freq_; }
  const float* inv_freq(int l) const { return inv_freq_local_ && cfg_.is_sliding(l) ? inv_freq_local_ : inv_freq_; }
  // What the model family asks of the kernels: layer l's attention (score scale, window, soft-cap), Gemma's (1 + w)
  // norms, the embeddings' scale (Gemma: sqrt(hidden_size), as transformers computes it in fp32), the final-logit
  // soft-cap (0: none) and GeGLU instead of SwiGLU.
  kernels::AttentionOptions attention(int l) const;
  bool unit_offset_norms() const { return cfg_.gemma; }
  float embed_scale() const;
  float final_softcap() const { return static_cast<float>(cfg_.final_logit_softcapping); }
  bool geglu() const { return cfg_.hidden_act == "gelu_pytorch_tanh"; }

  // Full fine-tuning: all base tensors in one flat f32 gradient buffer, in expected_tensors() order. base_numel()
  // counts every base parameter, NF4 ones too (full fine-tuning has none).
  struct BaseTensor {
    std::string name;
    io::Shape shape;
    std::size_t offset;  // dense tensors: elements into the base arena / gradient buffer
    int nf4 = -1;        // NF4 tensors: index into the NF4 weights; -1: dense
  };
  const std::vector<BaseTensor>& base_tensors() const { return base_; }
  std::size_t base_numel() const { return base_numel_; }
  void* base_weights() { return weights_; }      // storage dtype
  const void* base_weights() const { return weights_; }
  float* base_grads() { return base_grads_; }  // nullptr unless full_finetune
  // Full fine-tuning: the f32 weights an optimizer updates: the fp32 master copy when there is one, else the
  // weights themselves (f32 storage). After writing them, call master_weights_changed().
  float* trainable_base();
  bool has_master_weights() const { return master_ != nullptr; }
  // Rounds the master weights into the storage-dtype weights (no-op without a master copy).
  void master_weights_changed();
  std::vector<float> base_tensor_host(const std::string& name) const;
  // What base weights this model holds, one line per base tensor "name checksum": a checksum of up to 4096 of its
  // values spaced evenly over it, rounded to bf16 (the same weights saved as f32 or bf16 agree); a tensor stored
  // as bitsandbytes NF4, of its codes. Set by load_weights and init_random. A checkpoint keeps it, and resuming
  // compares it (train::Checkpointer): adapters trained over one base do not fit another (docs/checkpoint.md).
  const std::string& base_fingerprint() const { return fingerprint_; }

 private:
  WeightHandle handle(const std::string& name) const;  // a FatalError for a name this architecture lacks
  LayerWeights resolve(const LayerHandles& H) const;
  void gather(int l, std::size_t slot, bool prefetch) const;
  std::size_t slot_of(int l) const;
  float* grad(const WeightHandle& h) const;
  void upload_tensor(std::size_t index, const std::vector<float>& host);
  void add_to_fingerprint(const std::string& name, const void* sample, std::size_t bytes);
  struct Nf4Slot;
  void upload_nf4(Nf4Slot& s, const std::vector<std::uint8_t>& codes, const std::vector<float>& absmax,
                  const std::vector<std::uint8_t>& qabsmax, const std::vector<float>& nested, float offset);
  kernels::Nf4Weight nf4_at(const Nf4Slot& s, const char* mem) const;  // s's pointers into its bytes at mem
  void dequantize_layer(int l, const char* gathered) const;  // gathered: the layer's gathered bytes (shard_base)
  void store_part(int l, std::size_t at, const void* bytes, std::size_t n);  // shard_base: this rank's part of them

  io::ModelConfig cfg_;
  kernels::Ops& ops_;
  ModelOptions opts_;
  std::vector<BaseTensor> base_;
  std::size_t base_numel_ = 0;
  void* weights_ = nullptr;
  float* master_ = nullptr;  // fp32 master copy of weights_ (full fine-tuning on non-f32 storage)
  float* base_grads_ = nullptr;
  std::vector<LayerHandles> layers_;
  std::vector<LayerWeights> dense_layers_;  // layers_ resolved to dense pointers (NF4: into the workspace)
  std::vector<LayerGrads> grads_;
  WeightHandle embed_, final_norm_, head_;
  std::unique_ptr<LoraParams> lora_;
  float* inv_freq_ = nullptr;

  // Where each tensor is stored: elements into weights_ (an unsharded tensor), or its decoder layer (sharded).
  std::vector<std::size_t> stored_offset_;
  std::vector<int> tensor_layer_;  // -1: not sharded
  std::size_t stored_numel_ = 0;   // elements of weights_
  // shard_base: layer l's stored bytes, `bytes` of them, are laid out as its dense tensors (base-arena elements
  // [begin, begin + numel), storage dtype, at byte (offset - begin) * storage size), then each of its NF4
  // projections' bytes (laid out as an unsharded Nf4Slot's memory, at Nf4Slot::at, 16-byte aligned). They are
  // split into P parts of part_bytes (a multiple of 16; the last part padded), the same on every rank; this rank
  // stores part `index` at parts_mem_ + stored.
  struct LayerShard {
    std::size_t begin = 0, numel = 0, bytes = 0, part_bytes = 0, stored = 0;
  };
  std::vector<LayerShard> shards_;
  void* parts_mem_ = nullptr;    // this rank's parts of every decoder layer
  std::size_t parts_bytes_ = 0;  // its bytes
  Gatherer* gatherer_ = nullptr;
  int parts_ = 1, part_index_ = 0;
  std::vector<void*> slots_;                      // gather workspace: 2 layers (all with shard_keep)
  std::size_t slot_bytes_ = 0;                    // bytes of one slot: the largest layer's P parts
  mutable std::vector<int> slot_layer_;           // the layer each slot holds, -1 none
  mutable std::vector<LayerWeights> slot_weights_;
  mutable std::uint64_t gathers_ = 0;
  mutable std::vector<bool> slot_pending_;  // a prefetch into the slot may still be running
  mutable int last_layer_ = -1, direction_ = 1;  // the last layer asked for, and the way the layers are walked
  float* inv_freq_local_ = nullptr;  // sliding layers' (rope_local_theta), when they have their own
  // NF4 weights: one backend allocation each (codes, then the absmax state; none when sharded: the bytes are then
  // part of their layer's stored range, at byte `at` of it), the shared code tables, and the workspace one layer's
  // NF4 projections are dequantized into.
  struct Nf4Slot {
    void* mem = nullptr;
    std::size_t bytes = 0, at = 0;
    int layer = -1;  // shard_base: the decoder layer whose stored range holds it
    std::int64_t rows = 0, cols = 0;
    bool double_quant = false;
    kernels::Nf4Weight w;
  };
  std::vector<Nf4Slot> nf4_;
  std::size_t dense_numel_ = 0, nf4_bytes_ = 0, ws_bytes_ = 0;
  float* nf4_tables_ = nullptr;  // the 16 NF4 values, then the 256 dynamic-code values
  void* workspace_ = nullptr;
  std::vector<std::size_t> ws_offset_;  // bytes into the workspace of each module's NF4 projection
  std::vector<bool> layer_nf4_;
  mutable int ws_layer_ = -1;
  std::string fingerprint_;
};

}  // namespace mgrl::model
