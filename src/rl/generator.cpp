// generator.cpp: continuous-batching generation over model::Transformer::infer, a paged model::KvCache and
// Ops::sample; runs of decode steps on the device (Ops::decode_advance) between host round trips.
#include "rl/generator.h"

#include "dist/mpi_env.h"
#include "dist/progress.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/random.h"

namespace mgrl::rl {

std::vector<std::int32_t> stop_ids(const io::ModelConfig& mc, const io::Tokenizer* tok) {
  std::vector<std::int32_t> ids;
  for (const auto id : mc.eos_token_ids) ids.push_back(static_cast<std::int32_t>(id));
  if (tok && tok->eos_id() && std::find(ids.begin(), ids.end(), *tok->eos_id()) == ids.end())
    ids.push_back(*tok->eos_id());
  return ids;
}

Generator::Generator(model::Transformer& model, GenerationOptions opts,
                     std::function<std::string(const std::vector<std::int32_t>&)> decode)
    : model_(model), opts_(std::move(opts)), decode_(std::move(decode)) {
  if (opts_.num_generations < 1) throw UserError("generate.num_generations must be at least 1");
  if (opts_.max_new_tokens < 1) throw UserError("generate.max_new_tokens must be at least 1");
  if (!opts_.stop_strings.empty() && !decode_) throw FatalError("stop strings need a decoder");
  if (opts_.sync_interval < 1) throw UserError("generate.sync_interval must be at least 1");
  opts_.max_sequences = std::max(opts_.max_sequences, opts_.num_generations);
}

Generator::KvPool Generator::kv_pool(int max_sequences, int G, std::int64_t prompts, int longest, int max_new_tokens,
                                     int kv_block_size) {
  KvPool p;
  p.max_len = longest + max_new_tokens;
  p.slots = static_cast<int>(
      std::max<std::int64_t>(1, std::min<std::int64_t>(std::max(max_sequences, G), prompts * G)));
  p.block_size = std::max(1, std::min(kv_block_size, p.max_len));
  const int own_max = model::KvCache::blocks_for(p.block_size - 1 + max_new_tokens, p.block_size);
  p.blocks = (p.slots / G) * (longest / p.block_size) + p.slots * own_max;
  return p;
}

std::uint64_t Generator::draw_stream(std::uint64_t seed, std::int64_t prompt_index, int generation) {
  return random_bits(random_bits(seed, static_cast<std::uint64_t>(prompt_index)), static_cast<std::uint64_t>(generation));
}

std::uint64_t Generator::draw_seed(std::uint64_t seed, std::int64_t prompt_index, int generation, int step) {
  return random_bits(draw_stream(seed, prompt_index, generation), static_cast<std::uint64_t>(step));
}

namespace {
struct Running {
  std::size_t completion;  // index into the result
  int slot;
  int pos;                 // position of the next token to feed
  std::int32_t next;       // the token to feed
};
// A prompt admitted to its G slots whose prefill is under way (in chunks of the per-step prefill budget).
struct Prefilling {
  std::size_t prompt;
  std::vector<int> slots;  // slots[0] runs the prefill; the others share its cache blocks once it is done
  int done = 0;            // prompt tokens already in the cache
};
}  // namespace

std::vector<Completion> Generator::generate(const std::vector<Prompt>& prompts) {
  const auto t0 = std::chrono::steady_clock::now();
  const int G = opts_.num_generations;
  std::size_t longest = 1;
  for (const auto& p : prompts) {
    if (p.tokens.empty()) throw UserError("prompt " + std::to_string(p.index) + " has no tokens");
    longest = std::max(longest, p.tokens.size());
  }
  const int max_len = static_cast<int>(longest) + opts_.max_new_tokens;
  const auto& mc = model_.config();
  if (mc.max_position_embeddings > 0 && max_len > mc.max_position_embeddings)
    throw UserError("prompt (" + std::to_string(longest) + " tokens) + max_new_tokens (" +
                    std::to_string(opts_.max_new_tokens) + ") exceeds the model's max_position_embeddings (" +
                    std::to_string(mc.max_position_embeddings) + ")");
  if (prompts.empty() && !opts_.lockstep) return {};
  // The adapter merged into the weights for this call (its current values: they change after every optimizer step),
  // undone when the call ends however it ends.
  struct Unmerge {
    model::InferenceEngine& engine;
    ~Unmerge() { engine.unmerge(); }
  } unmerge{model_.engine()};
  bool merged = false;
  if (opts_.merge_lora != GenerationOptions::Merge::Off && opts_.use_lora && model_.lora()) {
    model::InferenceEngine& engine = model_.engine();
    const bool failed_before = engine.merge_failed();
    merged = engine.merge_lora(opts_.merge_lora == GenerationOptions::Merge::On);
    if (!merged && !failed_before && engine.merge_failed())
      log::warn("generate.merge_lora = \"auto\": the merged copy of the adapted weights (" +
                std::to_string(model::InferenceEngine::merged_bytes(mc, model_.ops().storage_size(),
                                                                    model_.lora()->config()) >> 20) +
                " MiB) did not fit or would take more than 1/" +
                std::to_string(model::InferenceEngine::kMergeShare) +
                " of the free device memory; sampling with the unmerged adapter (\"on\" merges regardless)");
  }
  const KvPool pool = kv_pool(opts_.max_sequences, G, static_cast<std::int64_t>(prompts.size()),
                              static_cast<int>(longest), opts_.max_new_tokens, opts_.kv_block_size);
  const int n_slots = pool.slots, bs = pool.block_size;
  model::KvCache cache(mc, model_.ops(), n_slots, max_len, pool.blocks, bs);
  auto blocks_needed = [&](int len) {
    const int total = model::KvCache::blocks_for(len + opts_.max_new_tokens, bs);
    return total + (G - 1) * (total - len / bs);
  };
  kernels::Ops& ops = model_.ops();

  std::vector<Completion> out(prompts.size() * static_cast<std::size_t>(G));
  for (std::size_t p = 0; p < prompts.size(); ++p)
    for (int g = 0; g < G; ++g) {
      out[p * G + g].prompt_index = prompts[p].index;
      out[p * G + g].generation = g;
    }
  std::vector<int> free_slots;
  for (int s = n_slots - 1; s >= 0; --s) free_slots.push_back(s);
  std::vector<Running> running;
  std::deque<Prefilling> prefilling;
  std::size_t next_prompt = 0;
  // The next prompt can be admitted: G slots and its cache blocks are free (its prefill may start later).
  auto admissible = [&] {
    return next_prompt < prompts.size() && static_cast<int>(free_slots.size()) >= G &&
           cache.free_blocks() >= blocks_needed(static_cast<int>(prompts[next_prompt].tokens.size()));
  };

  // Device buffers for sampling, sized for the largest step.
  const int max_rows = n_slots;
  auto* d_tokens = static_cast<std::int32_t*>(ops.alloc(static_cast<std::size_t>(max_rows) * 4));
  auto* d_logprobs = static_cast<float*>(ops.alloc(static_cast<std::size_t>(max_rows) * 4));
  auto* d_seeds = static_cast<std::uint64_t*>(ops.alloc(static_cast<std::size_t>(max_rows) * 8));
  std::vector<std::int32_t> h_tokens(static_cast<std::size_t>(max_rows));
  std::vector<float> h_logprobs(static_cast<std::size_t>(max_rows));
  std::vector<std::uint64_t> h_seeds(static_cast<std::size_t>(max_rows));
  // Decode steps on the device (sync_interval > 1): the per-row state of Ops::decode_advance and the token ring.
  const int K = opts_.sync_interval;
  const int n_eos = static_cast<int>(opts_.eos_ids.size());
  std::int32_t *d_count = nullptr, *d_done = nullptr, *d_eos = nullptr, *d_ring_tokens = nullptr;
  std::uint64_t* d_streams = nullptr;
  float* d_ring_logprobs = nullptr;
  std::vector<std::int32_t> h_ring_tokens;
  std::vector<float> h_ring_logprobs;
  std::vector<std::uint64_t> h_streams(static_cast<std::size_t>(max_rows));
  if (K > 1) {
    const std::size_t rows = static_cast<std::size_t>(max_rows), ring = rows * static_cast<std::size_t>(K);
    d_count = static_cast<std::int32_t*>(ops.alloc(rows * 4));
    d_done = static_cast<std::int32_t*>(ops.alloc(rows * 4));
    d_streams = static_cast<std::uint64_t*>(ops.alloc(rows * 8));
    d_eos = static_cast<std::int32_t*>(ops.alloc(std::max<std::size_t>(1, opts_.eos_ids.size()) * 4));
    if (n_eos > 0) ops.upload(d_eos, opts_.eos_ids.data(), opts_.eos_ids.size() * 4);
    d_ring_tokens = static_cast<std::int32_t*>(ops.alloc(ring * 4));
    d_ring_logprobs = static_cast<float*>(ops.alloc(ring * 4));
    h_ring_tokens.resize(ring);
    h_ring_logprobs.resize(ring);
  }

  // The repetition penalty: a byte per (slot, token) marking the tokens of the slot's sequence (its prompt, set when
  // the prompt is admitted, and each token sampled into it), each row's slot, and the penalised logits that sample()
  // reads; the recorded log-probs are then recomputed from the model's own logits.
  const bool penalise = opts_.repetition_penalty != 1.0f;
  const int V = static_cast<int>(mc.vocab_size);
  std::uint8_t* d_seen = nullptr;
  std::int32_t* d_seen_row = nullptr;
  float* d_penalised = nullptr;
  std::vector<std::uint8_t> h_seen;
  if (penalise) {
    d_seen = static_cast<std::uint8_t*>(ops.alloc(static_cast<std::size_t>(n_slots) * V));
    d_seen_row = static_cast<std::int32_t*>(ops.alloc(static_cast<std::size_t>(max_rows) * 4));
    d_penalised = static_cast<float*>(ops.alloc(static_cast<std::size_t>(max_rows) * V * 4));
    h_seen.resize(static_cast<std::size_t>(V));
  }
  // Row r of logits (R rows, raw) sampled into d_tokens / d_logprobs; with the penalty, d_seen_row holds each row's
  // slot and the tokens join their slots' tables.
  auto sample_rows = [&](const float* logits, int R) {
    if (!penalise) {
      ops.sample(d_tokens, d_logprobs, logits, d_seeds, R, V, opts_.sampling);
      return;
    }
    ops.repetition_penalty(d_penalised, logits, d_seen, d_seen_row, R, V, opts_.repetition_penalty);
    ops.sample(d_tokens, d_logprobs, d_penalised, d_seeds, R, V, opts_.sampling);
    ops.token_logprobs(d_logprobs, logits, d_tokens, R, V);
    ops.mark_seen(d_seen, d_seen_row, d_tokens, R, V);
  };

  auto finish = [&](Completion& c, const char* reason) { c.finish_reason = reason; };
  // A sampled token joins its completion; whether that ends it (EOS, a stop string, the length).
  auto accept = [&](Completion& c, std::int32_t tok, float logprob) {
    c.tokens.push_back(tok);
    c.logprobs.push_back(logprob);
    ++stats_.generated_tokens;
    if (std::find(opts_.eos_ids.begin(), opts_.eos_ids.end(), tok) != opts_.eos_ids.end()) {
      finish(c, "eos");
      return true;
    }
    if (!opts_.stop_strings.empty()) {
      const std::string text = decode_(c.tokens);
      for (const auto& stop : opts_.stop_strings) {
        const auto at = text.find(stop);
        if (at != std::string::npos) {
          finish(c, "stop");
          c.text = text.substr(0, at);
          return true;
        }
      }
    }
    if (static_cast<int>(c.tokens.size()) >= opts_.max_new_tokens) {
      finish(c, "length");
      return true;
    }
    return false;
  };
  stats_ = {};
  stats_.merged_lora = merged;
  stats_.prompts = static_cast<std::int64_t>(prompts.size());
  stats_.kv_blocks = pool.blocks;
  stats_.kv_cache_bytes = cache.bytes();
  const int budget_per_step = std::max(1, opts_.max_prefill_tokens);

  for (std::int64_t iteration = 0;; ++iteration) {
    // Ranks waiting for this one's generation wait on while it moves (dist/progress.h).
    dist::note_generation_step();
    fault::point("generate_step", iteration);  // tests: a rank whose generation is slow (core/fault.h)
    const bool work = next_prompt < prompts.size() || !running.empty() || !prefilling.empty();
    if (opts_.lockstep) {
      if (!opts_.lockstep(work)) break;
      if (!work) {  // another rank still generates: one step on a scratch slot (every slot is free here)
        const int s = free_slots.back();
        cache.assign(s, 1);
        model_.infer({0}, {s}, {0}, {0}, cache, opts_.use_lora);
        cache.release(s);
        continue;
      }
    } else if (!work) {
      break;
    }
    // Nothing to prefill and no prompt can be admitted: up to K decode steps on the device, one download at the end.
    // Not with lockstep (a sharded base): every rank must then run each step after agreeing on it.
    if (K > 1 && !opts_.lockstep && prefilling.empty() && !running.empty() && !admissible()) {
      const int R = static_cast<int>(running.size());
      std::vector<std::int32_t> tokens(R), slot(R), pos(R), count(R);
      int steps = 1;
      for (int r = 0; r < R; ++r) {
        const Running& q = running[static_cast<std::size_t>(r)];
        const Completion& c = out[q.completion];
        tokens[r] = q.next;
        slot[r] = q.slot;
        pos[r] = q.pos;
        count[r] = static_cast<std::int32_t>(c.tokens.size());
        steps = std::max(steps, opts_.max_new_tokens - count[r]);
        h_streams[r] = draw_stream(opts_.seed, c.prompt_index, c.generation);
        h_seeds[r] = draw_seed(opts_.seed, c.prompt_index, c.generation, count[r]);
      }
      steps = std::min(steps, K);
      const auto in = model_.engine().load_decode(tokens, slot, pos, cache);
      ops.upload(d_seeds, h_seeds.data(), static_cast<std::size_t>(R) * 8);
      ops.upload(d_streams, h_streams.data(), static_cast<std::size_t>(R) * 8);
      ops.upload(d_count, count.data(), static_cast<std::size_t>(R) * 4);
      ops.zero(d_done, static_cast<std::size_t>(R) * 4);
      if (penalise) ops.upload(d_seen_row, slot.data(), static_cast<std::size_t>(R) * 4);
      for (int s = 0; s < steps; ++s) {
        const float* logits = model_.engine().infer_loaded(R, cache, opts_.use_lora);
        // A row already done samples on (its entries are dropped); the tokens it adds to its slot's table do not
        // matter: a slot's table is set anew when a prompt takes the slot.
        sample_rows(logits, R);
        ops.decode_advance(in.ids, in.pos, d_count, d_done, d_seeds, d_ring_tokens + static_cast<std::size_t>(s) * R,
                           d_ring_logprobs + static_cast<std::size_t>(s) * R, d_tokens, d_logprobs, d_streams, d_eos,
                           n_eos, opts_.max_new_tokens, R);
        ++stats_.steps;
        ++stats_.device_steps;
      }
      const std::size_t n = static_cast<std::size_t>(steps) * static_cast<std::size_t>(R);
      ops.download(h_ring_tokens.data(), d_ring_tokens, n * 4);
      ops.download(h_ring_logprobs.data(), d_ring_logprobs, n * 4);
      stats_.downloads += 2;
      // The host replays the steps row by row: the same stop decisions as one step at a time; a row's entries after
      // its end are the device's idle repeats and are dropped.
      std::vector<Running> next;
      for (int r = 0; r < R; ++r) {
        Running q = running[static_cast<std::size_t>(r)];
        Completion& c = out[q.completion];
        bool done = false;
        for (int s = 0; s < steps && !done; ++s) {
          const std::size_t at = static_cast<std::size_t>(s) * R + static_cast<std::size_t>(r);
          done = accept(c, h_ring_tokens[at], h_ring_logprobs[at]);
          q.next = h_ring_tokens[at];
          ++q.pos;
        }
        if (done) {
          cache.release(q.slot);
          free_slots.push_back(q.slot);
        } else {
          next.push_back(q);
        }
      }
      running = std::move(next);
      continue;
    }
    std::vector<std::int32_t> tokens, slot, pos, out_rows;
    std::vector<std::size_t> row_completion;  // completion of each output row
    std::vector<std::int32_t> row_slot;       // and its slot (the repetition penalty's table)
    // Decode rows of the running sequences.
    for (const auto& r : running) {
      tokens.push_back(r.next);
      slot.push_back(r.slot);
      pos.push_back(r.pos);
      out_rows.push_back(static_cast<std::int32_t>(tokens.size() - 1));
      row_completion.push_back(r.completion);
      row_slot.push_back(r.slot);
    }
    // Admit prompts while G slots and their cache blocks are free (their prefill may start later).
    while (admissible()) {
      const int len = static_cast<int>(prompts[next_prompt].tokens.size());
      Prefilling a{next_prompt, {}, 0};
      for (int g = 0; g < G; ++g) {
        a.slots.push_back(free_slots.back());
        free_slots.pop_back();
      }
      cache.assign(a.slots[0], len + opts_.max_new_tokens);
      for (int g = 1; g < G; ++g) cache.fork(a.slots[g], a.slots[0], len, len + opts_.max_new_tokens);
      if (penalise) {  // the prompt's tokens in each of its slots' tables
        std::fill(h_seen.begin(), h_seen.end(), std::uint8_t{0});
        for (const std::int32_t t : prompts[next_prompt].tokens) h_seen[static_cast<std::size_t>(t)] = 1;
        for (int g = 0; g < G; ++g)
          ops.upload(d_seen + static_cast<std::size_t>(a.slots[g]) * V, h_seen.data(), static_cast<std::size_t>(V));
      }
      prefilling.push_back(std::move(a));
      stats_.prompt_tokens += len;
      ++next_prompt;
    }
    // Prefill rows: the prompts under way in admission order, up to the step's budget (a long prompt in chunks).
    // A prompt whose last chunk runs now gets the G output rows of its first tokens, all from its last row.
    int budget = budget_per_step;
    for (auto& a : prefilling) {
      if (budget == 0) break;
      const auto& p = prompts[a.prompt];
      const int len = static_cast<int>(p.tokens.size());
      const int n = std::min(budget, len - a.done);
      for (int t = a.done; t < a.done + n; ++t) {
        tokens.push_back(p.tokens[static_cast<std::size_t>(t)]);
        slot.push_back(a.slots[0]);
        pos.push_back(t);
      }
      a.done += n;
      budget -= n;
      if (a.done == len) {
        const auto last = static_cast<std::int32_t>(tokens.size() - 1);
        for (int g = 0; g < G; ++g) {
          out_rows.push_back(last);
          row_completion.push_back(a.prompt * G + g);
          row_slot.push_back(a.slots[static_cast<std::size_t>(g)]);
        }
      }
    }
    if (tokens.empty()) break;
    const int R = static_cast<int>(out_rows.size());
    // Only a chunk of a long prompt: the step fills the cache and samples nothing (one logits row is computed).
    const float* logits = model_.infer(
        tokens, slot, pos, R > 0 ? out_rows : std::vector<std::int32_t>{static_cast<std::int32_t>(tokens.size() - 1)},
        cache, opts_.use_lora);
    if (R > 0) {
      for (int r = 0; r < R; ++r) {
        const Completion& c = out[row_completion[r]];
        h_seeds[r] = draw_seed(opts_.seed, c.prompt_index, c.generation, static_cast<int>(c.tokens.size()));
      }
      ops.upload(d_seeds, h_seeds.data(), static_cast<std::size_t>(R) * 8);
      if (penalise) ops.upload(d_seen_row, row_slot.data(), static_cast<std::size_t>(R) * 4);
      sample_rows(logits, R);
      ops.download(h_tokens.data(), d_tokens, static_cast<std::size_t>(R) * 4);
      ops.download(h_logprobs.data(), d_logprobs, static_cast<std::size_t>(R) * 4);
      stats_.downloads += 2;
    }
    ++stats_.steps;

    // Where each completion continues: running ones in their slot; a prompt whose prefill ended continues in its G
    // slots, the others' copy of the prompt's partly filled last block taken now that it is in the cache.
    std::vector<Running> next;
    std::vector<int> slot_of_completion(out.size(), -1), pos_of_completion(out.size(), 0);
    for (const auto& r : running) {
      slot_of_completion[r.completion] = r.slot;
      pos_of_completion[r.completion] = r.pos + 1;
    }
    while (!prefilling.empty() &&
           prefilling.front().done == static_cast<int>(prompts[prefilling.front().prompt].tokens.size())) {
      const Prefilling& a = prefilling.front();
      const int len = static_cast<int>(prompts[a.prompt].tokens.size());
      for (int g = 0; g < G; ++g) {
        if (g > 0) cache.copy_tail(a.slots[g], a.slots[0], len);
        slot_of_completion[a.prompt * G + g] = a.slots[g];
        pos_of_completion[a.prompt * G + g] = len;
      }
      prefilling.pop_front();
    }
    for (std::size_t row = 0; row < static_cast<std::size_t>(R); ++row) {
      const std::size_t ci = row_completion[row];
      Completion& c = out[ci];
      const std::int32_t tok = h_tokens[row];
      const bool done = accept(c, tok, h_logprobs[row]);
      const int s = slot_of_completion[ci];
      if (done) {
        cache.release(s);
        free_slots.push_back(s);
      } else {
        next.push_back({ci, s, pos_of_completion[ci], tok});
      }
    }
    running = std::move(next);
  }
  ops.release(d_tokens);
  ops.release(d_logprobs);
  ops.release(d_seeds);
  for (void* p : {static_cast<void*>(d_count), static_cast<void*>(d_done), static_cast<void*>(d_streams),
                  static_cast<void*>(d_eos), static_cast<void*>(d_ring_tokens), static_cast<void*>(d_ring_logprobs),
                  static_cast<void*>(d_seen), static_cast<void*>(d_seen_row), static_cast<void*>(d_penalised)})
    if (p) ops.release(p);
  if (decode_)
    for (auto& c : out)
      if (c.finish_reason != "stop") c.text = decode_(c.tokens);
  stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::function<bool(bool)> lockstep_over(const dist::MpiEnv& env) {
  return [&env](bool work) { return env.allreduce_sum(work ? 1LL : 0LL) > 0; };
}

}  // namespace mgrl::rl
