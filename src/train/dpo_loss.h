// dpo_loss.h: the per-pair losses of direct preference optimisation as trl's DPOTrainer (1.16) defines them
// (sigmoid, hinge, ipo, robust, sigmoid_norm, exo_pair, nca_pair, bco_pair, sppo_hard, apo_zero, apo_down,
// discopop; aot, aot_unpaired over a batch), with their derivatives with respect to the policy's sequence
// log-probs, and the reward figures trl logs (rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace mgrl::train {

// Kto: trl's KTOTrainer (`mgrl kto`), a loss of one completion at a time with a desirable / undesirable label (the
// "pair" of a KTO example is its completion and its KL sequence: the prompt with another example's completion).
enum class DpoLossType { Sigmoid, Hinge, Ipo, Robust, SigmoidNorm, ExoPair, NcaPair, BcoPair, SppoHard, ApoZero, ApoDown,
                         DiscoPop, Aot, AotUnpaired, Kto };

// trl's names ("sigmoid", "hinge", ..., "discopop"; UserError naming dpo.loss_type otherwise).
DpoLossType dpo_loss_type(const std::string& name);
const char* dpo_loss_name(DpoLossType t);

struct DpoLossOptions {
  DpoLossType type = DpoLossType::Sigmoid;
  double beta = 0.1;             // trl's beta (ipo: the regulariser tau)
  double label_smoothing = 0.0;  // robust: the probability that a label is flipped, in [0, 0.5); exo_pair: its epsilon
  double discopop_tau = 0.05;    // discopop: the temperature of the log-ratio modulation
  // f-DPO (Wang et al. 2023; trl's f_divergence_type): the losses of the log-ratios' difference take the difference
  // of f'(exp(h)) instead: reverse_kl (h itself, DPO), forward_kl (1 - e^-h), js_divergence (log 2 + log sigmoid(h))
  // or alpha_divergence ((e^((a-1) h) - 1) / (a - 1), a = f_alpha; (a-1) h capped at 80 as trl does in float32).
  std::string f_divergence = "reverse_kl";
  double f_alpha = 0.5;
  // Weight of trl's "sft" loss added to the pair loss (RPO): the mean negative log-prob of the chosen completions'
  // tokens (trl: loss_type = [type, "sft"], loss_weights = [1, sft_weight]); 0: none. Not a per-pair term: the
  // trainer adds it over the batch's chosen tokens.
  double sft_weight = 0.0;
  // Several loss types with weights (trl: loss_type = [a, b, ...], loss_weights = [x, y, ...]; MPO is sigmoid 0.8,
  // bco_pair 0.2, sft 1): the pair loss is sum_m w_m loss_m, each member computed as `type` alone would be (the
  // f-divergence and label smoothing shared). Empty: `type` alone, weight 1. ("sft" is sft_weight, not a member.)
  std::vector<std::pair<DpoLossType, double>> mix;
  // kto: the weights of the desirable and undesirable examples' losses, and the KL estimate of the example's global
  // micro-batch (set per micro-batch by the trainer: max(0, the mean over its KL sequences of the policy's minus the
  // reference's sequence log-prob), detached).
  double desirable_weight = 1.0, undesirable_weight = 1.0;
  double kto_kl = 0.0;
  // WPO (trl's use_weighting): each pair's loss times exp(the chosen completion's mean over its tokens of log p -
  // log sum_v p_v^2) x the same of the rejected one, detached (wpo_weights).
  bool use_weighting = false;
};

// The members of o's loss: o.mix, or o.type with weight 1.
std::vector<std::pair<DpoLossType, double>> dpo_loss_members(const DpoLossOptions& o);
// "sigmoid", or "0.8 sigmoid + 0.2 bco_pair" for a mix (without the sft term).
std::string dpo_loss_label(const DpoLossOptions& o);

// One preference pair: the sequence log-probs (sums over the completion's tokens, as trl's `logps`) of the policy
// and of the reference, and the completion lengths in tokens (ipo and sigmoid_norm divide by them).
struct DpoPairIn {
  double chosen = 0, rejected = 0;          // policy
  double ref_chosen = 0, ref_rejected = 0;  // reference
  int chosen_tokens = 1, rejected_tokens = 1;
  // A KTO example (label 1 desirable, 0 undesirable): chosen is its completion's sequence log-prob, rejected its KL
  // sequence's; -1: a preference pair.
  int label = -1;
};

struct DpoPairOut {
  double loss = 0;
  double d_chosen = 0, d_rejected = 0;  // d loss / d chosen, d loss / d rejected (the policy's sequence log-probs)
  double reward_chosen = 0, reward_rejected = 0;  // beta * (policy - reference)
};

// kto (trl's KTOTrainer, Ethayarajh et al. 2024, Eqn. 7): with the log-ratio r = chosen - ref_chosen and z the KL
// estimate o.kto_kl, a desirable example's loss is desirable_weight (1 - sigmoid(beta (r - z))), an undesirable one's
// undesirable_weight (1 - sigmoid(beta (z - r))); d_chosen its derivative in the completion's log-prob (the KL
// sequence gets none: z is detached); reward_chosen (desirable) or reward_rejected (undesirable) beta r.
DpoPairOut dpo_pair_loss(const DpoLossOptions& o, const DpoPairIn& p);

// AOT (alignment via optimal transport; trl's "aot" and "aot_unpaired"): not a per-pair loss but one over the pairs of
// a batch (trl: of each device's micro-batch): aot sorts the policy's log-prob differences (chosen - rejected) and the
// reference's, aot_unpaired the chosen log-ratios and the rejected ones, and takes the label-smoothed logistic loss
// of each sorted difference, delta_j = a_(j) - b_(j). out[k] gets pair k's rewards (as dpo_pair_loss), the loss of
// sorted position k (their sum is the batch's) and the derivatives of the batch's loss with respect to pair k's
// chosen and rejected sequence log-probs.
bool dpo_loss_is_batch(DpoLossType t);
std::vector<DpoPairOut> dpo_batch_loss(const DpoLossOptions& o, const std::vector<DpoPairIn>& pairs);

// Whether the loss depends on the chosen and rejected log-ratios through their difference only (sigmoid, hinge, ipo,
// robust, sigmoid_norm, exo_pair, discopop): a pair whose two sides are the same has gradient 0 under it.
bool dpo_loss_of_difference(DpoLossType t);

}  // namespace mgrl::train
