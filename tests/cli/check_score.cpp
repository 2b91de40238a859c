// check_score.cpp: checks a `mgrl score` output file against a fixture's reference.safetensors:
// same tokens and lengths, NaN at t = 0 and in the padding, log-probs within 1e-5 (relative, norm).
// usage: check_score OUT.h5 REFERENCE.safetensors [--base] [--tol=X]   (--base: compare with the
// adapter-free model, i.e. recompute the reference log-probs from logits_base; --tol: the relative
// error allowed, 1e-5 by default, e.g. 2e-2 for bf16 on a GPU)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "io/hdf5_file.h"
#include "io/safetensors.h"

using namespace mgrl;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: check_score OUT.h5 REFERENCE.safetensors [--base] [--tol=X]\n");
    return 2;
  }
  bool base = false;
  double tol = 1e-5;
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "--base") == 0) base = true;
    else if (std::strncmp(argv[i], "--tol=", 6) == 0) tol = std::atof(argv[i] + 6);
  }
  io::H5Reader out(argv[1]);
  io::SafetensorsFile ref(argv[2]);
  const auto& ids_t = ref.get("input_ids");
  const int B = static_cast<int>(ids_t.shape[0]), L = static_cast<int>(ids_t.shape[1]);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B) * L), lens(static_cast<std::size_t>(B));
  std::memcpy(ids.data(), ids_t.data, ids.size() * 4);
  std::memcpy(lens.data(), ref.get("lengths").data, lens.size() * 4);
  std::vector<float> want = io::to_f32(ref.get("logprobs"));
  if (base) {  // log_softmax(logits_base[b, t - 1])[ids[b, t]]
    const auto logits = io::to_f32(ref.get("logits_base"));
    const int V = static_cast<int>(ref.get("logits_base").shape[2]);
    for (int b = 0; b < B; ++b)
      for (int t = 1; t < lens[b]; ++t) {
        const float* row = &logits[(static_cast<std::size_t>(b) * L + t - 1) * V];
        double m = row[0], s = 0;
        for (int v = 0; v < V; ++v) m = std::max(m, static_cast<double>(row[v]));
        for (int v = 0; v < V; ++v) s += std::exp(row[v] - m);
        want[static_cast<std::size_t>(b) * L + t] = static_cast<float>(row[ids[b * L + t]] - m - std::log(s));
      }
  }
  int fails = 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "check_score: %s\n", what.c_str());
    ++fails;
  };
  const auto shape = out.shape("logprobs");
  if (shape.size() != 2 || shape[0] != static_cast<std::uint64_t>(B) || shape[1] > static_cast<std::uint64_t>(L))
    fail("logprobs has the wrong shape");
  if (out.shape("tokens") != shape) fail("tokens and logprobs differ in shape");
  if (fails) return 1;
  const int Lo = static_cast<int>(shape[1]);
  const auto got = out.read_all<float>("logprobs", DType::F32);
  const auto tok = out.read_all<std::int32_t>("tokens", DType::I32);
  const auto got_len = out.read_all<std::int32_t>("lengths", DType::I32);
  double num = 0, den = 0;
  for (int b = 0; b < B; ++b) {
    if (got_len[b] != lens[b]) fail("length of sequence " + std::to_string(b));
    for (int t = 0; t < Lo; ++t) {
      const float g = got[static_cast<std::size_t>(b) * Lo + t];
      const std::int32_t id = tok[static_cast<std::size_t>(b) * Lo + t];
      if (t >= lens[b]) {
        if (id != -1 || !std::isnan(g)) fail("padding at " + std::to_string(b) + "," + std::to_string(t));
        continue;
      }
      if (id != ids[b * L + t]) fail("token at " + std::to_string(b) + "," + std::to_string(t));
      if (t == 0) {
        if (!std::isnan(g)) fail("log-prob at t = 0 must be NaN");
        continue;
      }
      const double w = want[static_cast<std::size_t>(b) * L + t];
      num += (g - w) * (g - w);
      den += w * w;
    }
  }
  const double rel = std::sqrt(num / den);
  std::printf("check_score: relative error %.3g over %d sequences\n", rel, B);
  if (!(rel <= tol)) fail("log-probs differ from the reference (relative error " + std::to_string(rel) + ")");
  return fails ? 1 : 0;
}
