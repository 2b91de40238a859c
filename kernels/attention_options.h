// attention_options.h: the variants of attention that model families need (score scale, sliding window,
// soft-capping of the scores), shared by the op interface and both backends.
#pragma once

namespace mgrl::kernels {

// Scores are s = scale * q . k; with softcap > 0 they become softcap * tanh(s / softcap) (Gemma 2's
// attn_logit_softcapping) before the mask and the softmax. With window > 0 the query at position i sees only the
// keys at positions j with i - window < j <= i (transformers' sliding_window: the query itself and the
// window - 1 positions before it); window = 0 is plain causal attention.
struct AttentionOptions {
  float scale = 0.0f;    // 0: 1 / sqrt(head_dim)
  int window = 0;        // 0: no window
  float softcap = 0.0f;  // 0: no soft-capping
  bool plain() const { return scale == 0.0f && window == 0 && softcap == 0.0f; }
};

// The first key position the query at position t sees.
inline int attention_first_key(const AttentionOptions& o, int t) {
  return o.window > 0 && t - o.window + 1 > 0 ? t - o.window + 1 : 0;
}

}  // namespace mgrl::kernels
