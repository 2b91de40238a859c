// lm_head.h: the output layer fused with log-softmax: per-token log p(target) without the full [T, V] logits.
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

// Rows of logits held at a time: the scratch these ops need is kLmHeadChunkRows * V floats.
inline constexpr int kLmHeadChunkRows = 32;
inline int64_t lm_head_scratch_floats(int V) { return static_cast<int64_t>(kLmHeadChunkRows) * V; }

// h [T, D] (final hidden states), W [V, D] (lm_head or tied embedding), targets [T] (-1 = ignored).
// logits = logit_scale * h @ W^T (logit_scale = 1, or 1 / temperature as TRL's GRPO does), computed
// kLmHeadChunkRows rows at a time:
//   lse[t]     = logsumexp_v logits[t, v]               (every row, ignored ones too)
//   logprob[t] = logits[t, targets[t]] - lse[t]         (0 where targets[t] < 0)
// With softcap > 0 (Gemma 2's final_logit_softcapping) the logits are
//   logit_scale * softcap * tanh((h @ W^T) / softcap)    (the cap first, then TRL's temperature)
// here and in the two ops below.
// scratch: lm_head_scratch_floats(V) floats, or null to let the op allocate it.
// stats [4T] (optional, trl's metrics): stats[t] = the entropy of row t's distribution, lse - sum_v p_v logits_v,
// stats[T + t] = 1 where targets[t] is the row's most likely token (the first of equal maxima, as torch.argmax),
// else 0, stats[2T + t] = the mean of the row's logits, and stats[3T + t] = log sum_v p_v^2 (trl's log_sum_sq_probs,
// WPO's weights); all 0 where targets[t] < 0.
void lm_head_logprob_forward(float* logprob, float* lse, const float* h, const float* W, const int32_t* targets, int T,
                             int D, int V, float logit_scale, float* scratch, float softcap = 0.0f,
                             float* stats = nullptr);

// Backward of loss = -sum_t weights[t] * logprob[t] (any loss: pass weights[t] = -dloss/dlogprob[t]).
// Recomputes each chunk's logits and uses the forward's lse:
//   dlogits[t, v] = weights[t] * (softmax(logits[t])[v] - [v == targets[t]])   (0 for ignored rows)
//   dh[T, D]  = logit_scale * dlogits @ W          (written)
//   dW[V, D] += logit_scale * dlogits^T @ h        (accumulates; skipped when dW is null)
// (with softcap, dlogits is also multiplied by the tanh's derivative 1 - tanh^2 at each logit).
// entropy_weights [T] and entropy [T] (optional, both or neither; GRPO's entropy bonus): the loss also holds
// -sum_t entropy_weights[t] * H_t, H_t = entropy[t] the entropy of row t's distribution (the forward's stats), whose
// gradient adds entropy_weights[t] * p_v * (log p_v + H_t) to dlogits[t, v]; rows with entropy_weights[t] = 0 are
// computed bit for bit as without.
// scratch: lm_head_scratch_floats(V) floats, or null to let the op allocate it.
void lm_head_logprob_backward(float* dh, float* dW, const float* weights, const float* h, const float* W,
                              const int32_t* targets, const float* lse, int T, int D, int V, float logit_scale,
                              float* scratch, float softcap = 0.0f, const float* entropy_weights = nullptr,
                              const float* entropy = nullptr);

// Both in one pass, for a loss whose weights are known before the forward (SFT): per chunk of rows, the forward's
// lse and logprob, then the backward's dlogits, dh and dW from the same logits while they are still in scratch (the
// backward alone computes them again). Each chunk runs the code of the two ops above in the same order, so every
// output is bitwise that of lm_head_logprob_forward then lm_head_logprob_backward (weights as there).
// scratch: lm_head_scratch_floats(V) floats (the same as either op), or null to let the op allocate it.
void lm_head_logprob_forward_backward(float* logprob, float* lse, float* dh, float* dW, const float* weights,
                                      const float* h, const float* W, const int32_t* targets, int T, int D, int V,
                                      float logit_scale, float* scratch, float softcap = 0.0f,
                                      float* stats = nullptr);

// Knowledge distillation's divergence (trl's DistillationTrainer, the generalized JSD of Agarwal et al. 2024), fused
// with the student's LM head and its backward. Row t: the student's logits z_s = logit_scale * h W^T (softcap as
// above), the teacher's z_t = t_logit_scale * th tW^T (t_softcap likewise; th [T, Dt], tW [V, Dt]: the teacher may
// be wider or narrower, the vocabulary is shared), p_s = softmax(z_s), p_t = softmax(z_t) (logit_scale =
// t_logit_scale = 1 / temperature, as trl), and
//   beta = 0:         div[t] = KL(p_t || p_s)                                   (forward KL)
//   beta = 1:         div[t] = KL(p_s || p_t)                                   (reverse KL)
//   0 < beta < 1:     m = (1 - beta) p_s + beta p_t,  div[t] = beta KL(p_t || m) + (1 - beta) KL(p_s || m)
// entropy[t] = H(p_s). With dh non-null, the backward of loss = sum_t weights[t] div[t]: the gradient in z_s of a row
// (g = p_s - p_t; p_s (log p_s - log p_t - KL(p_s || p_t)); (1 - beta) p_s (log p_s - log m - KL(p_s || m))) times
// weights[t] and logit_scale (and the softcap's tanh derivative) gives dh [T, D] (written) and dW [V, D]
// (accumulated; skipped when null). Rows with weights[t] = 0 have no gradient. scratch:
// lm_head_divergence_scratch_floats(V) floats, or null to let the op allocate it.
inline int64_t lm_head_divergence_scratch_floats(int V) { return 2 * lm_head_scratch_floats(V); }
void lm_head_divergence(float* div, float* entropy, float* dh, float* dW, const float* weights, const float* h,
                        const float* W, int T, int D, int V, float logit_scale, float softcap, const float* th,
                        const float* tW, int Dt, float t_logit_scale, float t_softcap, float beta, float* scratch);

// Full logits[T, V] = logit_scale * h @ W^T, for a few rows (tests, debugging, sampling).
void lm_head_logits(float* logits, const float* h, const float* W, int T, int D, int V, float logit_scale,
                    float softcap = 0.0f);

}  // namespace mgrl::kernels::cpu
