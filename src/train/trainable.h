// trainable.h: what an optimizer step updates: the LoRA parameters of a model, or (full fine-tuning) its base
// weights, as one flat f32 buffer with its gradients and the names and shapes of its tensors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dist/mpi_env.h"
#include "model/transformer.h"
#include "train/checkpoint.h"

namespace mgrl::train {

struct Trainable {
  float* params = nullptr;  // backend memory
  float* grads = nullptr;
  std::size_t n = 0;
  std::vector<TensorEntry> tensors;
  // The base weights these values were trained over (ModelDef::base_fingerprint): a LoRA adapter fits only them.
  // "" for full fine-tuning, whose values are every weight of the model.
  std::string base;
  // Whoever writes params (the optimizer, a checkpoint restore, GRPO's reference swap) calls this afterwards:
  // full fine-tuning with fp32 master weights rounds them into the storage-dtype weights the kernels read.
  // Empty when params are what the kernels read (LoRA; full fine-tuning on f32 storage).
  std::function<void()> changed;
  void params_changed() const {
    if (changed) changed();
  }
};
// Whether AdamW's weight decay applies to a trainable tensor of this name: not to biases and norm weights (a name
// ending in ".bias", or whose module, the name without ".weight", ends in "norm" or contains "layernorm" or
// "rmsnorm": input_layernorm, post_attention_layernorm, q_norm, model.norm, ...), as transformers' Trainer groups
// its parameters; to everything else (projections, embeddings, the LM head, LoRA's A and B).
bool decays(const std::string& name);

// The LoRA parameters of the model, or (full fine-tuning) its base weights: f32 storage trains them in place,
// other storage (the GPU) trains their fp32 master copy.
Trainable trainable_of(model::Transformer& m, bool full_finetune);

// TR-DPO (dpo/kto/grpo.sync_ref_model, trl's SyncRefModelCallback): after every `every`-th optimizer step (0: never;
// a skipped step counts) the reference becomes (1 - alpha) reference + alpha policy (FrozenCopy::mix_in).
struct RefSync {
  std::int64_t every = 0;
  double alpha = 0.6;
  bool on() const { return every > 0; }
  bool due(std::int64_t step) const { return every > 0 && step % every == 0; }
};

// A frozen copy of the trainable weights as they are when it is made (the starting adapter, or with full fine-tuning
// every starting weight) and a swap buffer, on the backend: the reference policy of GRPO (grpo.beta > 0) and KTO when
// switching the adapter off would not give the starting weights.
class FrozenCopy {
 public:
  FrozenCopy(kernels::Ops& ops, const Trainable& tr);
  ~FrozenCopy();
  FrozenCopy(const FrozenCopy&) = delete;
  FrozenCopy& operator=(const FrozenCopy&) = delete;
  // Runs pass() with the frozen weights in place of the trainable ones, then puts those back.
  void with_frozen(const std::function<void()>& pass);
  // TR-DPO's reference update (trl's SyncRefModelCallback, sync_ref_model): frozen = (1 - alpha) frozen + alpha
  // trainable, element by element in f32 as torch does it (mul_ by float(1 - alpha), 1 - alpha taken in double;
  // then add_ with alpha: the product fused into the sum), on the host in chunks (once every ref_model_sync_steps
  // steps).
  void mix_in(double alpha);
  // The frozen weights (a checkpoint of a run whose reference moves), and setting them back on resume.
  std::vector<float> values() const;
  void set_values(const std::vector<float>& v);

 private:
  kernels::Ops& ops_;
  const Trainable& tr_;
  float* initial_ = nullptr;
  float* swap_ = nullptr;
};

// What a trainer's reference policy is, for its checkpoints to keep and a resume to compare (Checkpointer refuses
// another: the objective would change under the run; until 2026-11-29 a resume without the starting lora.adapter only
// warned that the setting differed and went on against the base model). Called before a resume replaces the weights:
// - "base": the model with the adapter switched off, or a fresh adapter (initial_is_base: LoRA's B starts at 0), which
//   is the base model, whose own fingerprint every checkpoint keeps;
// - "adapter\n" + a "<tensor> <checksum of all its values>" line per tensor: a starting adapter (lora.adapter);
// - "model\n" + ModelDef::base_fingerprint: full fine-tuning's starting weights, the model loaded.
std::string reference_identity(kernels::Ops& ops, model::Transformer& m, const Trainable& tr, bool initial_is_base);
// Before planning a training micro-batch of `tokens` tokens: "" when its activations (counted as the arena would
// allocate them) fit the memory the backend has now (or that is unknown), else "N GiB of activations, more than the
// M GiB this rank has available". Where memory is overcommitted an allocation too large may succeed and the process
// be killed when it touches it: hence a check before allocating.
std::string activations_beyond_memory(model::Transformer& m, long long tokens);
// Collective, at start-up: a UserError on every rank when the largest training pass (`tokens` at once, described by
// `what`: "a training micro-batch of ...") does not fit: "<what>, needs up to <beyond> (model.recompute = false):
// <advice>, or set model.recompute = true" (the last part and the parenthesis only without recompute).
void refuse_activations_beyond_memory(const dist::MpiEnv& env, model::Transformer& m, long long tokens,
                                      const std::string& what, const std::string& advice);
// "12.3 GiB".
std::string gib(double bytes);

}  // namespace mgrl::train
