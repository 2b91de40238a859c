// memory_plan.cpp: the per-rank memory of a run by part, from the model's shape and the run's settings.
#include "model/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/inference_engine.h"
#include "model/train_executor.h"

namespace mgrl::model {

namespace {
bool targeted(const LoraConfig& lora, Module m) {
  return std::find(lora.targets.begin(), lora.targets.end(), module_name(m)) != lora.targets.end();
}
}  // namespace

std::size_t arena_bytes(const io::ModelConfig& c, std::size_t S, const LoraConfig* lora, bool recompute, bool grads,
                        std::size_t t, std::size_t head_scratch) {
  // The training executor's own count of its arena (what TrainExecutor::plan allocates).
  ModelOptions opts;
  opts.recompute = recompute;
  return TrainExecutor::activation_bytes(c, opts, lora, S == 4 ? DType::F32 : DType::BF16, head_scratch,
                                         static_cast<int>(t), 1, grads);
}

std::size_t lm_head_scratch_bytes(bool cuda, std::size_t storage, std::int64_t V) {
  const std::size_t v = static_cast<std::size_t>(std::max<std::int64_t>(V, 0));
  if (!cuda) return 32 * v * sizeof(float);  // kernels/cpu/lm_head.h: kLmHeadChunkRows = 32
  // kernels/cuda/lm_head.cu: 1024 rows, halved (down to 128) while rows * V * 6 exceeds 1 GiB.
  std::size_t rows = 1024;
  while (rows > 128 && rows * std::max<std::size_t>(v, 1) * 6 > (std::size_t{1} << 30)) rows /= 2;
  const std::size_t n = rows * v;
  return (n * sizeof(float) + 255) / 256 * 256 + n * storage;
}

std::size_t lora_numel(const io::ModelConfig& c, const LoraConfig& lora) {
  std::size_t per_layer = 0;
  for (int m = 0; m < kNumModules; ++m) {
    const auto mod = static_cast<Module>(m);
    if (targeted(lora, mod))
      per_layer += static_cast<std::size_t>(lora.r) *
                   static_cast<std::size_t>(module_in(c, mod) + module_out(c, mod));
  }
  return per_layer * static_cast<std::size_t>(c.num_hidden_layers);
}

std::size_t kv_cache_bytes(const io::ModelConfig& c, std::size_t S, int slots, int max_len, int n_blocks,
                           int block_size) {
  if (slots <= 0 || n_blocks <= 0 || block_size <= 0) return 0;
  const std::size_t pool = static_cast<std::size_t>(c.kv_dim()) * S * static_cast<std::size_t>(n_blocks) *
                           static_cast<std::size_t>(block_size);
  const std::size_t max_blocks = static_cast<std::size_t>((max_len + block_size - 1) / block_size);
  return 2 * pool * static_cast<std::size_t>(c.num_hidden_layers) +
         static_cast<std::size_t>(slots) * max_blocks * sizeof(std::int32_t);
}

namespace {
// Elements of the seven linear layers of one decoder layer, and of everything else of that layer.
double layer_linear_numel(const io::ModelConfig& c) {
  double n = 0;
  for (int m = 0; m < kNumModules; ++m)
    n += static_cast<double>(module_in(c, static_cast<Module>(m))) * module_out(c, static_cast<Module>(m));
  return n;
}
double nf4_bytes_per_element(bool double_quant) {
  // bitsandbytes NF4: two 4-bit codes a byte; one absmax per block of 64, fp32, or (double quantization) 8-bit
  // with one fp32 scale per 256 blocks.
  return 0.5 + (double_quant ? (1.0 + 4.0 / 256.0) / 64.0 : 4.0 / 64.0);
}
}  // namespace

double layer_weight_bytes(const io::ModelConfig& c, std::size_t storage, const std::string& quantize,
                          bool double_quant) {
  const double all = (io::parameter_count(c) - static_cast<double>(c.vocab_size) * c.hidden_size *
                                                   (c.tie_word_embeddings ? 1 : 2) - c.hidden_size) /
                     static_cast<double>(std::max<std::int64_t>(1, c.num_hidden_layers));
  const double lin = layer_linear_numel(c);
  if (quantize == "nf4") return lin * nf4_bytes_per_element(double_quant) + (all - lin) * storage;
  return all * storage;
}

double base_weight_bytes(const io::ModelConfig& c, std::size_t storage, const std::string& quantize,
                         bool double_quant, bool shard, int ranks) {
  const double layers = static_cast<double>(c.num_hidden_layers) * layer_weight_bytes(c, storage, quantize, double_quant);
  const double rest = (static_cast<double>(c.vocab_size) * c.hidden_size * (c.tie_word_embeddings ? 1 : 2) +
                       c.hidden_size) * storage;
  return (shard ? layers / std::max(1, ranks) : layers) + rest;
}

double nf4_workspace_bytes(const io::ModelConfig& c, std::size_t storage) {
  double bytes = 0;
  for (int m = 0; m < kNumModules; ++m) {
    const double b = static_cast<double>(module_in(c, static_cast<Module>(m))) * module_out(c, static_cast<Module>(m)) *
                     static_cast<double>(storage);
    bytes += std::ceil(b / 16) * 16;
  }
  return bytes;
}

double resident_weight_bytes(const io::ModelConfig& c, std::size_t storage, const std::string& quantize,
                             bool double_quant, bool shard, int ranks) {
  return base_weight_bytes(c, storage, quantize, double_quant, shard, ranks) +
         (shard ? 2.0 * layer_weight_bytes(c, storage, quantize, double_quant) : 0.0) +
         (quantize == "nf4" ? nf4_workspace_bytes(c, storage) : 0.0);
}

MemoryPlan memory_plan(const PlanInput& in) {
  const io::ModelConfig& c = in.model;
  MemoryPlan p;
  auto add = [&](std::string name, double bytes, std::string note, bool transient = false) {
    p.parts.push_back({std::move(name), bytes, std::move(note), transient});
  };
  const bool nf4 = in.quantize == "nf4";
  const double base = base_weight_bytes(c, in.storage, in.quantize, in.double_quant, in.shard_base, in.ranks);
  {
    std::string note = std::string(nf4 ? "NF4 linear weights (4 bits + absmax per 64), the rest " : "") +
                       (in.storage == 4 ? "f32" : "bf16/fp16");
    char buf[96];
    std::snprintf(buf, sizeof buf, ", %.3g parameters", io::parameter_count(c));
    note += buf;
    if (in.shard_base) note += ", decoder layers 1/" + std::to_string(in.ranks) + " per rank (model.shard_base)";
    add("base weights", base, note);
  }
  if (in.shard_base) {
    const double layer = layer_weight_bytes(c, in.storage, in.quantize, in.double_quant);
    if (in.shard_keep)
      add("gather workspace", static_cast<double>(c.num_hidden_layers) * layer,
          "every layer's weights as stored (model.shard_base_keep: a forward's layers stay gathered for its backward)");
    else
      add("gather workspace", 2 * layer, "two layers' weights as stored (the layer in use and the next one prefetched)");
  }
  if (nf4)
    add("dequantize workspace", nf4_workspace_bytes(c, in.storage),
        std::string("one layer's seven projections dequantized to ") + (in.storage == 4 ? "f32" : "bf16/fp16"));
  // Host staging while the weights are loaded or drawn: one tensor in f32 at a time (the largest), on the CPU
  // backend in the same memory as everything else.
  if (!in.cuda) {
    const double largest = static_cast<double>(c.vocab_size) * c.hidden_size;
    double big = largest;
    for (int m = 0; m < kNumModules; ++m)
      big = std::max(big, static_cast<double>(module_in(c, static_cast<Module>(m))) *
                              module_out(c, static_cast<Module>(m)));
    add("load staging", big * 4, "the largest tensor in f32 while the weights are loaded (not during steps)", true);
  }
  if (in.full_finetune) {
    const double n = io::parameter_count(c);
    add("base gradients + AdamW", n * 12, "f32 gradients and two moments of every parameter");
    if (in.master_weights || in.storage != 4) add("fp32 master weights", n * 4, "what the optimizer updates");
    if (in.reference_copy) add("reference copy", n * 8, "frozen starting weights + swap buffer (the reference)");
  }
  if (in.lora) {
    const double n = static_cast<double>(lora_numel(c, in.lora_cfg));
    char buf[128];
    std::snprintf(buf, sizeof buf, "%.3g parameters (r %d, %zu target modules): f32 weights, gradients, 2 moments",
                  n, in.lora_cfg.r, in.lora_cfg.targets.size());
    add("LoRA + grads + AdamW", n * 16, buf);
    if (in.reference_copy) add("reference copy", n * 8, "frozen starting adapter + swap buffer (the reference)");
  }
  const std::size_t head = lm_head_scratch_bytes(in.cuda, in.storage, c.vocab_size);
  const LoraConfig* lora = in.lora ? &in.lora_cfg : nullptr;
  const std::size_t T = static_cast<std::size_t>(std::max<std::int64_t>(0, in.train_tokens));
  if (T > 0) {
    const double acts = static_cast<double>(arena_bytes(c, in.storage, lora, in.recompute, true, T, 0));
    add(in.recompute ? "activations (recompute)" : "activations", acts,
        std::to_string(T) + " tokens a micro-batch" +
            (in.recompute ? ", each layer's input kept, one layer's activations at a time"
                          : ", every layer's activations kept (model.recompute = false)"));
    add("logits chunk", static_cast<double>(head),
        std::string(in.cuda ? "lm_head_chunk_rows(V)" : "32") + " rows of the vocabulary's logits at a time");
    if (in.scoring)
      add("scoring pass", static_cast<double>(arena_bytes(c, in.storage, lora, false, false, T, head)),
          "no-grad log-probs (old policy / reference) in buffers of their own");
  }
  if (in.teacher) {
    const io::ModelConfig& t = in.teacher_model;
    const std::string& tq = in.teacher_quantize;
    add("teacher weights", base_weight_bytes(t, in.storage, tq, in.teacher_double_quant, in.shard_base, in.ranks),
        "the teacher's " + std::to_string(static_cast<long long>(io::parameter_count(t))) + " parameters as stored" +
            (tq == "nf4" ? std::string(" (NF4 projections)") : std::string()) +
            (in.shard_base ? ", decoder layers 1/" + std::to_string(in.ranks) + " per rank (model.shard_base)" : ""));
    if (in.shard_base)
      add("teacher gather workspace", 2 * layer_weight_bytes(t, in.storage, tq, in.teacher_double_quant),
          "two of the teacher's layers as stored (the layer in use and the next one prefetched)");
    if (tq == "nf4")
      add("teacher dequantize workspace", nf4_workspace_bytes(t, in.storage),
          std::string("one of the teacher's layers dequantized to ") + (in.storage == 4 ? "f32" : "bf16/fp16"));
    if (T > 0) {
      add("teacher pass", static_cast<double>(arena_bytes(t, in.storage, nullptr, false, false, T, 0)),
          "its no-grad pass over the micro-batch to the LM head's input");
      add("teacher logits chunk", static_cast<double>(head),
          "the teacher's logits beside the student's, a chunk of rows at a time (the divergence)");
    }
  }
  if (in.generate) {
    add("KV cache", static_cast<double>(kv_cache_bytes(c, in.storage, in.kv_slots, in.kv_max_len, in.kv_blocks,
                                                       in.kv_block_size)),
        std::to_string(in.kv_blocks) + " blocks of " + std::to_string(in.kv_block_size) + " positions for " +
            std::to_string(in.kv_slots) + " sequences of up to " + std::to_string(in.kv_max_len) + " tokens");
    add("inference workspace",
        static_cast<double>(InferenceEngine::workspace_bytes(c, in.storage, lora ? lora->r : 0,
                                                             static_cast<int>(in.infer_tokens),
                                                             static_cast<int>(in.infer_rows))),
        std::to_string(in.infer_tokens) + " rows a call, logits of " + std::to_string(in.infer_rows));
    if (lora && in.merged_lora)
      add("merged LoRA weights", static_cast<double>(InferenceEngine::merged_bytes(c, in.storage, *lora)),
          "the adapted projections with the adapter merged, for sampling (generate.merge_lora)");
  }
  add("communication buffers", in.comm_bytes, in.comm_note);
  add("runtime overhead", in.runtime_bytes, in.runtime_note);
  double transient = 0;
  for (const auto& part : p.parts) (part.transient ? transient : p.step_bytes) += part.bytes;
  p.load_bytes = base + transient + in.runtime_bytes;
  p.total = std::max(p.step_bytes, p.load_bytes);
  return p;
}

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
}  // namespace

// A CUDA rank's runtime overhead: the CUDA context with mgrl's kernels, cuBLAS's handle and workspace (32 MiB on
// Hopper), NCCL's communicator and the stream-ordered allocator's pool (kernel scratch). Not measured part by part:
// calibrated on mgrl's measured peaks on an H100 (docs/performance.md, LoRA SFT at the Qwen2.5-0.5B / 1.5B / 7B
// shapes), whose gaps to the sum of this plan's other parts were 2.29, 2.63 and 3.79 GiB: the smallest, rounded.
// (Measured before the cuBLASLt workspace of the biased GEMMs, 32 MiB more per rank since 2026-11-25.)
double cuda_runtime_bytes() { return 2.25 * 1024 * kMiB; }
// The mgrl process itself on the CPU backend (binary, MPI, HDF5, OpenBLAS's buffers for one thread, tokenizer,
// data): measured, the peak RSS of a one-step `mgrl sft` of the tiny-llama shape (whose own arrays are under
// 1 MiB) with runtime.threads = 1 was 28.8 MiB (29472 KiB) on the 2-core CI-like machine; more BLAS threads add
// buffers of their own.
double cpu_process_bytes() { return 28 * kMiB; }
// NCCL's own buffers per rank on a multi-GPU job: an allowance, not a measurement (NCCL_BUFFSIZE is 4 MiB per
// channel and peer for the Simple protocol, with LL / LL128 buffers beside it; rings over NVLink use tens of
// channels).
double nccl_buffer_bytes(int ranks) { return ranks > 1 ? 512 * kMiB : 0; }

void set_runtime_allowances(PlanInput& in) {
  in.runtime_bytes = in.cuda ? cuda_runtime_bytes() : cpu_process_bytes();
  in.runtime_note = in.cuda ? "CUDA context, cuBLAS, NCCL, allocator pool: calibrated on H100 peaks"
                            : "the mgrl process itself (binary, libraries, one thread's BLAS buffers), measured";
  in.comm_bytes = in.cuda ? nccl_buffer_bytes(in.ranks) : 0;
  in.comm_note = in.cuda ? (in.ranks > 1 ? "NCCL's own buffers: an allowance of 0.5 GiB" : "one rank: none")
                         : "MPI reduces in place";
}

std::int64_t largest_fitting_tokens(PlanInput in, double budget, std::int64_t limit) {
  std::int64_t lo = 0, hi = std::max<std::int64_t>(0, limit);
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    in.train_tokens = mid;
    if (memory_plan(in).total <= budget) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace mgrl::model
