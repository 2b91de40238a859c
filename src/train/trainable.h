// trainable.h: what an optimizer step updates: the LoRA parameters of a model, or (full fine-tuning) its base
// weights, as one flat f32 buffer with its gradients and the names and shapes of its tensors.
#pragma once
#include <cstddef>
#include <vector>

#include "model/transformer.h"
#include "train/checkpoint.h"

namespace mgrl::train {

struct Trainable {
  float* params = nullptr;  // backend memory
  float* grads = nullptr;
  std::size_t n = 0;
  std::vector<TensorEntry> tensors;
};
// The LoRA parameters of the model, or (full fine-tuning) its base weights; UserError when the backend
// cannot train them (full fine-tuning needs f32 storage, i.e. the CPU backend).
Trainable trainable_of(model::Transformer& m, bool full_finetune);

}  // namespace mgrl::train
