// check_train.cpp: checks on training outputs for the CLI tests.
//   check_train weights A.h5 B.h5 [--exact | --rtol=X]   trainable weights and AdamW moments of two checkpoints
//                 [--any-step] [--moments]              agree (bitwise, or relative norm <= X); --any-step: of two
//                                                       different steps (only weights and moments compared);
//                                                       --moments: the AdamW moments too agree within X (a
//                                                       gradient scale changes them, not Adam's update)
//                 [--reference-in-one]                  Checkpoints of a synced reference (sync_ref_model): its
//                                                       weights (/reference_weights) too, bitwise with --exact;
//                                                       in one only: a failure unless --reference-in-one
//   check_train hf_weights A.h5 DIR/FILE.safetensors --rtol=X [--reference]  the trainable weights of a full
//                                                       fine-tuning checkpoint (--reference: its synced reference's)
//                                                       agree with the file's tensors of the same names within
//                                                       X (relative norm over all); prints the largest of one
//   check_train state A.h5                                prints the step, skipped and overflowed steps, loss scale
//                                                       and the scaler's clean-step count of a checkpoint
//   check_train losses A.jsonl B.jsonl --after=N         the "loss" of every record of A whose window (the steps
//                                                       since A's record before it) lies after step N is identical
//                                                       in B
//                 [--until=M] [--key=K]                 (and <= M; K instead of "loss")
//   check_train field A.jsonl KEY                         prints KEY of every record that has it, in step order
//   check_train track A.jsonl B.jsonl --rtol=X            every step's loss of A within X (relative) of B's
//   check_train falls A.jsonl --factor=F                  the last logged loss < F * the first
//   check_train finite A.h5                               every trainable value and moment of a checkpoint is finite
//                                                         (exit 0); prints its step and skipped-step count
//   check_train read A.h5                                 the checkpoint reads back (mgrl's reader, every check)
//   check_train rollouts R.h5 METRICS.jsonl --groups=P --G=G  a GRPO rollout file is consistent and agrees with the
//                                                       step's metrics (mean reward, mean completion length)
//                 [--rloo-beta=B [--rloo-normalize] [--rloo-clip=LO,HI]]  and its advantages are rloo's (recomputed
//                                                       from its rewards, sampling and reference log-probs)
//   check_train ppo_rollouts R.h5 METRICS.jsonl --T=T   a PPO rollout file (response_length T): values and returns
//                                                       at the value positions only, advantages and log-probs at the
//                                                       tokens only, advantages whitened over the batch, returns -
//                                                       values affine in them (GAE minus its whitening), metrics agree
//   check_train tensors DIR1 DIR2 PREFIX...               the tensors of model directory DIR1 whose names start with a
//                                                       PREFIX are in DIR2 byte for byte (dtype, shape, bytes); prints
//                                                       their count and the names of both directories'
//   check_train scores A.h5 B.h5 --rtol=X                 two `mgrl score` files: same tokens, log-probs within X
//   check_train same_rollouts A.h5 B.h5 --atol=X          two rollout files of one step: the same prompts and
//                                                       completions token for token, sample log-probs within X
//                                                       (absolute); prints the largest difference and whether
//                                                       the log-probs are bitwise equal
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "io/hdf5_file.h"
#include "io/safetensors.h"
#include <algorithm>
#include "train/checkpoint.h"

using namespace mgrl;

namespace {

double rel(const std::vector<float>& a, const std::vector<float>& b, bool* same_bits) {
  double num = 0, den = 0;
  *same_bits = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

std::map<long, double> losses(const char* path, const std::string& key = "loss") {
  std::map<long, double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key) && j[key].is_number()) out[j["step"].get<long>()] = j[key].get<double>();
  }
  return out;
}

const char* opt(int argc, char** argv, const char* name) {
  const std::size_t n = std::strlen(name);
  for (int i = 2; i < argc; ++i)
    if (std::strncmp(argv[i], name, n) == 0) return argv[i] + n;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: see the comment at the top of check_train.cpp\n");
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "tensors" && argc >= 5) {
      io::SafetensorsModel a(argv[2]), b(argv[3]);
      int same = 0, bad = 0;
      for (const auto& name : a.names()) {
        bool chosen = false;
        for (int i = 4; i < argc; ++i) chosen = chosen || name.rfind(argv[i], 0) == 0;
        if (!chosen) continue;
        const io::TensorInfo& x = a.get(name);
        const io::TensorInfo* y = b.find(name);
        if (y && y->dtype == x.dtype && y->shape == x.shape && y->nbytes == x.nbytes &&
            std::memcmp(y->data, x.data, x.nbytes) == 0) {
          ++same;
        } else {
          ++bad;
          std::printf("check_train: tensor %s differs or is missing\n", name.c_str());
        }
      }
      std::printf("check_train: %d tensors the same byte for byte, %d not; %zu and %zu tensors in all\n", same, bad,
                  a.names().size(), b.names().size());
      return same > 0 && bad == 0 ? 0 : 1;
    }
    if (cmd == "hf_weights" && argc >= 4) {
      const auto ck = train::read_checkpoint(argv[2]);
      const bool ref = opt(argc, argv, "--reference") != nullptr;
      const double rtol = opt(argc, argv, "--rtol=") ? std::atof(opt(argc, argv, "--rtol=")) : 0;
      const std::vector<float>& v = ref ? ck.reference_params : ck.params;
      if (v.empty()) {
        std::printf("check_train: %s holds no %s\n", argv[2], ref ? "synced reference weights" : "weights");
        return 1;
      }
      io::SafetensorsFile f(argv[3]);
      double worst = 0, num = 0, den = 0;
      std::string worst_name;
      std::size_t compared = 0;
      for (const auto& t : ck.tensors) {
        const io::TensorInfo* x = f.find(t.name);
        if (!x || x->shape != t.shape) {
          std::printf("check_train: tensor %s %s in %s\n", t.name.c_str(), x ? "has another shape" : "is missing",
                      argv[3]);
          return 1;
        }
        const std::vector<float> want = io::to_f32(*x);
        const std::vector<float> got(v.begin() + static_cast<std::ptrdiff_t>(t.offset),
                                     v.begin() + static_cast<std::ptrdiff_t>(t.offset + want.size()));
        bool same = false;
        const double e = rel(got, want, &same);
        if (e > worst || worst_name.empty()) worst = e, worst_name = t.name;
        for (std::size_t i = 0; i < want.size(); ++i) {
          num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
          den += static_cast<double>(want[i]) * want[i];
        }
        ++compared;
      }
      // The criterion: the relative norm over all of them (a tensor whose gradient is rounding noise alone, such
      // as a key projection's bias under softmax, differs more on its own)
      const double all = std::sqrt(num / (den > 0 ? den : 1));
      std::printf("check_train: %zu %stensors compared: relative difference %.3g over all, the largest of one %.3g "
                  "(%s)\n", compared, ref ? "reference " : "", all, worst, worst_name.c_str());
      return compared > 0 && all <= rtol ? 0 : 1;
    }
    if (cmd == "weights" && argc >= 4) {
      const auto a = train::read_checkpoint(argv[2]), b = train::read_checkpoint(argv[3]);
      const bool exact = opt(argc, argv, "--exact") != nullptr;
      const double rtol = opt(argc, argv, "--rtol=") ? std::atof(opt(argc, argv, "--rtol=")) : 0;
      bool sp = false, sm = false, sv = false;
      const double ep = rel(a.params, b.params, &sp), em = rel(a.adam_m, b.adam_m, &sm), ev = rel(a.adam_v, b.adam_v, &sv);
      std::printf("check_train: step %lld vs %lld; relative differences: weights %.3g, exp_avg %.3g, exp_avg_sq %.3g; "
                  "bitwise equal: %s\n",
                  static_cast<long long>(a.state.step), static_cast<long long>(b.state.step), ep, em, ev,
                  sp && sm && sv ? "yes" : "no");
      bool ref_ok = true;  // the synced reference's weights (sync_ref_model) agree, where either has them
      if (!a.reference_params.empty() || !b.reference_params.empty()) {
        const bool both = a.reference_params.size() == b.reference_params.size();
        bool bits = false;
        const double er = both ? rel(a.reference_params, b.reference_params, &bits) : 1.0;
        std::printf("check_train: synced reference weights: %s, relative difference %.3g; bitwise equal: %s\n",
                    both ? "in both" : "in one only", er, bits ? "yes" : "no");
        // in one only: fails, unless --reference-in-one (a run with the sync against one without)
        ref_ok = both ? (exact ? bits : er <= rtol) : opt(argc, argv, "--reference-in-one") != nullptr;
      }
      if (a.params.size() != b.params.size() || !ref_ok) return 1;
      if (opt(argc, argv, "--any-step")) return exact ? (sp && sm && sv ? 0 : 1) : (ep <= rtol ? 0 : 1);
      if (a.state.step != b.state.step) return 1;
      if (exact) return sp && sm && sv && a.state.cursor.epoch == b.state.cursor.epoch &&
                                a.state.cursor.position == b.state.cursor.position && a.state.tokens_seen == b.state.tokens_seen
                            ? 0
                            : 1;
      if (opt(argc, argv, "--moments") && (em > rtol || ev > rtol)) return 1;
      return ep <= rtol ? 0 : 1;
    }
    if (cmd == "rollouts" && argc >= 4) {
      io::H5Reader r(argv[2]);
      const long step = r.attr_int("/", "step");
      const auto plen = r.read_all<std::int32_t>("prompt_lengths", DType::I32);
      const auto clen = r.read_all<std::int32_t>("completion_lengths", DType::I32);
      const auto ctok = r.read_all<std::int32_t>("completion_tokens", DType::I32);
      const auto gen = r.read_all<std::int32_t>("generation_index", DType::I32);
      const auto pidx = r.read_all<std::int32_t>("prompt_index", DType::I32);
      const auto fin = r.read_all<std::int32_t>("finish_reason", DType::I32);
      const auto reward = r.read_all<double>("reward", DType::F64);
      const auto rewards = r.read_all<double>("rewards", DType::F64);
      const auto adv = r.read_all<double>("advantages", DType::F64);
      const auto lp = r.read_all<float>("logprobs", DType::F32);
      const std::size_t N = clen.size(), Lc = ctok.size() / std::max<std::size_t>(1, N);
      const int G = opt(argc, argv, "--G=") ? std::atoi(opt(argc, argv, "--G=")) : 1;
      int bad = 0;
      auto fail = [&](const std::string& what) {
        ++bad;
        std::printf("check_train: rollouts: %s\n", what.c_str());
      };
      if (N == 0 || plen.size() != N || reward.size() != N || adv.size() != N || rewards.size() % N != 0) fail("sizes");
      double rsum = 0, lsum = 0, asum = 0;
      for (std::size_t i = 0; i < N; ++i) {
        if (gen[i] != static_cast<int>(i % static_cast<std::size_t>(G))) fail("generation_index order");
        if (i % static_cast<std::size_t>(G) && pidx[i] != pidx[i - 1]) fail("a group spans several prompts");
        if (fin[i] < 0 || fin[i] > 2) fail("finish_reason code");
        if (clen[i] < 1 || static_cast<std::size_t>(clen[i]) > Lc) fail("completion length");
        for (std::size_t t = 0; t < Lc; ++t) {
          const bool in = t < static_cast<std::size_t>(clen[i]);
          if (in != (ctok[i * Lc + t] >= 0)) fail("completion token padding");
          if (in != !std::isnan(lp[i * Lc + t])) fail("logprobs padding");
          if (in && !(lp[i * Lc + t] <= 0)) fail("a log-prob above 0");
        }
        rsum += reward[i];
        lsum += clen[i];
        asum += adv[i];
      }
      // The step's metrics line.
      std::ifstream in(argv[3]);
      std::string line;
      bool found = false;
      while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        if (j["step"].get<long>() != step || !j.contains("reward")) continue;
        found = true;
        const double mr = rsum / static_cast<double>(N), ml = lsum / static_cast<double>(N);
        if (std::fabs(j["reward"].get<double>() - mr) > 1e-5) fail("mean reward differs from metrics.jsonl");
        if (std::fabs(j["completions/mean_length"].get<double>() - ml) > 1e-9) fail("mean length differs from metrics.jsonl");
        std::printf("check_train: rollouts of step %ld: %zu completions, mean reward %.4f (metrics %.4f), mean length "
                    "%.2f (%.0f tokens), advantages sum %.2g\n", step, N, mr, j["reward"].get<double>(), ml, lsum, asum);
      }
      if (!found) fail("no metrics line for the step");
      // grpo.loss_type = rloo: the advantages are trl's leave-one-out ones of the rewards (clipped) minus beta x each
      // completion's summed (sampling - reference) log-prob, normalised over the round when asked; recomputed here
      // from the file's own columns, independently of rl::rloo_advantages. The penalty's old-policy log-probs are
      // the file's sampling ones: equal within float noise at grpo.temperature = 1 only (the runs that use this).
      if (const char* b = opt(argc, argv, "--rloo-beta=")) {
        const double beta = std::atof(b);
        double lo = -INFINITY, hi = INFINITY;
        if (const char* c = opt(argc, argv, "--rloo-clip=")) std::sscanf(c, "%lf,%lf", &lo, &hi);
        std::vector<double> pen(N), want(N);
        const auto ref = beta != 0 ? r.read_all<float>("ref_logprobs", DType::F32) : std::vector<float>{};
        for (std::size_t i = 0; i < N; ++i) {
          double kl = 0;
          for (std::size_t t = 0; beta != 0 && t < static_cast<std::size_t>(clen[i]); ++t) kl += lp[i * Lc + t] - ref[i * Lc + t];
          pen[i] = std::min(hi, std::max(lo, reward[i])) - beta * kl;
        }
        for (std::size_t g = 0; g < N / static_cast<std::size_t>(G); ++g) {
          double sum = 0;
          for (int j = 0; j < G; ++j) sum += pen[g * static_cast<std::size_t>(G) + static_cast<std::size_t>(j)];
          for (int j = 0; j < G; ++j) {
            const std::size_t i = g * static_cast<std::size_t>(G) + static_cast<std::size_t>(j);
            want[i] = pen[i] - (sum - pen[i]) / (G - 1);
          }
        }
        if (opt(argc, argv, "--rloo-normalize")) {
          double m = 0, v = 0;
          for (double x : want) m += x / static_cast<double>(N);
          for (double x : want) v += (x - m) * (x - m) / static_cast<double>(N - 1);
          for (double& x : want) x = (x - m) / (std::sqrt(v) + 1e-4);
        }
        double worst = 0, spread = 0;
        for (std::size_t i = 0; i < N; ++i) {
          if (std::isnan(want[i])) fail("a null reward (this check does not take them)");
          worst = std::max(worst, std::fabs(adv[i] - want[i]));
          spread = std::max(spread, std::fabs(want[i]));
        }
        if (!(spread > 0)) fail("every rloo advantage is 0: the check would check nothing");
        std::printf("check_train: rloo advantages of step %ld: largest difference %.2g of %.3g\n", step, worst, spread);
        if (!(worst <= 1e-3 * std::max(1.0, spread))) fail("advantages are not rloo's");
      }
      return bad == 0 ? 0 : 1;
    }
    if (cmd == "same_rollouts" && argc >= 4) {
      io::H5Reader a(argv[2]), b(argv[3]);
      const double atol = opt(argc, argv, "--atol=") ? std::atof(opt(argc, argv, "--atol=")) : 0;
      int bad = 0;
      for (const char* name : {"prompt_index", "generation_index", "prompt_tokens", "completion_tokens",
                               "completion_lengths"})
        if (a.read_all<std::int32_t>(name, DType::I32) != b.read_all<std::int32_t>(name, DType::I32)) {
          ++bad;
          std::printf("check_train: same_rollouts: %s differ\n", name);
        }
      const auto la = a.read_all<float>("logprobs", DType::F32), lb = b.read_all<float>("logprobs", DType::F32);
      double worst = 0;
      std::size_t tokens = 0;
      if (la.size() != lb.size()) ++bad;
      for (std::size_t i = 0; i < la.size() && i < lb.size(); ++i) {
        if (std::isnan(la[i]) != std::isnan(lb[i])) ++bad;
        if (std::isnan(la[i]) || std::isnan(lb[i])) continue;
        ++tokens;
        worst = std::max(worst, std::fabs(static_cast<double>(la[i]) - lb[i]));
      }
      const bool bits = la.size() == lb.size() && std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0;
      std::printf("check_train: rollouts of step %ld: %s completions, %zu tokens, largest |d logprob| %.3g; bitwise "
                  "equal: %s\n",
                  static_cast<long>(a.attr_int("/", "step")), bad ? "different" : "the same", tokens, worst,
                  bits ? "yes" : "no");
      return bad == 0 && worst <= atol ? 0 : 1;
    }
    if (cmd == "ppo_rollouts" && argc >= 4) {
      io::H5Reader r(argv[2]);
      const long step = r.attr_int("/", "step");
      const int T = opt(argc, argv, "--T=") ? std::atoi(opt(argc, argv, "--T=")) : 0;
      const auto clen = r.read_all<std::int32_t>("completion_lengths", DType::I32);
      const auto fin = r.read_all<std::int32_t>("finish_reason", DType::I32);
      const auto val = r.read_all<float>("values", DType::F32), ret = r.read_all<float>("returns", DType::F32);
      const auto adv = r.read_all<float>("token_advantages", DType::F32);
      const auto lp = r.read_all<float>("logprobs", DType::F32), ref = r.read_all<float>("ref_logprobs", DType::F32);
      const auto seq_adv = r.read_all<float>("advantages", DType::F32);
      const std::size_t N = clen.size(), Lc = N ? adv.size() / N : 0;
      int bad = 0;
      auto fail = [&](const std::string& what) {
        if (++bad <= 5) std::printf("check_train: ppo rollouts: %s\n", what.c_str());
      };
      if (N == 0 || T < 1 || static_cast<int>(Lc) > T || val.size() != N * (Lc + 1) || ret.size() != val.size() ||
          lp.size() != N * Lc || ref.size() != lp.size() || seq_adv.size() != N)
        fail("sizes");
      // Over the response tokens of the batch: the advantages' mean and variance, and the least-squares line of
      // returns - values (the GAE advantages before whitening) on them.
      double n = 0, sa = 0, saa = 0, sd = 0, sad = 0, sdd = 0, eos = 0, len = 0;
      for (std::size_t i = 0; bad == 0 && i < N; ++i) {
        const int L = clen[i], P = L < T ? L + 1 : L;
        if (L < 1 || static_cast<std::size_t>(L) > Lc) fail("completion length");
        if (!std::isnan(seq_adv[i])) fail("a per-sequence advantage in a PPO file");
        eos += fin[i] == 0;
        len += L;
        for (std::size_t t = 0; t <= Lc; ++t) {
          const bool pos = static_cast<int>(t) < P, tok = static_cast<int>(t) < L;
          const float v = val[i * (Lc + 1) + t], R = ret[i * (Lc + 1) + t];
          if (pos == std::isnan(v) || pos == std::isnan(R)) fail("values/returns outside the value positions");
          if (t == Lc) continue;
          const float a = adv[i * Lc + t];
          if (tok == std::isnan(a) || tok == std::isnan(lp[i * Lc + t]) || tok == std::isnan(ref[i * Lc + t]))
            fail("advantages/log-probs outside the response tokens");
          if (!tok) continue;
          const double d = static_cast<double>(R) - v;
          n += 1, sa += a, saa += static_cast<double>(a) * a, sd += d, sad += a * d, sdd += d * d;
        }
      }
      if (bad == 0) {
        const double mean = sa / n, var = (saa - n * mean * mean) / (n - 1);
        const double slope = (sad - sa * sd / n) / (saa - sa * sa / n), icpt = (sd - slope * sa) / n;
        const double sdd_c = sdd - sd * sd / n;  // spread of returns - values
        double worst = 0;
        for (std::size_t i = 0; i < N; ++i)
          for (int t = 0; t < clen[i]; ++t) {
            const std::size_t k = i * Lc + static_cast<std::size_t>(t);
            const double d = static_cast<double>(ret[i * (Lc + 1) + static_cast<std::size_t>(t)]) -
                             val[i * (Lc + 1) + static_cast<std::size_t>(t)];
            worst = std::max(worst, std::fabs(d - (icpt + slope * adv[k])));
          }
        const double spread = std::sqrt(sdd_c / (n - 1));
        std::printf("check_train: ppo rollouts of step %ld: %zu responses, %.0f tokens; advantages mean %.2g, variance "
                    "%.6f; returns - values = %.4g + %.4g x advantage, largest residual %.2g of spread %.3g\n",
                    step, N, n, mean, var, icpt, slope, worst, spread);
        if (std::fabs(mean) > 1e-5 || std::fabs(var - 1) > 1e-4) fail("advantages are not whitened over the batch");
        if (!(slope > 0) || worst > 1e-4 * spread + 1e-6) fail("returns - values is not affine in the advantages");
        std::ifstream in(argv[3]);
        std::string line;
        bool found = false;
        while (std::getline(in, line)) {
          const auto j = nlohmann::json::parse(line);
          // the update's line: the first one with PPO metrics at or after the file's step
          if (found || j["step"].get<long>() < step || !j.contains("val/num_eos_tokens")) continue;
          found = true;
          if (std::fabs(j["completions/mean_length"].get<double>() - len / static_cast<double>(N)) > 1e-9 ||
              std::fabs(j["val/num_eos_tokens"].get<double>() - eos) > 1e-9)
            fail("mean length or EOS count differs from metrics.jsonl");
        }
        if (!found) fail("no metrics line for the update");
      }
      return bad == 0 ? 0 : 1;
    }
    if (cmd == "state") {
      const auto a = train::read_checkpoint(argv[2]);
      std::printf("check_train: step %lld, skipped %lld, overflowed %lld, loss scale %.17g, clean steps %lld, tokens "
                  "seen %lld\n",
                  static_cast<long long>(a.state.step), static_cast<long long>(a.state.skipped_steps),
                  static_cast<long long>(a.state.overflow_steps), a.state.loss_scale,
                  static_cast<long long>(a.state.scaler_good_steps), static_cast<long long>(a.state.tokens_seen));
      return 0;
    }
    if (cmd == "field" && argc >= 4) {
      std::string out;
      char b[40];
      for (const auto& [step, v] : losses(argv[2], argv[3])) {
        std::snprintf(b, sizeof b, " %.17g", v);
        out += b;
      }
      std::printf("check_train: %s:%s\n", argv[3], out.c_str());
      return out.empty() ? 1 : 0;
    }
    if (cmd == "track" && argc >= 4) {
      const double rtol = opt(argc, argv, "--rtol=") ? std::atof(opt(argc, argv, "--rtol=")) : 0;
      const auto a = losses(argv[2]), b = losses(argv[3]);
      double worst = 0, sum = 0;
      long worst_step = -1;
      int n = 0;
      bool all_finite = true;
      for (const auto& [step, loss] : b) {
        const auto it = a.find(step);
        if (it == a.end()) continue;
        all_finite = all_finite && std::isfinite(it->second) && std::isfinite(loss);
        const double r = std::fabs(it->second - loss) / std::max(1e-12, std::fabs(loss));
        if (worst_step < 0 || !(r <= worst)) {  // NaN counts as the worst
          worst = r;
          worst_step = step;
        }
        sum += r;
        ++n;
      }
      std::printf("check_train: %d steps compared; loss relative difference: mean %.3g, largest %.3g (step %ld); "
                  "tolerance %.3g\n", n, n ? sum / n : 0.0, worst, worst_step, rtol);
      return n > 0 && n == static_cast<int>(b.size()) && all_finite && worst <= rtol ? 0 : 1;
    }
    if (cmd == "losses" && argc >= 4) {
      const long after = opt(argc, argv, "--after=") ? std::atol(opt(argc, argv, "--after=")) : 0;
      const long until = opt(argc, argv, "--until=") ? std::atol(opt(argc, argv, "--until=")) : -1;
      const std::string key = opt(argc, argv, "--key=") ? opt(argc, argv, "--key=") : "loss";
      const auto a = losses(argv[2], key), b = losses(argv[3], key);
      int compared = 0, differ = 0;
      // A record is the mean over the steps since the one before it (log.every_steps): one whose window began at or
      // before `after` (the step a run resumed at, the first record after it) averages steps that the resumed run did
      // not take, and is not compared.
      long previous = 0;
      for (const auto& [step, loss] : a) {
        const long window_start = previous;
        previous = step;
        if (window_start < after || (until >= 0 && step > until)) continue;
        auto it = b.find(step);
        if (it == b.end()) continue;
        ++compared;
        if (it->second != loss) {
          ++differ;
          std::printf("check_train: step %ld: %s %.17g vs %.17g\n", step, key.c_str(), loss, it->second);
        }
      }
      std::printf("check_train: %d %s values after step %ld compared, %d differ\n", compared, key.c_str(), after,
                  differ);
      return compared > 0 && differ == 0 ? 0 : 1;
    }
    if (cmd == "falls") {
      const double factor = opt(argc, argv, "--factor=") ? std::atof(opt(argc, argv, "--factor=")) : 1.0;
      const auto a = losses(argv[2]);
      if (a.size() < 2) return 1;
      const double first = a.begin()->second, last = a.rbegin()->second;
      std::printf("check_train: loss %.4f at step %ld -> %.4f at step %ld\n", first, a.begin()->first, last,
                  a.rbegin()->first);
      return last < factor * first ? 0 : 1;
    }
    if (cmd == "read") {  // the checkpoint reads back with every check of mgrl's reader (checksums, sizes, values)
      const auto a = train::read_checkpoint(argv[2]);
      std::printf("check_train: %s reads back: step %lld, %zu trainable values\n", argv[2],
                  static_cast<long long>(a.state.step), a.params.size());
      return 0;
    }
    if (cmd == "finite") {
      const auto a = train::read_checkpoint(argv[2]);
      std::size_t bad = 0;
      for (const auto* v : {&a.params, &a.adam_m, &a.adam_v})
        for (float x : *v) bad += std::isfinite(x) ? 0 : 1;
      std::printf("check_train: step %lld, %zu skipped steps, %zu non-finite values\n",
                  static_cast<long long>(a.state.step), static_cast<std::size_t>(a.state.skipped_steps), bad);
      return bad == 0 ? 0 : 1;  // the skipped steps are printed for the caller to check
    }
    if (cmd == "scores" && argc >= 4) {
      const double rtol = opt(argc, argv, "--rtol=") ? std::atof(opt(argc, argv, "--rtol=")) : 0;
      io::H5Reader a(argv[2]), b(argv[3]);
      if (a.read_all<std::int32_t>("tokens", DType::I32) != b.read_all<std::int32_t>("tokens", DType::I32)) return 1;
      auto la = a.read_all<float>("logprobs", DType::F32), lb = b.read_all<float>("logprobs", DType::F32);
      for (auto* v : {&la, &lb})
        for (auto& x : *v)
          if (std::isnan(x)) x = 0;
      bool same = false;
      const double e = rel(la, lb, &same);
      std::printf("check_train: log-probs relative difference %.3g\n", e);
      return e <= rtol ? 0 : 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "check_train: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "check_train: unknown command\n");
  return 2;
}
