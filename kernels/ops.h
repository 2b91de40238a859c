// ops.h: the op interface the model is written against, implemented by the CPU backend (fp32
// reference, kernels/cpu) and the CUDA backend (kernels/cuda). All pointers are backend memory.
// "Storage" tensors (activations, frozen base weights, biases, norm weights) are void* in the
// backend's storage dtype (CPU: f32; CUDA: bf16 or f16); LoRA weights, every gradient of a
// trainable tensor and the per-row statistics (rstd, lse, log-probs) are always f32.
// Shapes and semantics are those of the kernels/cpu headers named beside each op.
#pragma once
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/dtype.h"
#include "core/random.h"
#include "kernels/attention_options.h"
#include "kernels/lora_group.h"

namespace mgrl::kernels {

// The phases of a training step that the phase table reports. Attention and LoRA are parts of the forward and the
// backward; communication is the gradient reduction's exposed time; host wait is the time the host blocks on the
// device (downloads, synchronisation).
enum class Phase : int { Forward, Backward, Attention, Lora, Optimizer, Communication, HostWait };
inline constexpr int kNumPhases = 7;
inline const char* phase_name(Phase p) {
  static const char* const names[kNumPhases] = {"forward",   "backward",      "attention", "lora",
                                                "optimizer", "communication", "host wait"};
  return names[static_cast<int>(p)];
}
using PhaseSeconds = std::array<double, kNumPhases>;

// The block table of a paged KV cache (Ops::kv_store, Ops::attention_cached): position p of sequence slot s is row
// p % block_size of pool block table[s * max_blocks + p / block_size] (a negative entry: no block there).
struct KvPages {
  const std::int32_t* table = nullptr;  // backend memory, [slots, max_blocks]
  int slots = 0;
  int max_blocks = 0;  // entries per slot
  int block_size = 0;  // positions per block
  int n_blocks = 0;    // blocks in each pool
  int max_len() const { return max_blocks * block_size; }  // positions a slot can hold
};

// An NF4 weight in backend memory, in bitsandbytes' layout (kernels/cpu/nf4.h): packed 4-bit codes of a row-major
// matrix, blocks of 64 values, and per block either an f32 absmax or (double-quantized) an 8-bit code of
// absmax - offset with an f32 absmax per 256 blocks.
struct Nf4Weight {
  const std::uint8_t* codes = nullptr;          // (n + 1) / 2 bytes, element 2i in the high nibble
  const float* code = nullptr;                  // the 16 NF4 values
  const float* absmax = nullptr;                // plain: f32 [blocks]; null when double-quantized
  const std::uint8_t* qabsmax = nullptr;        // double-quantized: [blocks]
  const float* nested_absmax = nullptr;         // double-quantized: [ceil(blocks / 256)]
  const float* nested_code = nullptr;           // double-quantized: the 256-value dynamic code
  float offset = 0.0f;                          // double-quantized: added to every dequantized absmax
};

// The queue a backend's ops run on, for work on other queues that must be ordered with them (dist::Comm's
// collectives take it as their Stream). CUDA: the backend's non-blocking cudaStream_t; null on the CPU backend.
struct DeviceStream {
  void* cuda = nullptr;  // a cudaStream_t
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;
  virtual DType storage() const = 0;
  std::size_t storage_size() const { return dtype_size(storage()); }

  // ---- memory ----
  virtual void* alloc(std::size_t bytes) = 0;  // zero-filled
  // Bytes that alloc can still hand out now (CPU: the kernel's MemAvailable, within the cgroup's limit; CUDA: the
  // device's free memory); 0 when unknown.
  virtual std::size_t available_memory() const = 0;
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* host, std::size_t bytes) = 0;
  virtual void download(void* host, const void* src, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void zero(void* p, std::size_t bytes) = 0;
  // host f32 -> storage dtype, and back.
  virtual void upload_f32_as_storage(void* dst, const float* host, std::size_t n) = 0;
  virtual void download_storage_as_f32(float* host, const void* src, std::size_t n) = 0;
  // device f32 -> storage dtype (round to nearest even), both in backend memory: master weights to the weights
  // the kernels read.
  virtual void f32_to_storage(void* dst, const float* src, std::size_t n) = 0;
  virtual void synchronize() = 0;
  virtual DeviceStream device_stream() const { return {}; }
  // Batch-invariant mode: a row's results do not depend on the other rows of a call (kernels/cpu/gemm.h).
  // The CPU backend implements it (for inference, so that N ranks generate what 1 rank generates); the
  // CUDA backend is not batch-invariant and ignores it.
  virtual void set_batch_invariant(bool on) { (void)on; }

  // Recorded op sequences (the CUDA backend: CUDA graphs). run_recorded(key, body) queues body's ops; a backend that
  // records does so the first time it meets a key (body's host code runs then, and only then) and replays the
  // recording for that key afterwards, with one launch instead of one per op. So body must take everything that
  // changes between calls from device memory (same pointers, same sizes for one key), and must not synchronise,
  // read back or allocate with alloc(). Returns true when it replayed. Other backends run body every time.
  // forget_recordings() drops them all: call it before freeing a buffer any recording uses.
  virtual bool run_recorded(std::uint64_t key, const std::function<void()>& body) {
    (void)key;
    body();
    return false;
  }
  virtual void forget_recordings() {}

  // ---- ops (forward next to backward) ----
  // embedding.h (scale: Gemma's sqrt(hidden_size); the CUDA backend rounds it to the storage dtype first and
  // multiplies in it, as transformers multiplies the embedding by a scale of the weights' dtype)
  virtual void embedding_forward(void* out, const std::int32_t* ids, const void* table, int T, int V, int D,
                                 float scale = 1.0f) = 0;
  virtual void embedding_backward(float* dtable, const void* dout, const std::int32_t* ids, int T, int V, int D,
                                  float scale = 1.0f) = 0;
  // rmsnorm.h (dw: f32 grad, may be null; unit_offset: Gemma's (1 + w) scale)
  virtual void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int rows, int dim, float eps,
                               bool unit_offset = false) = 0;
  virtual void rmsnorm_backward(void* dx, float* dw, const void* dout, const void* x, const void* w, const float* rstd,
                                int rows, int dim, bool accumulate, bool unit_offset = false) = 0;
  // rmsnorm.h: x_out = x_in + y (stored), then h = rmsnorm(x_out) and rstd, in one pass (x_out may alias x_in)
  virtual void residual_rmsnorm_forward(void* x_out, void* h, float* rstd, const void* x_in, const void* y,
                                        const void* w, int rows, int dim, float eps, bool unit_offset = false) = 0;
  // linear.h (dW, dbias: f32 grads, may be null)
  virtual void linear_forward(void* y, const void* x, const void* W, const void* bias, int T, int in, int out) = 0;
  virtual void linear_backward(void* dx, float* dW, float* dbias, const void* dy, const void* x, const void* W, int T,
                               int in, int out, bool accumulate_dx) = 0;
  // lora.h (A, B, dA, dB, xa, scratch: f32)
  virtual void lora_forward(void* y, float* xa, const void* x, const float* A, const float* B, float scale, int T,
                            int in, int r, int out) = 0;
  virtual void lora_backward(void* dx, float* dA, float* dB, const void* dy, const void* x, const float* xa,
                             const float* A, const float* B, float scale, int T, int in, int r, int out,
                             float* scratch) = 0;
  // lora_group.h: the adapters of n (1..kMaxLoraGroup) layers that read the same x [T, in], rank r each: the
  // products that touch x run stacked over the members (x [A_1; ..; A_n]^T in the forward; [dxa_1 | .. | dxa_n]^T x
  // and [dxa_1 | .. | dxa_n] [A_1; ..; A_n] in the backward), the others per member. Equal to lora_forward /
  // lora_backward of each member in turn up to the rounding of a sum in another order. scratch: see
  // lora_group_scratch_floats (null: the op takes its own). dx (may be null) accumulates every member's term.
  virtual void lora_group_forward(const LoraMember* g, int n, const void* x, int T, int in, int r,
                                  float* scratch) = 0;
  virtual void lora_group_backward(void* dx, const LoraMember* g, int n, const void* x, int T, int in, int r,
                                   float* scratch) = 0;
  // lora.h (lora_merge): Wm[o, i] = W[o, i] + scale * sum_k B[o, k] A[k, i] for W, Wm [out, in] in the storage dtype
  // (Wm may be W), A [r, in], B [out, r] f32: the sum in f32 in the order k = 0 .. r-1, unfused, then one rounding
  // into the storage dtype. Sampling with the adapter merged into its weight (generate.merge_lora).
  virtual void lora_merge(void* Wm, const void* W, const float* A, const float* B, float scale, int out, int in,
                          int r) = 0;
  // Inverted dropout with a counter-based mask over x [rows, cols]: out[t, j] = x[t, j] * keep(row_seed, j) / (1 - p)
  // with row_seed = random_bits(seed, row_keys[t]) (row_keys: u64 [rows], backend memory). The mask of an element
  // depends only on (seed, its row's key, j), so every backend draws the same one, and a row keeps its mask wherever
  // it sits in a batch (the training executor keys a token by its sequence's place in the step and its position).
  virtual void dropout(void* out, const void* x, int rows, int cols, float p, std::uint64_t seed,
                       const std::uint64_t* row_keys) = 0;
  // NEFTune's embedding noise (SFT, train.neftune_noise_alpha): x[t, j] += row_scale[t] * noise_uniform(
  // random_bits(seed, row_keys[t]), j), a uniform draw in [-1, 1) of a counter-based stream, so every backend adds
  // the same noise and a row's noise depends on its key alone (as dropout's mask); row_scale f32 [rows] and
  // row_keys u64 [rows] in backend memory; x [rows, cols] in the storage dtype, the f32 sum rounded to it.
  virtual void add_uniform_noise(void* x, int rows, int cols, const float* row_scale, std::uint64_t seed,
                                 const std::uint64_t* row_keys) = 0;
  // rope.h (inv_freq: f32 [head_dim / 2])
  virtual void rope_forward(void* x, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                            int head_dim) = 0;
  virtual void rope_backward(void* dx, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                             int head_dim) = 0;
  // attention.h: packed variable-length sequences, sequence b at token rows cu_seqlens[b] .. cu_seqlens[b+1] - 1
  // (cu_seqlens: backend memory, [B + 1]; max_len: the longest sequence, known on the host; lse: f32 [n_heads, T]).
  // The backward also takes the forward's output `out` (the CUDA backend computes D = rowsum(dout * out) from it;
  // the CPU reference recomputes D and ignores it). opt: score scale, sliding window, soft-capping
  // (kernels/attention_options.h); the backward takes the forward's.
  virtual void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                                 const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                                 int head_dim, const AttentionOptions& opt = {}) = 0;
  virtual void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const void* q,
                                  const void* k, const void* v, const float* lse, const std::int32_t* cu_seqlens,
                                  int B, int T, int max_len, int n_heads, int n_kv, int head_dim,
                                  const AttentionOptions& opt = {}) = 0;
  // nf4.h: elements [begin, end) of an NF4 weight (a row range: begin = r0 * cols) dequantized into dst[0 .. end -
  // begin) in the storage dtype: code[c] * absmax, in f32, then rounded once to the storage dtype. For the frozen
  // base weights of QLoRA: a layer's weights into a workspace, then the dense GEMMs.
  virtual void dequantize_nf4(void* dst, const Nf4Weight& w, std::int64_t begin, std::int64_t end) = 0;
  // swiglu.h
  virtual void swiglu_forward(void* out, const void* gate, const void* up, std::int64_t n) = 0;
  virtual void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                               std::int64_t n) = 0;
  // swiglu.h: GeGLU with the tanh GELU (Gemma)
  virtual void geglu_forward(void* out, const void* gate, const void* up, std::int64_t n) = 0;
  virtual void geglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                              std::int64_t n) = 0;
  // residual.h
  virtual void residual_forward(void* x, const void* y, std::int64_t n) = 0;
  virtual void residual_add(void* out, const void* a, const void* b, std::int64_t n) = 0;  // out = a + b
  // lm_head.h (logprob, lse, weights: f32; dW: f32 grad, may be null; scratch: lm_head_scratch_bytes;
  // softcap > 0: Gemma 2's final-logit soft-capping, logits = logit_scale * softcap * tanh(h W^T / softcap))
  virtual std::size_t lm_head_scratch_bytes(int V) const = 0;
  // stats [4T] f32 (optional): per-row entropy, 1 where the target is the most likely token, the mean logit, log sum
  // of the squared probabilities (cpu/lm_head.h)
  virtual void lm_head_logprob_forward(float* logprob, float* lse, const void* h, const void* W,
                                       const std::int32_t* targets, int T, int D, int V, float logit_scale,
                                       void* scratch, float softcap = 0.0f, float* stats = nullptr) = 0;
  // entropy_weights, entropy [T] f32 (optional, both or neither): the entropy term of cpu/lm_head.h.
  virtual void lm_head_logprob_backward(void* dh, float* dW, const float* weights, const void* h, const void* W,
                                        const std::int32_t* targets, const float* lse, int T, int D, int V,
                                        float logit_scale, void* scratch, float softcap = 0.0f,
                                        const float* entropy_weights = nullptr, const float* entropy = nullptr) = 0;
  // forward then backward in one pass, each chunk's logits computed once (SFT, whose weights are known first)
  virtual void lm_head_logprob_forward_backward(float* logprob, float* lse, void* dh, float* dW, const float* weights,
                                                const void* h, const void* W, const std::int32_t* targets, int T,
                                                int D, int V, float logit_scale, void* scratch,
                                                float softcap = 0.0f, float* stats = nullptr) = 0;
  virtual void lm_head_logits(float* logits, const void* h, const void* W, int T, int D, int V, float logit_scale,
                              float softcap = 0.0f) = 0;
  // Knowledge distillation's divergence (trl's DistillationTrainer) fused with the student's LM head and its backward
  // (cpu/lm_head.h lm_head_divergence): div, entropy [T] f32 (either may be null), dh [T, D] storage (null: no
  // backward), dW [V, D] f32 (may be null), weights [T] f32 (with dh), the student's h [T, D] and W [V, D], the
  // teacher's th [T, Dt] and tW [V, Dt] in storage dtype; beta in [0, 1]. The op allocates its own scratch.
  virtual void lm_head_divergence(float* div, float* entropy, void* dh, float* dW, const float* weights,
                                  const void* h, const void* W, int T, int D, int V, float logit_scale, float softcap,
                                  const void* th, const void* tW, int Dt, float t_logit_scale, float t_softcap,
                                  float beta) = 0;

  // ---- inference with a KV cache (kernels/cpu/kv_cache.h, kernels/cpu/sampling.h) ----
  // The cache is paged (KvPages): per layer one k and one v pool of blocks [n_blocks, block_size, n_kv, head_dim] in
  // storage dtype; a block table maps position p of sequence slot s to row p % block_size of block
  // table[s * max_blocks + p / block_size]. Sequences may share blocks (a prompt prefix shared by its completions).
  // Token row t (of T packed rows, no padding) belongs to sequence slot[t] at position pos[t].
  // cache_k[slot[t], pos[t]] = k[t]; cache_v[slot[t], pos[t]] = v[t].
  virtual void kv_store(void* cache_k, void* cache_v, const void* k, const void* v, const std::int32_t* slot,
                        const std::int32_t* pos, int T, const KvPages& pages, int n_kv, int head_dim) = 0;
  // out[t] = attention of q[t] over cache[slot[t], 0..pos[t]] (inclusive: the row's own key must be stored
  // first), grouped-query as attention_forward, scale 1/sqrt(head_dim). q, out: [T, n_heads, head_dim].
  // opt as attention_forward's: with a window only positions pos[t] - window < u <= pos[t] are read.
  virtual void attention_cached(void* out, const void* q, const void* cache_k, const void* cache_v,
                                const std::int32_t* slot, const std::int32_t* pos, int T, const KvPages& pages,
                                int n_heads, int n_kv, int head_dim, const AttentionOptions& opt = {}) = 0;
  // dst[i] = src[idx[i]] for i < n, rows of `width` elements in storage dtype.
  virtual void gather_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) = 0;
  // dst[idx[i]] = src[i] for i < n (distinct indices), rows of `width` elements in storage dtype; dst's other rows
  // are left as they are.
  virtual void scatter_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) = 0;
  // One token per row of logits [B, V] (f32), by the canonical algorithm of kernels/cpu/sampling.h,
  // with row b's uniform drawn as random_uniform(seeds[b], 0). tokens[b] gets the token, logprobs[b]
  // log_softmax(logits[b])[token] of the unmodified logits (temperature 1, no filtering).
  struct Sampling {
    float temperature = 1.0f;  // 0: greedy (argmax, lowest index on ties)
    int top_k = 0;             // 0: off
    float top_p = 1.0f;        // 1: off
    float min_p = 0.0f;        // 0: off
  };
  virtual void sample(std::int32_t* tokens, float* logprobs, const float* logits, const std::uint64_t* seeds, int B,
                      int V, const Sampling& params) = 0;
  // The repetition penalty (transformers' RepetitionPenaltyLogitsProcessor, vLLM's repetition_penalty) of rows of
  // logits [R, V] (f32): out[r][v] = logits[r][v], except for a token already in the row's sequence,
  // seen[seen_row[r] * V + v] != 0: logit / penalty when the logit is > 0, logit * penalty otherwise. out and logits
  // do not overlap. seen is a [slots, V] table of bytes.
  virtual void repetition_penalty(float* out, const float* logits, const std::uint8_t* seen,
                                  const std::int32_t* seen_row, int R, int V, float penalty) = 0;
  // seen[seen_row[r] * V + tokens[r]] = 1 for r < R (a sampled token joins its sequence's table).
  virtual void mark_seen(std::uint8_t* seen, const std::int32_t* seen_row, const std::int32_t* tokens, int R,
                         int V) = 0;
  // logprobs[r] = log_softmax(logits[r])[tokens[r]] for rows of logits [R, V] (f32), the log-sum-exp in double as
  // sample() records it: the model's log-prob of a token sampled from modified logits (a repetition penalty).
  virtual void token_logprobs(float* logprobs, const float* logits, const std::int32_t* tokens, int R, int V) = 0;
  // The bookkeeping of one decode step on the device, after sample(), so that several steps run with no host round
  // trip (rl::Generator's generate.sync_interval). Row r (of R) is a running sequence that has count[r] tokens of its
  // completion before this step's token tokens[r] (log-prob logprobs[r]). For every row: ring_tokens[r] = tokens[r],
  // ring_logprobs[r] = logprobs[r] (the caller offsets the ring by step * R). For a row with done[r] == 0: count[r]
  // += 1; the row is done (done[r] = 1) when tokens[r] is one of eos[0 .. n_eos) or count[r] reaches max_count;
  // otherwise it goes on: ids[r] = tokens[r] (the next step's input), pos[r] += 1, and seeds[r] =
  // random_bits(streams[r], count[r]) (the next draw's seed). A done row keeps ids, pos and seeds: its later steps
  // recompute the same position and write the same key and value again, and their ring entries are to be ignored.
  virtual void decode_advance(std::int32_t* ids, std::int32_t* pos, std::int32_t* count, std::int32_t* done,
                              std::uint64_t* seeds, std::int32_t* ring_tokens, float* ring_logprobs,
                              const std::int32_t* tokens, const float* logprobs, const std::uint64_t* streams,
                              const std::int32_t* eos, int n_eos, int max_count, int R) = 0;

  // ---- fused inference ops (the decode step's; kernels/cuda fuses them for small row counts) ----
  // The defaults below run the separate ops above, so a backend that does not override them (the CPU reference)
  // gives the bits of the composition.
  // rope.h + kv_cache.h: RoPE of q [T, n_heads, head_dim] and of k [T, n_kv, head_dim] in place, then the rotated k
  // and v stored into the cache: rope_forward(q), rope_forward(k), kv_store(k, v) in one op.
  virtual void rope_kv_store(void* q, void* k, const void* v, void* cache_k, void* cache_v, const std::int32_t* slot,
                             const std::int32_t* pos, const float* inv_freq, int T, const KvPages& pages,
                             int n_heads, int n_kv, int head_dim) {
    rope_forward(q, pos, inv_freq, T, n_heads, head_dim);
    rope_forward(k, pos, inv_freq, T, n_kv, head_dim);
    kv_store(cache_k, cache_v, k, v, slot, pos, T, pages, n_kv, head_dim);
  }
  // linear.h for the n (1..kMaxLinearGroup) layers that read one x [T, in] (q|k|v): m[i].y [T, m[i].out] =
  // x m[i].W^T + m[i].bias (bias may be null).
  struct LinearMember {
    void* y = nullptr;
    const void* W = nullptr;
    const void* bias = nullptr;
    int out = 0;
  };
  static constexpr int kMaxLinearGroup = 3;
  virtual void linear_group_forward(const LinearMember* m, int n, const void* x, int T, int in) {
    for (int i = 0; i < n; ++i) linear_forward(m[i].y, x, m[i].W, m[i].bias, T, in, m[i].out);
  }
  // linear_group_forward of n layers without bias, then lora_group_forward of their adapters (g[i].y == m[i].y), as
  // one op where a backend has a faster way for these operands (CUDA: one GEMM a layer over concatenated operands,
  // opt-in MGRL_LORA_CONCAT=1): the same values up to the rounding of y (once instead of twice). Returns false, having
  // done nothing, where it has none; the caller then runs the two ops. The CPU backend has none.
  virtual bool linear_lora_group_forward(const LinearMember* m, const LoraMember* g, int n, const void* x, int T,
                                         int in, int r) {
    (void)m, (void)g, (void)n, (void)x, (void)T, (void)in, (void)r;
    return false;
  }
  // linear.h + swiglu.h: act [T, I] = f(x Wg^T) * (x Wu^T) for x [T, in], Wg and Wu [I, in], f the SiLU (SwiGLU) or,
  // with geglu, the tanh GELU (GeGLU); the gate and up products rounded to the storage dtype first, as
  // linear_forward stores them. gate, up [T, I]: work buffers the composition writes (a fused kernel need not).
  virtual void gated_mlp_forward(void* act, void* gate, void* up, const void* x, const void* Wg, const void* Wu,
                                 int T, int in, int I, bool geglu) {
    linear_forward(gate, x, Wg, nullptr, T, in, I);
    linear_forward(up, x, Wu, nullptr, T, in, I);
    if (geglu)
      geglu_forward(act, gate, up, static_cast<std::int64_t>(T) * I);
    else
      swiglu_forward(act, gate, up, static_cast<std::int64_t>(T) * I);
  }
  // linear.h + residual.h: y [T, out] = r + x W^T (y may be r: the residual stream in place), x W^T rounded to the
  // storage dtype first, as linear_forward stores it. tmp [T, out]: a work buffer the composition writes.
  virtual void linear_residual_forward(void* y, const void* r, const void* x, const void* W, int T, int in, int out,
                                       void* tmp) {
    linear_forward(tmp, x, W, nullptr, T, in, out);
    residual_add(y, r, tmp, static_cast<std::int64_t>(T) * out);
  }

  // Decode ops with the RMSNorm before them folded in (h = norm(x) never written), which a backend may decline:
  // false means nothing was done and the caller runs rmsnorm_forward and then the op on h. The norm is rmsnorm.h's,
  // h = x * rstd * (w + (unit_offset ? 1 : 0)), rstd = 1 / sqrt(mean(x^2) + eps), with h not rounded to the storage
  // dtype before the product (the fused kernels keep it in fp32), so the result differs from the composition by
  // that rounding. The CPU backend declines (its decode runs the composition).
  // rmsnorm then linear_group_forward: m[i].y = norm(x) m[i].W^T + m[i].bias.
  virtual bool rmsnorm_linear_group_forward(const LinearMember* m, int n, const void* x, const void* norm_w, float eps,
                                            bool unit_offset, int T, int in) {
    (void)m, (void)n, (void)x, (void)norm_w, (void)eps, (void)unit_offset, (void)T, (void)in;
    return false;
  }
  // rmsnorm then gated_mlp_forward (neither gate nor up written): act = f(norm(x) Wg^T) * (norm(x) Wu^T).
  virtual bool rmsnorm_gated_mlp_forward(void* act, const void* x, const void* norm_w, float eps, bool unit_offset,
                                         const void* Wg, const void* Wu, int T, int in, int I, bool geglu) {
    (void)act, (void)x, (void)norm_w, (void)eps, (void)unit_offset, (void)Wg, (void)Wu, (void)T, (void)in, (void)I,
        (void)geglu;
    return false;
  }
  // Whether rmsnorm_gated_mlp_forward would take these operands (asked before the work that leads to it is chosen).
  virtual bool rmsnorm_gated_mlp_fits(const void* x, const void* norm_w, const void* Wg, const void* Wu, int T, int in,
                                      int I) const {
    (void)x, (void)norm_w, (void)Wg, (void)Wu, (void)T, (void)in, (void)I;
    return false;
  }

  // ---- optimizer (kernels/cpu/optimizer.h) ----
  // sum of x[i]^2 in double, returned to the host (synchronises); non-finite if any x[i] is.
  virtual double sum_squares(const float* x, std::size_t n) = 0;
  // *acc += scale * sum_i w[i] * x[i], accumulated in double in backend memory (acc: one double); no
  // synchronisation, so a step's loss can be summed on the device and read once at its end.
  virtual void weighted_sum_accumulate(double* acc, const float* x, const float* w, std::size_t n, double scale) = 0;
  struct AdamW {
    float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
    std::int64_t step = 1;   // 1-based, for the bias corrections
    float grad_scale = 1.0f;  // gradients are multiplied by this first (clipping, loss-scale removal)
  };
  // In place on f32 buffers of n elements: decoupled weight decay, then the Adam update.
  virtual void adamw(float* params, const float* grads, float* m, float* v, std::size_t n, const AdamW& hp) = 0;

  // ---- phase timing ----
  // phase_begin/phase_end bracket the work of a phase queued on this backend (phases nest; a phase does not nest in
  // itself). Recording never synchronises: the CUDA backend records events on its stream (and NVTX ranges, which
  // name the phases in Nsight timelines); this default, right for synchronous backends, reads the host clock.
  virtual void phase_begin(Phase p) { phase_t0_[static_cast<int>(p)] = std::chrono::steady_clock::now(); }
  virtual void phase_end(Phase p) {
    phase_s_[static_cast<int>(p)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - phase_t0_[static_cast<int>(p)]).count();
  }
  // Time measured on the host clock (e.g. waiting for a collective).
  void phase_add(Phase p, double seconds) { phase_s_[static_cast<int>(p)] += seconds; }
  // Seconds per phase since the last reset (the CUDA backend folds in its completed events: it synchronises).
  virtual PhaseSeconds phase_seconds() { return phase_s_; }
  virtual void phase_reset() { phase_s_ = {}; }

 protected:
  PhaseSeconds phase_s_{};
  std::array<std::chrono::steady_clock::time_point, kNumPhases> phase_t0_{};
};

// Times one phase of a scope: begin at construction, end at destruction.
class PhaseScope {
 public:
  PhaseScope(Ops& ops, Phase p) : ops_(ops), p_(p) { ops_.phase_begin(p_); }
  ~PhaseScope() { ops_.phase_end(p_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Ops& ops_;
  Phase p_;
};

// Batch-invariant mode for a scope (Ops::set_batch_invariant): generation and scoring.
class BatchInvariantScope {
 public:
  explicit BatchInvariantScope(Ops& ops) : ops_(ops) { ops_.set_batch_invariant(true); }
  ~BatchInvariantScope() { ops_.set_batch_invariant(false); }
  BatchInvariantScope(const BatchInvariantScope&) = delete;
  BatchInvariantScope& operator=(const BatchInvariantScope&) = delete;

 private:
  Ops& ops_;
};

std::unique_ptr<Ops> make_cpu_ops();

// The keep decision of inverted dropout for element i (shared by every backend's dropout).
MGRL_HOST_DEVICE inline bool dropout_keep(std::uint64_t seed, std::uint64_t i, float p) {
  const float u = static_cast<float>(random_bits(seed, i) >> 40) * (1.0f / 16777216.0f);  // 24 bits -> [0, 1)
  return u >= p;
}

// Element i's uniform draw in [-1, 1) of the stream `seed` (add_uniform_noise): 24 bits, exact in f32.
MGRL_HOST_DEVICE inline float noise_uniform(std::uint64_t seed, std::uint64_t i) {
  return static_cast<float>(random_bits(seed, i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

}  // namespace mgrl::kernels
