// ppo_step.h: the model side of a PPO update on one rank: the rollout scoring pass (the policy's and the reference's
// log-probs of the response tokens, the value head on the final hidden state at the value positions) and one
// mini-batch's forward, loss terms and backward (per-token weights for the log-probs, a final-hidden-state gradient
// for the value head), normalised by the global mini-batch's token counts so that the split over ranks does not
// change the update. The objective itself is ppo_loss.h; the loop around it (sampling, rewards, epochs, optimizer,
// checkpoints) is the caller's.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/transformer.h"
#include "rl/ppo_loss.h"
#include "rl/value_head.h"

namespace mgrl::rl {

// One rollout: prompt and response tokens (the response with its EOS when it stopped), and its per-token arrays.
struct PpoSample {
  std::int64_t slot = 0;  // position in the global batch (LoRA dropout draws its masks by it: Batch::seq_keys)
  std::vector<std::int32_t> prompt, response;
  PpoSequence seq;
};

// The samples `idx` packed (prompt + response each); first_row[k]: the packed row of sample k's first response token.
model::Batch ppo_batch(const std::vector<PpoSample>& s, const std::vector<std::size_t>& idx,
                       std::vector<int>* first_row);

// Fills seq.logp (adapter on) and seq.ref (adapter off), both at logit scale 1 / temperature, and seq.values (the
// value head at the ppo_value_positions of each response: the state before each response token, and after the last
// one when the response stopped before response_length), `micro` samples per pass.
void ppo_score(model::Transformer& m, const ValueHead& vh, float temperature, int response_length, int micro,
               std::vector<PpoSample>& s);

// One mini-batch on this rank: the samples `idx` (may be empty: then a pass with zero weights over sample 0, since
// every rank takes part in the backward's gradient reduction and, on a sharded base, in its layer gathers), forward at 1 / temperature, their PpoTerms (returned;
// the caller sums them over ranks for the metrics), and, when `backward`, the gradients of
//   loss = sum over the global mini-batch of pg terms / pg_tokens + vf_coef * 0.5 * vf terms / vf_tokens
// (pg_tokens, vf_tokens: the global mini-batch's response tokens and value positions) times loss_scale, into the
// model's trainable gradients (layer_done as Transformer::backward's) and the value head's.
PpoTerms ppo_minibatch(model::Transformer& m, ValueHead& vh, const PpoOptions& o, float temperature,
                       const std::vector<PpoSample>& s, const std::vector<std::size_t>& idx, double pg_tokens,
                       double vf_tokens, double loss_scale, bool backward, std::uint64_t dropout_seed = 0,
                       const std::function<void(int)>& layer_done = {});

}  // namespace mgrl::rl
