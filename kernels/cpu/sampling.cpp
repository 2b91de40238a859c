// sampling.cpp: the canonical sampling algorithm (sampling.h) on the host.
#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/random.h"

namespace mgrl::kernels::cpu {

namespace {

// log(sum exp(z)) of a row in double, the max taken out first.
double log_sum_exp(const float* z, int V) {
  double zmax = z[0];
  for (int i = 1; i < V; ++i) zmax = std::max(zmax, static_cast<double>(z[i]));
  double zsum = 0;
  for (int i = 0; i < V; ++i) zsum += std::exp(z[i] - zmax);
  return zmax + std::log(zsum);
}

}  // namespace

void sample(int32_t* tokens, float* logprobs, const float* logits, const uint64_t* seeds, int B, int V,
            const Ops::Sampling& params) {
  std::vector<double> p(static_cast<std::size_t>(V));
  std::vector<char> keep(static_cast<std::size_t>(V));
  std::vector<double> sorted;
  for (int b = 0; b < B; ++b) {
    const float* z = logits + static_cast<std::size_t>(b) * V;
    const double lse = log_sum_exp(z, V);  // log_softmax of the raw logits, for the recorded log-prob

    int tok = 0;
    if (params.temperature <= 0.0f) {
      for (int i = 1; i < V; ++i)
        if (z[i] > z[tok]) tok = i;
    } else {
      const double inv_t = 1.0 / params.temperature;
      std::fill(keep.begin(), keep.end(), 1);
      if (params.top_k > 0 && params.top_k < V) {
        sorted.assign(z, z + V);
        std::nth_element(sorted.begin(), sorted.begin() + (params.top_k - 1), sorted.end(), std::greater<double>());
        const double kth = sorted[static_cast<std::size_t>(params.top_k - 1)];
        for (int i = 0; i < V; ++i) keep[i] = z[i] >= kth;
      }
      double m = -INFINITY;
      for (int i = 0; i < V; ++i)
        if (keep[i]) m = std::max(m, z[i] * inv_t);
      double total = 0;
      for (int i = 0; i < V; ++i) {
        p[i] = keep[i] ? std::exp(z[i] * inv_t - m) : 0.0;
        total += p[i];
      }
      for (int i = 0; i < V; ++i) p[i] /= total;
      if (params.top_p < 1.0f) {
        sorted.clear();
        for (int i = 0; i < V; ++i)
          if (keep[i]) sorted.push_back(p[i]);
        std::sort(sorted.begin(), sorted.end(), std::greater<double>());
        double mass = 0, tau = sorted.empty() ? 0 : sorted.back();
        for (double v : sorted) {
          mass += v;
          if (mass >= params.top_p) {
            tau = v;
            break;
          }
        }
        for (int i = 0; i < V; ++i) keep[i] = keep[i] && p[i] >= tau;
      }
      if (params.min_p > 0.0f) {
        double pmax = 0;
        for (int i = 0; i < V; ++i)
          if (keep[i]) pmax = std::max(pmax, p[i]);
        for (int i = 0; i < V; ++i) keep[i] = keep[i] && p[i] >= params.min_p * pmax;
      }
      double kept = 0;
      for (int i = 0; i < V; ++i)
        if (keep[i]) kept += p[i];
      const double target = random_uniform(seeds[b], 0) * kept;
      double cum = 0;
      tok = -1;
      for (int i = 0; i < V; ++i) {
        if (!keep[i]) continue;
        cum += p[i];
        tok = i;
        if (cum > target) break;
      }
      if (tok < 0)  // nothing kept (only possible with min_p > 1): the most likely token, as the GPU does
        for (int i = tok = 0; i < V; ++i)
          if (z[i] > z[tok]) tok = i;
    }
    tokens[b] = tok;
    logprobs[b] = static_cast<float>(z[tok] - lse);
  }
}

void repetition_penalty(float* out, const float* logits, const uint8_t* seen, const int32_t* seen_row, int R, int V,
                        float penalty) {
  for (int r = 0; r < R; ++r) {
    const float* z = logits + static_cast<std::size_t>(r) * V;
    const uint8_t* s = seen + static_cast<std::size_t>(seen_row[r]) * V;
    float* o = out + static_cast<std::size_t>(r) * V;
    // transformers: torch.where(score < 0, score * penalty, score / penalty) over the gathered logits
    for (int v = 0; v < V; ++v) o[v] = s[v] ? (z[v] < 0 ? z[v] * penalty : z[v] / penalty) : z[v];
  }
}

void mark_seen(uint8_t* seen, const int32_t* seen_row, const int32_t* tokens, int R, int V) {
  for (int r = 0; r < R; ++r) seen[static_cast<std::size_t>(seen_row[r]) * V + static_cast<std::size_t>(tokens[r])] = 1;
}

void token_logprobs(float* logprobs, const float* logits, const int32_t* tokens, int R, int V) {
  for (int r = 0; r < R; ++r) {
    const float* z = logits + static_cast<std::size_t>(r) * V;
    logprobs[r] = static_cast<float>(z[tokens[r]] - log_sum_exp(z, V));  // as sample()'s recorded log-prob
  }
}

void decode_advance(int32_t* ids, int32_t* pos, int32_t* count, int32_t* done, uint64_t* seeds, int32_t* ring_tokens,
                    float* ring_logprobs, const int32_t* tokens, const float* logprobs, const uint64_t* streams,
                    const int32_t* eos, int n_eos, int max_count, int R) {
  for (int r = 0; r < R; ++r) {
    ring_tokens[r] = tokens[r];
    ring_logprobs[r] = logprobs[r];
    if (done[r]) continue;
    const int n = ++count[r];
    bool stop = n >= max_count;
    for (int e = 0; e < n_eos && !stop; ++e) stop = tokens[r] == eos[e];
    if (stop) {
      done[r] = 1;
      continue;
    }
    ids[r] = tokens[r];
    pos[r] += 1;
    seeds[r] = random_bits(streams[r], static_cast<uint64_t>(n));
  }
}

}  // namespace mgrl::kernels::cpu
