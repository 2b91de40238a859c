// memory_plan.h: the memory one rank needs for a run, by part, computed from the model's shape and the run's
// settings alone (no weights, no allocation): what `mgrl plan` prints. Pure arithmetic over the sizes that the
// model, the LoRA parameters, the optimizer, the KV cache and the activation arenas allocate.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "model/lora.h"

namespace mgrl::model {

// The activation arena of the training executor (TrainExecutor::activation_bytes) for micro-batches of up to T
// tokens: a training arena (grads = true: one activation set per layer, or one with recompute, plus the backward's
// buffers) or a no-grad scoring arena (grads = false). storage: bytes of one stored element (4 on the CPU backend, 2 for bf16/fp16).
// lora: null when the model has no adapter. head_scratch: the LM head's logits chunk (Ops::lm_head_scratch_bytes),
// included in the result.
std::size_t arena_bytes(const io::ModelConfig& c, std::size_t storage, const LoraConfig* lora, bool recompute,
                        bool grads, std::size_t T, std::size_t head_scratch);
// The LM head's logits chunk (Ops::lm_head_scratch_bytes) of each backend: CPU 32 rows of V floats
// (kernels/cpu/lm_head.h); CUDA lm_head_chunk_rows(V) rows of V floats plus the same rows in the storage dtype
// (kernels/cuda/lm_head.cu).
std::size_t lm_head_scratch_bytes(bool cuda, std::size_t storage, std::int64_t V);
// LoRA parameters (one tensor set: A and B of every adapted module of every layer).
std::size_t lora_numel(const io::ModelConfig& c, const LoraConfig& lora);
// Bytes of a paged KV cache's pools and block table (KvCache).
std::size_t kv_cache_bytes(const io::ModelConfig& c, std::size_t storage, int slots, int max_len, int n_blocks,
                           int block_size);
// Bytes of the base weights as stored on one rank: dense (storage bytes an element), or with quantize = "nf4" the
// seven linear layers' weights in NF4 (4 bits an element, one absmax per block of 64: fp32, or with double
// quantization 8 bits plus one fp32 per 256 blocks) and the rest dense. Sharded (model.shard_base): the decoder
// layers divided over `ranks`; the embeddings, the LM head and the final norm stay whole on every rank.
double base_weight_bytes(const io::ModelConfig& c, std::size_t storage, const std::string& quantize,
                         bool double_quant, bool shard, int ranks);
// One decoder layer's base weights as stored (what a sharded base gathers per layer).
double layer_weight_bytes(const io::ModelConfig& c, std::size_t storage, const std::string& quantize,
                          bool double_quant);
// The dequantization workspace of an NF4 base: one decoder layer's seven projections dense in the storage dtype,
// each 16-byte aligned (model::ModelDef allocates this once; every layer is dequantized into it in turn).
double nf4_workspace_bytes(const io::ModelConfig& c, std::size_t storage);
// What a rank holds of a frozen model's weights at the least: base_weight_bytes, two gathered layers when sharded
// (model.shard_base; shard_base_keep holds them all), and with NF4 the dequantize workspace.
double resident_weight_bytes(const io::ModelConfig& c, std::size_t storage, const std::string& quantize,
                             bool double_quant, bool shard, int ranks);

struct PlanInput {
  io::ModelConfig model;
  bool cuda = true;          // the CUDA backend (else the CPU backend: f32, host memory)
  std::size_t storage = 2;   // bytes of a stored element: 2 (bf16/fp16) on a GPU, 4 on the CPU backend
  std::string quantize = "none";  // "none" or "nf4"
  bool double_quant = true;       // NF4 absmax double-quantized (bitsandbytes' bnb_4bit_use_double_quant)
  bool shard_base = false;        // each rank stores 1/ranks of the decoder layers, gathering a layer at a time
  bool shard_keep = false;        // model.shard_base_keep: every layer gathered at a training step's peak
  int ranks = 1;
  bool full_finetune = false;
  bool master_weights = false;  // full fine-tuning: an fp32 master copy of the base (always when storage != 4)
  bool lora = true;
  LoraConfig lora_cfg;
  bool recompute = false;
  std::int64_t train_tokens = 0;  // the largest training micro-batch, in tokens
  bool scoring = false;           // GRPO / DPO: a no-grad scoring arena of train_tokens as well
  // GRPO (grpo.beta > 0) and KTO: a frozen copy of the trainable weights (+ a swap buffer) as reference
  bool reference_copy = false;
  // Generation (GRPO's rollouts, generate): the paged KV cache and the inference workspace.
  bool generate = false;
  int kv_slots = 0, kv_max_len = 0, kv_blocks = 0, kv_block_size = 16;
  std::int64_t infer_tokens = 0, infer_rows = 0;
  bool merged_lora = false;  // generate.merge_lora in effect: the adapted projections once more, merged (sampling)
  // mgrl distill: the teacher's weights (as stored; sharded as the base with shard_base) and its no-grad pass to the LM head's input over
  // the training micro-batch; the LM head's divergence scratch (both models' logits chunks) instead of the log-probs'.
  bool teacher = false;
  io::ModelConfig teacher_model;
  std::string teacher_quantize = "none";  // "nf4": distill.teacher_quantize or a bitsandbytes 4-bit teacher
  bool teacher_double_quant = false;
  // Runtime overhead: CUDA context and library workspaces, or the CPU process's own memory.
  double runtime_bytes = 0;
  std::string runtime_note;
  double comm_bytes = 0;  // communication buffers (NCCL's own, per rank)
  std::string comm_note;
};

struct PlanPart {
  std::string name;
  double bytes = 0;
  std::string note;
  bool transient = false;  // only while the weights are loaded (host staging): counted in the peak, not the step
};

struct MemoryPlan {
  std::vector<PlanPart> parts;
  double step_bytes = 0;  // what a training step holds: every part but the transient ones
  double load_bytes = 0;  // while loading: base weights + staging + runtime
  double total = 0;       // the peak: max(step_bytes, load_bytes)
};

MemoryPlan memory_plan(const PlanInput& in);

// The runtime allowances of a plan (their sources are in memory_plan.cpp): a CUDA rank's context and cuBLAS
// workspace; the CPU process's own memory (one BLAS thread); NCCL's buffers on a job of `ranks` GPUs (0 for one).
double cuda_runtime_bytes();
double cpu_process_bytes();
double nccl_buffer_bytes(int ranks);
// in.runtime_* and in.comm_* for in.cuda and in.ranks from the allowances above.
void set_runtime_allowances(PlanInput& in);

// The largest training micro-batch (tokens, at most `limit`) whose plan fits `budget` bytes; 0 when not even
// one token fits. The plan's total grows with the tokens, so this is a binary search.
std::int64_t largest_fitting_tokens(PlanInput in, double budget, std::int64_t limit);

}  // namespace mgrl::model
