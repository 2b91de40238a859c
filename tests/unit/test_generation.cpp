// test_generation.cpp: inference with the KV cache and the generator on the CPU backend: cached
// decoding equals recomputing the whole sequence; greedy completions are token-identical to
// transformers' generate (tests/data/models/*/generate.json) and their log-probs equal what the
// training forward (mgrl score) computes; results do not depend on batching or on generate.sync_interval (decode
// steps run on the device between downloads); stop conditions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/jsonl.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "rl/generator.h"

namespace mgrl::rl {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR "/models/";

struct Loaded {
  io::ModelConfig cfg;
  std::unique_ptr<kernels::Ops> ops = kernels::make_cpu_ops();
  std::unique_ptr<model::Transformer> net;
  explicit Loaded(const std::string& name) : cfg(io::parse_hf_config(kData + name + "/config.json")) {
    net = std::make_unique<model::Transformer>(cfg, *ops);
    net->load_weights(kData + name);
    net->add_lora(model::read_peft_config(kData + name + "/adapter_config.json"), 0).load_peft(kData + name);
  }
};

class Generation : public ::testing::TestWithParam<std::string> {};

TEST_P(Generation, CachedDecodingEqualsFullRecompute) {
  Loaded m(GetParam());
  io::SafetensorsFile ref(kData + GetParam() + "/reference.safetensors");
  const int B = static_cast<int>(ref.get("input_ids").shape[0]), L = static_cast<int>(ref.get("input_ids").shape[1]);
  std::vector<std::int32_t> padded(static_cast<std::size_t>(B) * L), lengths(static_cast<std::size_t>(B));
  std::memcpy(padded.data(), ref.get("input_ids").data, padded.size() * 4);
  std::memcpy(lengths.data(), ref.get("lengths").data, lengths.size() * 4);
  const model::Batch b = model::Batch::from_padded(padded.data(), lengths.data(), B, L);
  std::vector<float> lp(b.tokens.size());
  m.net->forward(b, lp.data());
  const auto full = m.net->logits();
  const int V = static_cast<int>(m.cfg.vocab_size);

  model::KvCache cache(m.cfg, *m.ops, B, L);
  // Step 0: the first 2 tokens of every sequence in one packed call; then one row per sequence per step.
  std::vector<std::vector<float>> got(b.tokens.size());
  for (int step = 0;; ++step) {
    std::vector<std::int32_t> tok, slot, pos, rows;
    std::vector<std::pair<int, int>> where;
    for (int s = 0; s < B; ++s) {
      const int from = step == 0 ? 0 : step + 1, to = step == 0 ? 2 : step + 2;
      for (int t = from; t < std::min(to, b.length(s)); ++t) {
        tok.push_back(b.tokens[b.offsets[s] + t]);
        slot.push_back(s);
        pos.push_back(t);
        rows.push_back(static_cast<std::int32_t>(tok.size() - 1));
        where.emplace_back(s, t);
      }
    }
    if (tok.empty()) break;
    const float* logits = m.net->infer(tok, slot, pos, rows, cache);
    for (std::size_t r = 0; r < rows.size(); ++r)
      got[static_cast<std::size_t>(b.offsets[where[r].first] + where[r].second)].assign(logits + r * V,
                                                                                      logits + (r + 1) * V);
  }
  double num = 0, den = 0;
  for (int s = 0; s < B; ++s)
    for (int t = 0; t < b.length(s); ++t) {
      const std::size_t row = static_cast<std::size_t>(b.offsets[s] + t);
      const auto& g = got[row];
      ASSERT_EQ(g.size(), static_cast<std::size_t>(V)) << s << "," << t;
      for (int v = 0; v < V; ++v) {
        const double w = full[row * V + v];
        num += (g[v] - w) * (g[v] - w);
        den += w * w;
      }
    }
  EXPECT_LE(std::sqrt(num / den), 1e-5);
}

TEST_P(Generation, GreedyMatchesTransformersAndScore) {
  Loaded m(GetParam());
  const auto j = io::read_json_file(kData + GetParam() + "/generate.json");
  GenerationOptions o;
  o.max_new_tokens = j["max_new_tokens"].get<int>();
  o.sampling.temperature = 0;
  std::vector<Prompt> prompts;
  for (std::size_t i = 0; i < j["prompts"].size(); ++i)
    prompts.push_back({static_cast<std::int64_t>(i), j["prompts"][i].get<std::vector<std::int32_t>>()});
  Generator gen(*m.net, o);
  const auto out = gen.generate(prompts);
  ASSERT_EQ(out.size(), prompts.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].tokens, j["completions"][i].get<std::vector<std::int32_t>>()) << "prompt " << i;
    EXPECT_EQ(out[i].finish_reason, "length");
    const auto want_lp = j["logprobs"][i].get<std::vector<double>>();
    for (std::size_t t = 0; t < want_lp.size(); ++t) EXPECT_NEAR(out[i].logprobs[t], want_lp[t], 1e-4) << i << "," << t;
    // The recorded log-probs equal the training forward's (what mgrl score computes) on prompt + completion.
    std::vector<std::int32_t> seq = prompts[i].tokens;
    seq.insert(seq.end(), out[i].tokens.begin(), out[i].tokens.end());
    const auto batch = model::Batch::from_sequences({seq});
    std::vector<float> lp(seq.size());
    m.net->forward(batch, lp.data());
    for (std::size_t t = 0; t < out[i].tokens.size(); ++t)
      EXPECT_NEAR(out[i].logprobs[t], lp[prompts[i].tokens.size() + t], 1e-5) << i << "," << t;
  }
}

// Greedy with a repetition penalty (1.5, over prompt + completion so far) gives transformers' tokens, and the model's
// own log-probs of them (before the penalty): with one slot per prompt (slots reused: each slot's table is set anew
// for its prompt), with three, and with the decode steps on the device (sync_interval 4) or not.
TEST_P(Generation, GreedyWithRepetitionPenaltyMatchesTransformers) {
  Loaded m(GetParam());
  const auto j = io::read_json_file(kData + GetParam() + "/generate.json");
  const auto& pen = j["penalty"];
  std::vector<Prompt> prompts;
  for (std::size_t i = 0; i < j["prompts"].size(); ++i)
    prompts.push_back({static_cast<std::int64_t>(i), j["prompts"][i].get<std::vector<std::int32_t>>()});
  int changed = 0;
  for (const int slots : {1, 3})
    for (const int K : {1, 4}) {
      SCOPED_TRACE("max_sequences " + std::to_string(slots) + ", sync_interval " + std::to_string(K));
      GenerationOptions o;
      o.max_new_tokens = j["max_new_tokens"].get<int>();
      o.sampling.temperature = 0;
      o.repetition_penalty = pen["repetition_penalty"].get<float>();
      o.max_sequences = slots;
      o.sync_interval = K;
      Generator gen(*m.net, o);
      const auto out = gen.generate(prompts);
      ASSERT_EQ(out.size(), prompts.size());
      for (std::size_t i = 0; i < out.size(); ++i) {
        EXPECT_EQ(out[i].tokens, pen["completions"][i].get<std::vector<std::int32_t>>()) << "prompt " << i;
        const auto want_lp = pen["logprobs"][i].get<std::vector<double>>();
        ASSERT_EQ(out[i].logprobs.size(), want_lp.size());
        for (std::size_t t = 0; t < want_lp.size(); ++t)
          EXPECT_NEAR(out[i].logprobs[t], want_lp[t], 1e-4) << i << "," << t;
        changed += out[i].tokens != j["completions"][i].get<std::vector<std::int32_t>>();
      }
    }
  EXPECT_GT(changed, 0) << "the penalty changes no completion: the test shows nothing";
}

// The inference engine with the adapter merged into the weights (generate.merge_lora) gives the unmerged engine's
// logits up to the rounding of W + s B A (f32 here); the merged copy, not the adapter, is what it reads while merged
// (an adapter changed after the merge does not show until the next merge_lora), and unmerge() returns to the adapter.
TEST_P(Generation, MergedWeightsGiveTheUnmergedLogits) {
  Loaded m(GetParam());
  const int V = static_cast<int>(m.cfg.vocab_size);
  const std::vector<std::int32_t> tok{5, 9, 13, 2, 7, 100, 3}, slot(tok.size(), 0), pos{0, 1, 2, 3, 4, 5, 6},
      rows{0, 1, 2, 3, 4, 5, 6};
  model::KvCache cache(m.cfg, *m.ops, 1, 16);
  model::InferenceEngine& engine = m.net->engine();
  auto logits = [&](bool use_lora = true) {
    const float* l = m.net->infer(tok, slot, pos, rows, cache, use_lora);
    return std::vector<float>(l, l + rows.size() * static_cast<std::size_t>(V));
  };
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      den += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(num / den);
  };
  const auto unmerged = logits(), base = logits(false);
  ASSERT_GT(rel(unmerged, base), 1e-3) << "the fixture's adapter must change the logits";
  ASSERT_TRUE(engine.merge_lora(true));
  EXPECT_TRUE(engine.merged());
  const auto merged = logits();
  EXPECT_LE(rel(merged, unmerged), 1e-5);
  EXPECT_NE(merged, unmerged) << "bit-equal logits: the merged weights were not read";
  EXPECT_EQ(logits(false), base) << "use_lora = false must read the base weights while merged";
  // B = 0: the adapter is now a no-op, but the merged copy still holds the old one until the next merge.
  const auto params = m.net->lora()->to_host();
  std::vector<float> zero_b = params;
  for (const auto& s : m.net->lora()->slots())
    std::fill_n(zero_b.begin() + static_cast<std::ptrdiff_t>(s.b_offset),
                static_cast<std::size_t>(s.out) * static_cast<std::size_t>(m.net->lora()->config().r), 0.0f);
  m.net->lora()->from_host(zero_b);
  EXPECT_EQ(logits(), merged);
  ASSERT_TRUE(engine.merge_lora(true));
  EXPECT_LE(rel(logits(), base), 1e-6);
  engine.unmerge();
  EXPECT_FALSE(engine.merged());
  EXPECT_EQ(logits(), base);  // the adapter with B = 0 adds exactly 0
  m.net->lora()->from_host(params);
  EXPECT_EQ(logits(), unmerged);
}

INSTANTIATE_TEST_SUITE_P(Hf, Generation,
                         ::testing::Values("llama_gqa", "qwen2_bias_tied", "qwen3_qknorm", "gemma2_softcap",
                                           "gemma3_text", "mistral_window", "qwen3_yarn"));

std::vector<Prompt> some_prompts() {
  return {{0, {5, 9, 13}}, {1, {7}}, {2, {100, 3, 44, 8, 90, 2}}, {3, {11, 12}}, {4, {150, 151, 152, 153}}};
}

TEST(Generator, SamplingDependsOnlyOnSeedPromptAndIndex) {
  Loaded m("llama_gqa");
  GenerationOptions o;
  o.max_new_tokens = 7;
  o.num_generations = 3;
  o.sampling = {0.9f, 50, 0.95f, 0.01f};
  o.seed = 42;
  const auto prompts = some_prompts();
  Generator wide(*m.net, o);
  const auto a = wide.generate(prompts);
  o.max_sequences = 3;  // one prompt in flight at a time: other batches, same results
  Generator narrow(*m.net, o);
  const auto b = narrow.generate(prompts);
  ASSERT_EQ(a.size(), prompts.size() * 3);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << i << ": inference is batch-invariant on the CPU, bit for bit";
    EXPECT_EQ(a[i].prompt_index, b[i].prompt_index);
    EXPECT_EQ(a[i].generation, b[i].generation);
  }
  // A subset of the prompts (as another rank would get) gives the same completions for them.
  Generator part(*m.net, o);
  const auto c = part.generate({prompts[2], prompts[4]});
  EXPECT_EQ(c[0].tokens, a[2 * 3].tokens);
  EXPECT_EQ(c[0].logprobs, a[2 * 3].logprobs);
  EXPECT_EQ(c[5].tokens, a[4 * 3 + 2].tokens);
  EXPECT_EQ(c[5].logprobs, a[4 * 3 + 2].logprobs);
  // The G completions of a prompt differ (they share the prefill, not the draws); another seed differs.
  EXPECT_NE(a[0].tokens, a[1].tokens);
  o.seed = 43;
  Generator other(*m.net, o);
  EXPECT_NE(other.generate(prompts)[0].tokens, a[0].tokens);
}

// The cache's block size, the prefill budget (long prompts in chunks over several steps) and the number of slots
// change how a generation is scheduled, never what it produces: on the CPU, bit for bit.
TEST(Generator, BlockSizeAndPrefillChunksChangeNothing) {
  Loaded m("llama_gqa");
  GenerationOptions o;
  o.max_new_tokens = 9;
  o.num_generations = 3;
  o.sampling = {1.0f, 0, 1.0f, 0.0f};
  o.seed = 7;
  auto prompts = some_prompts();
  std::vector<std::int32_t> long_prompt;
  for (int i = 0; i < 23; ++i) long_prompt.push_back(static_cast<std::int32_t>(10 + 7 * i));
  prompts.push_back({5, long_prompt});
  Generator base_gen(*m.net, o);
  const auto base = base_gen.generate(prompts);
  struct Variant {
    int block, prefill, slots;
  };
  for (const Variant v : {Variant{1, 2048, 64}, Variant{3, 2048, 64}, Variant{1000, 2048, 64}, Variant{4, 1, 64},
                          Variant{5, 4, 6}, Variant{2, 7, 3}}) {
    SCOPED_TRACE("block " + std::to_string(v.block) + ", prefill " + std::to_string(v.prefill) + ", slots " +
                 std::to_string(v.slots));
    GenerationOptions w = o;
    w.kv_block_size = v.block;
    w.max_prefill_tokens = v.prefill;
    w.max_sequences = v.slots;
    Generator gen(*m.net, w);
    const auto got = gen.generate(prompts);
    ASSERT_EQ(got.size(), base.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, base[i].tokens) << i;
      EXPECT_EQ(got[i].logprobs, base[i].logprobs) << i;
      EXPECT_EQ(got[i].finish_reason, base[i].finish_reason) << i;
    }
    if (v.prefill == 1) {
      EXPECT_GE(gen.stats().steps, 23) << "one prompt token per step";
    }
  }
}

TEST(KvCachePool, SharedBlocksReturnWithTheirLastUser) {
  Loaded m("llama_gqa");
  model::KvCache cache(m.cfg, *m.ops, 3, 10, 6, 4);
  EXPECT_EQ(cache.free_blocks(), 6);
  cache.assign(0, 10);  // 3 blocks
  EXPECT_EQ(cache.free_blocks(), 3);
  cache.fork(1, 0, 9, 10);  // shares positions 0..7 (2 blocks), a fresh block for 8..9
  EXPECT_EQ(cache.free_blocks(), 2);
  EXPECT_TRUE(cache.has(1, 9));
  EXPECT_THROW(cache.fork(1, 0, 9, 10), FatalError);  // slot 1 is in use
  EXPECT_THROW(cache.assign(2, 10), FatalError);     // 3 blocks needed, 2 free
  cache.release(0);  // its own third block returns; the shared two stay with slot 1
  EXPECT_EQ(cache.free_blocks(), 3);
  EXPECT_TRUE(cache.has(1, 0));
  EXPECT_FALSE(cache.has(0, 0));
  cache.release(1);
  EXPECT_EQ(cache.free_blocks(), 6);
  cache.assign(2, 10);
  EXPECT_EQ(cache.free_blocks(), 3);
}

// The G completions of a prompt hold its blocks once: the pool is sized for completions, not G prompt copies.
TEST(Generator, CompletionsShareThePromptsCacheBlocks) {
  Loaded m("llama_gqa");
  GenerationOptions o;
  o.max_new_tokens = 4;
  o.num_generations = 8;
  o.kv_block_size = 4;
  o.sampling.temperature = 0;
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(static_cast<std::int32_t>(3 + i));
  Generator gen(*m.net, o);
  const auto out = gen.generate({{0, prompt}});
  for (int g = 1; g < 8; ++g) EXPECT_EQ(out[static_cast<std::size_t>(g)].tokens, out[0].tokens);
  // 10 prompt blocks once + 8 completions x 2 blocks (positions 40..43 in one, the last token fed at 43) = 26
  // blocks, against 8 x 11 = 88 with a copy of the prompt per completion.
  EXPECT_EQ(gen.stats().kv_blocks, 26);
  const std::size_t per_block = 2 * static_cast<std::size_t>(m.cfg.num_hidden_layers) * m.cfg.kv_dim() * 4 * 4;
  EXPECT_EQ(gen.stats().kv_cache_bytes, 26 * per_block);
  // what `mgrl plan` counts for it (Generator::kv_pool), and with fewer sequences asked for than a group: the
  // generator holds a whole group anyway (8 slots), and so does the count
  const Generator::KvPool pool = Generator::kv_pool(o.max_sequences, 8, 1, 40, 4, 4);
  EXPECT_EQ(pool.blocks, 26);
  EXPECT_EQ(pool.slots, 8);
  const Generator::KvPool few = Generator::kv_pool(2, 8, 3, 40, 4, 4);
  EXPECT_EQ(few.slots, 8);
  EXPECT_EQ(few.blocks, 26);
}

TEST(Generator, GreedyCompletionsOfOnePromptAreIdentical) {
  Loaded m("qwen3_qknorm");
  GenerationOptions o;
  o.max_new_tokens = 6;
  o.num_generations = 4;
  o.sampling.temperature = 0;
  Generator gen(*m.net, o);
  const auto out = gen.generate(some_prompts());
  for (std::size_t p = 0; p < 5; ++p)
    for (int g = 1; g < 4; ++g) EXPECT_EQ(out[p * 4 + g].tokens, out[p * 4].tokens) << p;
  EXPECT_EQ(gen.stats().generated_tokens, 5 * 4 * 6);
}

TEST(Generator, StopsOnEosStopStringsAndLength) {
  Loaded m("llama_gqa");
  GenerationOptions o;
  o.max_new_tokens = 10;
  o.sampling.temperature = 0;
  Generator probe(*m.net, o);
  const auto greedy = probe.generate({{0, {202, 120, 200, 147, 197, 123}}});  // 3 87 164 74 50 ...
  ASSERT_GE(greedy[0].tokens.size(), 4u);
  // EOS: the fourth greedy token ends the completion and is kept.
  o.eos_ids = {greedy[0].tokens[3]};
  Generator eos(*m.net, o);
  const auto e = eos.generate({{0, {202, 120, 200, 147, 197, 123}}});
  EXPECT_EQ(e[0].finish_reason, "eos");
  EXPECT_EQ(e[0].tokens, std::vector<std::int32_t>(greedy[0].tokens.begin(), greedy[0].tokens.begin() + 4));
  // A stop string made of the 2nd and 3rd tokens' text: the text is cut before it.
  o.eos_ids.clear();
  auto decode = [](const std::vector<std::int32_t>& ids) {
    std::string s;
    for (auto id : ids) s += "<" + std::to_string(id) + ">";
    return s;
  };
  o.stop_strings = {"<" + std::to_string(greedy[0].tokens[1]) + "><" + std::to_string(greedy[0].tokens[2]) + ">"};
  Generator stop(*m.net, o, decode);
  const auto s = stop.generate({{0, {202, 120, 200, 147, 197, 123}}});
  EXPECT_EQ(s[0].finish_reason, "stop");
  EXPECT_EQ(s[0].tokens.size(), 3u);
  EXPECT_EQ(s[0].text, "<" + std::to_string(greedy[0].tokens[0]) + ">");
  EXPECT_EQ(greedy[0].finish_reason, "length");
  EXPECT_EQ(greedy[0].tokens.size(), 10u);
}

// generate.sync_interval = K runs decode steps back to back on the device (the sampled token feeds the next step
// there, EOS and length end a sequence there, stop strings are applied on the host after each download): every K
// gives what one round trip per step gives, bit for bit, with EOS, stop-string and length finishes, G = 2 sharing
// a prefill and admissions as slots free up.
TEST(Generator, SyncIntervalChangesNothing) {
  Loaded m("llama_gqa");
  auto decode = [](const std::vector<std::int32_t>& ids) {
    std::string s;
    for (auto id : ids) s += "<" + std::to_string(id) + ">";
    return s;
  };
  GenerationOptions o;
  o.max_new_tokens = 12;
  o.num_generations = 2;
  o.sampling = {0.9f, 40, 0.95f, 0.0f};
  o.seed = 11;
  o.max_sequences = 4;  // two prompts in flight: the others are admitted as slots free up
  o.sync_interval = 1;
  auto prompts = some_prompts();
  std::vector<std::int32_t> long_prompt;
  for (int i = 0; i < 23; ++i) long_prompt.push_back(static_cast<std::int32_t>(20 + 5 * i));
  prompts.push_back({5, long_prompt});
  Generator probe(*m.net, o, decode);
  const auto plain = probe.generate(prompts);
  ASSERT_EQ(plain.size(), 12u);
  // EOS: tokens drawn in the middle of two completions; a stop string: two consecutive tokens of a third.
  o.eos_ids = {plain[0].tokens[4], plain[3].tokens[7]};
  o.stop_strings = {"<" + std::to_string(plain[6].tokens[2]) + "><" + std::to_string(plain[6].tokens[3]) + ">"};
  o.max_prefill_tokens = 5;  // the long prompt in chunks, beside running decodes
  Generator ref_gen(*m.net, o, decode);
  const auto ref = ref_gen.generate(prompts);
  int eos = 0, stop = 0, length = 0;
  for (const auto& c : ref) {
    eos += c.finish_reason == "eos";
    stop += c.finish_reason == "stop";
    length += c.finish_reason == "length";
  }
  EXPECT_GE(eos, 2);
  EXPECT_GE(stop, 1);
  EXPECT_GE(length, 1);
  EXPECT_EQ(ref_gen.stats().device_steps, 0);
  for (int K : {2, 7, 16}) {
    SCOPED_TRACE("sync_interval " + std::to_string(K));
    GenerationOptions w = o;
    w.sync_interval = K;
    Generator gen(*m.net, w, decode);
    const auto got = gen.generate(prompts);
    ASSERT_EQ(got.size(), ref.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, ref[i].tokens) << i;
      EXPECT_EQ(got[i].logprobs, ref[i].logprobs) << i;
      EXPECT_EQ(got[i].finish_reason, ref[i].finish_reason) << i;
      EXPECT_EQ(got[i].text, ref[i].text) << i;
    }
    EXPECT_EQ(gen.stats().generated_tokens, ref_gen.stats().generated_tokens);
    EXPECT_GT(gen.stats().device_steps, 0);
  }
}

// Sampling with a repetition penalty depends on the seed, the prompt and the index alone, like sampling without: the
// same completions with 12 slots or 2 (slots reused), decode steps on the device or not; the penalty changes them;
// the recorded log-probs are the model's (what the training forward gives), not the penalised distribution's.
TEST(Generator, RepetitionPenaltySamplingIsBatchInvariantAndLogsTheModelsLogprobs) {
  Loaded m("qwen2_bias_tied");
  GenerationOptions o;
  o.max_new_tokens = 10;
  o.num_generations = 3;
  o.sampling = {0.2f, 0, 1.0f, 0.0f};  // near-greedy: the tiny model loops over a few tokens without the penalty
  o.seed = 5;
  o.repetition_penalty = 100.0f;
  o.sync_interval = 1;
  const auto prompts = some_prompts();
  std::vector<std::vector<Completion>> runs;
  for (const int slots : {12, 2})
    for (const int K : {1, 8}) {
      GenerationOptions w = o;
      w.max_sequences = slots;
      w.sync_interval = K;
      Generator gen(*m.net, w);
      runs.push_back(gen.generate(prompts));
    }
  for (std::size_t r = 1; r < runs.size(); ++r)
    for (std::size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_EQ(runs[r][i].tokens, runs[0][i].tokens) << r << "," << i;
      EXPECT_EQ(runs[r][i].logprobs, runs[0][i].logprobs) << r << "," << i;
    }
  GenerationOptions plain = o;
  plain.repetition_penalty = 1.0f;
  Generator gen(*m.net, plain);
  const auto base = gen.generate(prompts);
  int changed = 0, repeats_with = 0, repeats_without = 0;
  auto repeats = [](const Prompt& p, const Completion& c) {  // tokens drawn that were already in the sequence
    std::vector<std::int32_t> seq = p.tokens;
    int n = 0;
    for (const auto t : c.tokens) {
      n += std::find(seq.begin(), seq.end(), t) != seq.end();
      seq.push_back(t);
    }
    return n;
  };
  for (std::size_t i = 0; i < base.size(); ++i) {
    changed += base[i].tokens != runs[0][i].tokens;
    repeats_with += repeats(prompts[i / 3], runs[0][i]);
    repeats_without += repeats(prompts[i / 3], base[i]);
    // The model's log-probs of the drawn tokens, as the training forward computes them.
    std::vector<std::int32_t> seq = prompts[i / 3].tokens;
    seq.insert(seq.end(), runs[0][i].tokens.begin(), runs[0][i].tokens.end());
    std::vector<float> lp(seq.size());
    m.net->forward(model::Batch::from_sequences({seq}), lp.data());
    for (std::size_t t = 0; t < runs[0][i].tokens.size(); ++t)
      EXPECT_NEAR(runs[0][i].logprobs[t], lp[prompts[i / 3].tokens.size() + t], 1e-5) << i << "," << t;
  }
  EXPECT_GT(changed, 0);
  EXPECT_LT(repeats_with * 2, repeats_without) << "the penalty does not make repeats rarer";
  std::printf("repeated tokens drawn: %d without the penalty, %d with it\n", repeats_without, repeats_with);
}

// generate.merge_lora on: greedy completions are the unmerged ones (the CPU's merged weights differ from W and the
// adapter's sum only by f32 rounding), log-probs within 1e-4; the merge is undone when generate() returns; and it is
// refreshed at every call: after the adapter changes, the merged generation follows it (a stale merge would repeat
// the first call's completions, which differ).
TEST(Generator, MergedLoraSamplesAsUnmergedAndFollowsTheAdapter) {
  Loaded m("llama_gqa");
  GenerationOptions o;
  o.max_new_tokens = 10;
  o.num_generations = 2;
  o.sampling.temperature = 0;
  const auto prompts = some_prompts();
  GenerationOptions om = o;
  om.merge_lora = GenerationOptions::Merge::On;
  auto same = [](const std::vector<Completion>& a, const std::vector<Completion>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
      ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size()) << i;
      for (std::size_t t = 0; t < a[i].logprobs.size(); ++t) EXPECT_NEAR(a[i].logprobs[t], b[i].logprobs[t], 1e-4);
    }
  };
  Generator plain(*m.net, o), merged(*m.net, om);
  const auto first = plain.generate(prompts);
  EXPECT_FALSE(plain.stats().merged_lora);
  same(merged.generate(prompts), first);
  EXPECT_TRUE(merged.stats().merged_lora);
  EXPECT_FALSE(m.net->engine().merged()) << "the merge outlived its generate() call";
  // A bigger adapter (B x 4): other completions, and the merged generator, reused, follows.
  auto params = m.net->lora()->to_host();
  for (const auto& s : m.net->lora()->slots())
    for (std::size_t i = 0; i < static_cast<std::size_t>(s.out) * m.net->lora()->config().r; ++i)
      params[s.b_offset + i] *= 4.0f;
  m.net->lora()->from_host(params);
  const auto second = plain.generate(prompts);
  bool differs = false;
  for (std::size_t i = 0; i < second.size(); ++i) differs = differs || second[i].tokens != first[i].tokens;
  ASSERT_TRUE(differs) << "the changed adapter must change the completions for this test to see a stale merge";
  same(merged.generate(prompts), second);
  EXPECT_TRUE(merged.stats().merged_lora);
}

// The host waits for the device (downloads the sampled tokens) once per sync_interval decode steps: 5 prompts of 32
// tokens each, all admitted at once, no EOS: one prefill step then 31 decode steps, in runs of at most K.
TEST(Generator, SyncIntervalCutsTheDownloadsPerToken) {
  Loaded m("llama_gqa");
  GenerationOptions o;
  o.max_new_tokens = 32;
  o.sampling = {1.0f, 0, 1.0f, 0.0f};
  o.seed = 3;
  std::vector<Completion> ref;
  for (int K : {1, 2, 8, 16}) {
    SCOPED_TRACE("sync_interval " + std::to_string(K));
    o.sync_interval = K;
    Generator gen(*m.net, o);
    const auto got = gen.generate(some_prompts());
    EXPECT_EQ(gen.stats().generated_tokens, 5 * 32);
    EXPECT_EQ(gen.stats().downloads, 2 * (1 + (31 + K - 1) / K)) << "two downloads (tokens, log-probs) per sync";
    EXPECT_EQ(gen.stats().steps, 32);
    if (K == 1) ref = got;
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tokens, ref[i].tokens) << i;
  }
}

TEST(Generator, TooLongForTheModelIsAUserError) {
  Loaded m("llama_gqa");
  GenerationOptions o;
  o.max_new_tokens = 200;  // + prompt > max_position_embeddings (128)
  Generator gen(*m.net, o);
  EXPECT_THROW(gen.generate(some_prompts()), UserError);
}

}  // namespace
}  // namespace mgrl::rl
