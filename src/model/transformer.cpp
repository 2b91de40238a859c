// transformer.cpp: the facade's construction and the one call that touches several parts (add_lora).
#include "model/transformer.h"

namespace mgrl::model {

Transformer::Transformer(io::ModelConfig cfg, kernels::Ops& ops, ModelOptions opts, Gatherer* gatherer)
    : def_(std::make_unique<ModelDef>(std::move(cfg), ops, opts, gatherer)),
      train_(std::make_unique<TrainExecutor>(*def_)),
      infer_(std::make_unique<InferenceEngine>(*def_)) {}

Transformer::~Transformer() = default;

LoraParams& Transformer::add_lora(const LoraConfig& cfg, std::uint64_t seed) {
  LoraParams& lora = def_->add_lora(cfg, seed);
  train_->reset();  // LoRA buffers depend on r
  infer_->reset();
  return lora;
}

}  // namespace mgrl::model
