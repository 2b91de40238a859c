// mode_score.cpp: `mgrl score`: log p(token_t | tokens_<t) of every token of every input sequence,
// sharded over ranks, written by rank 0 in input order to one HDF5 file.
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <optional>

#include "app/modes.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "dist/mpi_env.h"
#include "io/atomic_file.h"
#include "io/chat_template.h"
#include "io/config.h"
#include "io/hdf5_file.h"
#include "io/hf_config.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "train/comm_gatherer.h"
#include "train/idle_pass.h"

namespace mgrl::app {

int run_score(Context& ctx) {
  const auto& env = ctx.env;
  const auto& cfg = ctx.cfg;
  const std::string model_dir = cfg.get_string("model.path");
  const std::string adapter = cfg.get_string("lora.adapter");
  const std::string input = cfg.get_string("data.input");
  const std::string output = cfg.get_string("score.output");
  const int batch_size = static_cast<int>(cfg.get_int("score.batch_size"));

  // Every rank reads and checks everything, so that every input error is reported once, collectively.
  io::ModelConfig mc;
  std::optional<io::Tokenizer> tokenizer;
  std::optional<io::ChatTemplate> chat;
  std::vector<std::vector<std::int32_t>> seqs;
  std::unique_ptr<io::H5Writer> writer;
  env.agree([&] {
    check_inference_keys(cfg, "score");
    mc = io::parse_hf_config(model_dir + "/config.json");
    check_model_fits(ctx, mc, model_dir + "/config.json", false);
    const std::string tok_dir = tokenizer_dir(cfg);
    io::read_jsonl(input, [&](const nlohmann::ordered_json& j, int line) {
      std::vector<std::int32_t> ids;
      const auto need_tokenizer = [&](const char* what) {
        if (tokenizer) return;
        struct stat st {};
        if (::stat((tok_dir + "/tokenizer.json").c_str(), &st) != 0)  // present: Tokenizer::from_dir reads or refuses it
          io::jsonl_error(input, line, std::string(what) + " input needs a tokenizer, but " + tok_dir +
                                           " has no tokenizer.json (set model.tokenizer)");
        tokenizer = io::Tokenizer::from_dir(tok_dir);
      };
      if (j.contains("text")) {  // encoded as AutoTokenizer(text) would: special tokens as its post-processor adds them
        if (!j["text"].is_string()) io::jsonl_error(input, line, "\"text\" must be a string");
        need_tokenizer("\"text\"");
        ids = tokenizer->encode(j["text"].get<std::string>());
      } else if (j.contains("messages")) {  // the conversation as the model's chat template renders it
        need_tokenizer("\"messages\"");
        if (!chat) chat.emplace(chat_template(cfg, "generate.chat_format", *tokenizer));
        try {
          io::ChatTemplate::check_messages(j["messages"]);
          ids = chat->encode(j["messages"], false);
        } catch (const UserError& e) {
          io::jsonl_error(input, line, e.what());
        }
      } else if (j.contains("tokens") && j["tokens"].is_array()) {
        for (const auto& v : j["tokens"]) ids.push_back(token_id(v, mc.vocab_size, input, line));
      } else {
        io::jsonl_error(input, line, "expected \"text\", \"messages\" or a \"tokens\" array of token ids");
      }
      if (ids.empty()) io::jsonl_error(input, line, "the sequence has no tokens");
      for (const auto id : ids)
        if (id < 0 || id >= mc.vocab_size)
          io::jsonl_error(input, line, "token " + std::to_string(id) + " is not an id of the model's vocabulary (0.." +
                                           std::to_string(mc.vocab_size - 1) + ")");
      if (mc.max_position_embeddings > 0 && static_cast<std::int64_t>(ids.size()) > mc.max_position_embeddings)
        io::jsonl_error(input, line, std::to_string(ids.size()) + " tokens is more than the model's " +
                                         "max_position_embeddings (" + std::to_string(mc.max_position_embeddings) + ")");
      seqs.push_back(std::move(ids));
    });
    if (seqs.empty()) throw UserError(input + ": no sequences to score");
    if (env.rank() == 0) {
      refuse_output_over_inputs("score.output", output,
                                {{"data.input", input}, {"model.path", model_dir}, {"lora.adapter", adapter},
                                 {"model.tokenizer", cfg.get_string("model.tokenizer")}});
      io::remove_stale_temporaries_of(output);             // a killed earlier run's
      writer = std::make_unique<io::H5Writer>(output);  // fails early if unwritable
    }
  });

  auto ops = make_ops(ctx);
  const model::ModelOptions mo = model_options(cfg, false);
  train::CommGatherer gatherer(ctx.comm, *ops);
  model::Transformer net(mc, *ops, mo, mo.shard_base ? &gatherer : nullptr);
  load_model(ctx, net, model_dir, adapter);

  // This rank's contiguous shard, batched by similar lengths to save padding.
  const std::size_t N = seqs.size();
  const auto [lo, hi] = shard(env, N);
  std::vector<std::size_t> order(hi - lo);
  std::iota(order.begin(), order.end(), lo);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return seqs[a].size() < seqs[b].size(); });
  std::vector<std::vector<float>> result(hi - lo);
  say_unused_keys(ctx);  // the configuration is read: what it did not read changes nothing
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t tokens = 0;
  // A sequence's log-probs must not depend on the sequences it is batched with, nor on the ranks (one dot product a
  // value, in a fixed order: kernels/cpu/gemm.h), so that the file is the same on any number of ranks and at any
  // score.batch_size, as generation's. On the CPU backend until 2026-11-28 the last bits moved with them (BLAS rounds a
  // row by where it sits); a GPU's kernels keep their own (batch-dependent) rounding.
  const kernels::BatchInvariantScope invariant(*ops);
  for (std::size_t start = 0; start < order.size(); start += batch_size) {
    const std::size_t end = std::min(order.size(), start + static_cast<std::size_t>(batch_size));
    std::vector<std::vector<std::int32_t>> chunk;
    for (std::size_t i = start; i < end; ++i) chunk.push_back(seqs[order[i]]);
    const auto batch = model::Batch::from_sequences(chunk);
    std::vector<float> lp(batch.tokens.size());
    net.forward(batch, lp.data(), !adapter.empty());
    for (std::size_t i = start; i < end; ++i) {
      const std::size_t len = seqs[order[i]].size(), row = i - start;
      const auto first = lp.begin() + batch.offsets[row];
      result[order[i] - lo].assign(first, first + static_cast<std::ptrdiff_t>(len));
      tokens += len;
    }
  }
  if (mo.shard_base)  // every pass gathers collectively: as many passes as the busiest rank
    train::idle_passes(net, order.size(), N, env.size(), static_cast<std::size_t>(batch_size));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Gather to rank 0 in input order: every rank knows every length, so raw floats suffice.
  std::string bytes;
  for (const auto& r : result) bytes.append(reinterpret_cast<const char*>(r.data()), r.size() * sizeof(float));
  const auto parts = env.gather_to_root(bytes);
  const auto total_tokens = env.allreduce_sum(static_cast<long long>(tokens));
  const double slowest = env.allreduce_max(secs);
  if (env.rank() != 0) return 0;

  std::size_t Lmax = 0;
  for (const auto& s : seqs) Lmax = std::max(Lmax, s.size());
  std::vector<std::int32_t> tok(N * Lmax, -1), lengths(N);
  std::vector<float> logprobs(N * Lmax, std::nanf(""));
  std::size_t seq = 0;
  for (int r = 0; r < env.size(); ++r) {
    const char* p = parts[r].data();
    const std::size_t rlo = N * r / env.size(), rhi = N * (r + 1) / env.size();
    for (seq = rlo; seq < rhi; ++seq) {
      const std::size_t len = seqs[seq].size();
      lengths[seq] = static_cast<std::int32_t>(len);
      std::copy(seqs[seq].begin(), seqs[seq].end(), tok.begin() + static_cast<std::ptrdiff_t>(seq * Lmax));
      // log p(token_0) is undefined: NaN, as in the padding.
      std::memcpy(&logprobs[seq * Lmax + 1], p + sizeof(float), (len - 1) * sizeof(float));
      p += len * sizeof(float);
    }
  }
  const std::uint64_t n = N, L = Lmax;
  io::write_or_explain(output, "the scores", [&] {  // a full disk: exit 2 naming the output (was an HDF5 message)
    writer->write("tokens", DType::I32, {n, L}, tok.data());
    writer->write("lengths", DType::I32, {n}, lengths.data());
    writer->write("logprobs", DType::F32, {n, L}, logprobs.data());
    writer->attr("/", "model", model_dir);
    writer->attr("/", "adapter", adapter);
    writer->attr("/", "input", input);
    writer->attr("/", "mgrl_version", build_info().version);
    fault::point("output_write", 0, 0);  // tests: killed before the file is complete (core/fault.h)
    writer->commit();
  });
  char line[256];
  std::snprintf(line, sizeof(line), "score: %zu sequences, %lld tokens in %.3f s on %d rank%s (%.0f tokens/s); wrote %s",
                N, total_tokens, slowest, env.size(), env.size() == 1 ? "" : "s",
                slowest > 0 ? static_cast<double>(total_tokens) / slowest : 0.0, output.c_str());
  log::info(line);
  return 0;
}

}  // namespace mgrl::app
