// inference_engine.h: inference with a paged KV cache (prompt prefill and decode steps, mixed in one call), its
// work buffers, and the recorded decode steps (CUDA graphs) keyed by everything they capture; rl::Generator uses it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/kv_cache.h"
#include "model/model_def.h"

namespace mgrl::model {

// Whether infer() runs the fused inference ops (Ops::rope_kv_store, Ops::linear_group_forward, and where no unmerged
// adapter runs on the projection Ops::gated_mlp_forward and, without Gemma's post-norms, Ops::linear_residual_forward;
// kernels/ops.h): yes unless the environment sets MGRL_DECODE_FUSED=0 (read once; logged), which runs the separate
// ops as before. Both give the same bits on the CPU backend, whose fused ops are the composition.
bool decode_fused_enabled();
// Whether, beyond that, the RMSNorms fold into the decode GEMVs after them (Ops::rmsnorm_linear_group_forward for the
// attention norm and q|k|v; the o layer with its residual add, then Ops::rmsnorm_gated_mlp_forward for the MLP norm
// and gate|up): MGRL_DECODE_NORM_FOLD=1 (opt-in until a GPU has measured it; read once). Backends without those ops
// (the CPU's) run the separate ops either way.
bool decode_norm_fold_enabled();

class InferenceEngine {
 public:
  explicit InferenceEngine(ModelDef& def);
  ~InferenceEngine();  // forgets the backend's recordings (they use this engine's buffers)
  InferenceEngine(const InferenceEngine&) = delete;
  InferenceEngine& operator=(const InferenceEngine&) = delete;

  // Row t of the packed rows is token tokens[t] of sequence slot[t] at position pos[t]; earlier positions of that
  // sequence are in the cache or earlier rows of this call (a prompt prefill and the decode steps of other sequences
  // may share one call). Returns the f32 logits [out_rows.size(), vocab] of the rows named by out_rows (a row may be
  // named several times), in backend memory, valid until the next call. Calls whose rows are all output rows (decode
  // steps) of at most kMaxRecordedRows rows are recorded once per row count and cache and replayed
  // (Ops::run_recorded).
  static constexpr int kMaxRecordedRows = 1024;
  const float* infer(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& slot,
                     const std::vector<std::int32_t>& pos, const std::vector<std::int32_t>& out_rows, KvCache& cache,
                     bool use_lora = true);
  // Decode steps with no host round trip (rl::Generator's generate.sync_interval): load_decode checks and uploads the
  // inputs of a decode step (every row an output row, in order) and returns the device arrays of its token ids and
  // positions, which the caller may then advance on the device (Ops::decode_advance) between steps; infer_loaded
  // runs the step from those arrays with no upload (recorded as infer's decode steps are). Valid until the next
  // infer or load_decode call. The caller keeps every position within the blocks the cache holds for its slot.
  struct DecodeInputs {
    std::int32_t* ids;
    std::int32_t* pos;
  };
  DecodeInputs load_decode(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& slot,
                           const std::vector<std::int32_t>& pos, KvCache& cache);
  const float* infer_loaded(int T, KvCache& cache, bool use_lora = true);
  // Drops the work buffers and the merged copy (and the recordings that use them): the adapter they were sized for
  // changed.
  void reset();

  // Sampling with the adapter merged into the base weights (generate.merge_lora): merge_lora() writes W + scale B A
  // of every projection that has an adapter into the engine's merged copy (Ops::lora_merge; the copy is allocated
  // at the first call and kept until reset()), and until unmerge() the calls with use_lora read the merged weights
  // of those projections instead of the base ones and run no adapter op (calls without use_lora are unchanged). The
  // adapter must not change between the two: rl::Generator merges at the start of each generation and unmerges at
  // its end. A dense, unsharded base only (a FatalError otherwise: the modes refuse it first). When allocating the
  // copy fails for memory, it throws OutOfMemory if `required`, else returns false and merges nothing (also at every
  // later call: merge_failed()); not `required`, it also merges nothing when the copy would take more than
  // 1 / kMergeShare of the free memory (Ops::available_memory) at the first call. Without an adapter it does nothing
  // and returns false.
  static constexpr std::size_t kMergeShare = 8;
  bool merge_lora(bool required);
  void unmerge() { merged_ = false; }
  bool merged() const { return merged_; }
  bool merge_failed() const { return merge_failed_; }
  // Bytes of the merged copy: each adapted projection ([out, in], storage dtype of `storage` bytes, 256-byte aligned)
  // of every layer, as merge_lora() allocates it (mgrl plan).
  static std::size_t merged_bytes(const io::ModelConfig& c, std::size_t storage, const LoraConfig& lora);
  // Bytes of the work buffers for calls of up to T rows, R of them output rows (storage: the backend's storage
  // dtype size; lora_r: the adapter's rank, 0 without one), from the config alone (mgrl plan): what reserve()
  // allocates, laid out by the same code.
  static std::size_t workspace_bytes(const io::ModelConfig& c, std::size_t storage, int lora_r, int T, int R);

 private:
  struct Buffers;
  // Sets each buffer of I to raw(its bytes), in allocation order, for calls of up to t rows, r output rows.
  static void lay_out(const io::ModelConfig& c, std::size_t S, int lora_r, std::size_t t, std::size_t r, Buffers& I,
                      const std::function<void*(std::size_t)>& raw);
  void reserve(int T, int R);
  // Checks the rows and uploads them into the buffers (reserved first).
  void load(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& slot,
            const std::vector<std::int32_t>& pos, const std::vector<std::int32_t>& out_rows, KvCache& cache);
  // The forward of T loaded rows with R output rows.
  const float* run(int T, int R, KvCache& cache, bool use_lora);

  ModelDef& def_;
  const io::ModelConfig& cfg_;
  kernels::Ops& ops_;
  std::unique_ptr<Buffers> buf_;
  // The merged copy: one allocation, and the merged weight of (layer l, module m) at merged_w_[l * kNumModules + m]
  // (null: that projection has no adapter and is read from the base).
  void* merged_mem_ = nullptr;
  std::vector<void*> merged_w_;
  bool merged_ = false, merge_failed_ = false;
  void release_merged();
};

}  // namespace mgrl::model
