// ppo_step.cpp: PPO's rollout scoring pass and one mini-batch's forward, loss terms and backward on one rank.
#include "rl/ppo_step.h"

#include <algorithm>

#include "core/error.h"

namespace mgrl::rl {

model::Batch ppo_batch(const std::vector<PpoSample>& s, const std::vector<std::size_t>& idx,
                       std::vector<int>* first_row) {
  std::vector<std::vector<std::int32_t>> seqs;
  first_row->clear();
  int row = 0;
  for (std::size_t i : idx) {
    const PpoSample& x = s[i];
    MGRL_CHECK(!x.prompt.empty() && !x.response.empty(), "ppo: a sample without prompt or response");
    std::vector<std::int32_t> q = x.prompt;
    q.insert(q.end(), x.response.begin(), x.response.end());
    first_row->push_back(row + static_cast<int>(x.prompt.size()));
    row += static_cast<int>(q.size());
    seqs.push_back(std::move(q));
  }
  model::Batch b = model::Batch::from_sequences(seqs);
  // The responses' log-probs alone are read.
  for (std::size_t i : idx) {
    b.scored_from.push_back(static_cast<std::int32_t>(s[i].prompt.size()));
    b.seq_keys.push_back(static_cast<std::uint64_t>(s[i].slot));  // LoRA dropout
  }
  return b;
}

void ppo_score(model::Transformer& m, const ValueHead& vh, float temperature, int response_length, int micro,
               std::vector<PpoSample>& s) {
  const float scale = 1.0f / temperature;
  const std::size_t H = static_cast<std::size_t>(vh.hidden());
  std::vector<int> first;
  std::vector<float> lp, ref;
  for (std::size_t b = 0; b < s.size(); b += static_cast<std::size_t>(std::max(1, micro))) {
    std::vector<std::size_t> idx;
    for (std::size_t i = b; i < std::min(s.size(), b + static_cast<std::size_t>(std::max(1, micro))); ++i)
      idx.push_back(i);
    const model::Batch batch = ppo_batch(s, idx, &first);
    lp.assign(batch.tokens.size(), 0.0f);
    ref.assign(batch.tokens.size(), 0.0f);
    m.score(batch, ref.data(), /*use_lora=*/false, scale);
    m.forward(batch, lp.data(), /*use_lora=*/true, /*train=*/false, 0, scale);
    const std::vector<float> hidden = m.final_hidden();
    for (std::size_t k = 0; k < idx.size(); ++k) {
      PpoSequence& q = s[idx[k]].seq;
      const int n = static_cast<int>(s[idx[k]].response.size()), nv = ppo_value_positions(n, response_length);
      const std::size_t r0 = static_cast<std::size_t>(first[k]);
      q.logp.assign(lp.begin() + static_cast<std::ptrdiff_t>(r0), lp.begin() + static_cast<std::ptrdiff_t>(r0) + n);
      q.ref.assign(ref.begin() + static_cast<std::ptrdiff_t>(r0), ref.begin() + static_cast<std::ptrdiff_t>(r0) + n);
      q.values.assign(static_cast<std::size_t>(nv), 0.0);
      // Value position t is the state before response token t: the hidden row just before it.
      vh.forward(hidden.data() + (r0 - 1) * H, nv, q.values.data());
    }
  }
}

PpoTerms ppo_minibatch(model::Transformer& m, ValueHead& vh, const PpoOptions& o, float temperature,
                       const std::vector<PpoSample>& s, const std::vector<std::size_t>& idx, double pg_tokens,
                       double vf_tokens, double loss_scale, bool backward, std::uint64_t dropout_seed,
                       const std::function<void(int)>& layer_done) {
  MGRL_CHECK(!s.empty(), "ppo: a rank without samples");
  const bool empty = idx.empty();
  const std::vector<std::size_t> run = empty ? std::vector<std::size_t>{0} : idx;
  std::vector<int> first;
  const model::Batch batch = ppo_batch(s, run, &first);
  std::vector<float> lp(batch.tokens.size(), 0.0f);
  m.forward(batch, lp.data(), true, backward, dropout_seed, 1.0f / temperature);
  const std::vector<float> hidden = m.final_hidden();
  const std::size_t H = static_cast<std::size_t>(vh.hidden());
  PpoTerms counts;
  counts.pg_tokens = pg_tokens;
  counts.vf_tokens = vf_tokens;
  const PpoLoss scales = ppo_loss(o, counts);
  std::vector<float> w(batch.tokens.size(), 0.0f), dh;
  if (backward && !empty) dh.assign(hidden.size(), 0.0f);
  PpoTerms total;
  std::vector<double> new_logp, new_values, d_logp, d_values;
  for (std::size_t k = 0; k < run.size() && !empty; ++k) {
    const PpoSample& x = s[run[k]];
    const int n = x.seq.n(), nv = static_cast<int>(x.seq.values.size());
    const std::size_t r0 = static_cast<std::size_t>(first[k]);
    new_logp.assign(lp.begin() + static_cast<std::ptrdiff_t>(r0), lp.begin() + static_cast<std::ptrdiff_t>(r0) + n);
    new_values.assign(static_cast<std::size_t>(nv), 0.0);
    const float* h = hidden.data() + (r0 - 1) * H;
    vh.forward(h, nv, new_values.data());
    d_logp.assign(static_cast<std::size_t>(n), 0.0);
    d_values.assign(static_cast<std::size_t>(nv), 0.0);
    total.add(ppo_sequence_terms(o, x.seq, new_logp.data(), new_values.data(), d_logp.data(), d_values.data()));
    if (!backward) continue;
    // The model's backward is of -sum w logp: w = -d loss / d logp, times the loss scale.
    for (int t = 0; t < n; ++t)
      w[r0 + static_cast<std::size_t>(t)] = static_cast<float>(-d_logp[static_cast<std::size_t>(t)] * scales.logp_scale * loss_scale);
    for (double& d : d_values) d *= scales.value_scale * loss_scale;
    vh.backward(h, nv, d_values.data(), dh.data() + (r0 - 1) * H);
  }
  if (backward) m.backward(w.data(), layer_done, dh.empty() ? nullptr : dh.data());
  return total;
}

}  // namespace mgrl::rl
