// mode_sft.cpp: `mgrl sft`: supervised fine-tuning (LoRA or full) of a Hugging Face model, or of a small
// model initialised at random from its config.json, data-parallel over ranks.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "app/modes.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/comm.h"
#include "dist/device.h"
#include "dist/mpi_env.h"
#include "io/chat_template.h"
#include "io/config.h"
#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "rl/generator.h"
#include "train/comm_gatherer.h"
#include "train/data.h"
#include "train/sft.h"

namespace mgrl::app {
int run_sft(Context& ctx) {
  const auto& env = ctx.env;
  const auto& cfg = ctx.cfg;
  prepare_run_dirs(ctx, false);
  const bool random_init = cfg.get_string("model.init") == "random";
  const bool full = cfg.get_bool("train.full_finetune");

  io::ModelConfig mc;
  std::unique_ptr<io::Tokenizer> tok;
  std::vector<train::Example> train_data, eval_data;
  std::vector<std::string> data_notes;  // said when every start-up check has passed (one line for an error alone)
  int max_seq_len = 0;                  // train.max_seq_len, or the model's positions when fewer
  const bool packing = cfg.get_bool("train.packing");
  env.agree([&] {
    std::string model_src;
    mc = training_model_config(cfg, &model_src);
    check_model_fits(ctx, mc, model_src, full);
    tok = std::make_unique<io::Tokenizer>(io::Tokenizer::from_dir(tokenizer_dir(cfg)));
    if (tok->vocab_size() > mc.vocab_size)
      throw UserError(tok->path() + ": the tokenizer has " + std::to_string(tok->vocab_size()) +
                      " tokens, more than the model's vocab_size (" + std::to_string(mc.vocab_size) + ")");
    train::DataOptions d;
    d.max_seq_len = static_cast<int>(std::min<std::int64_t>(cfg.get_int("train.max_seq_len"),
                                                            mc.max_position_embeddings > 0 ? mc.max_position_embeddings : 1 << 30));
    if (d.max_seq_len < cfg.get_int("train.max_seq_len")) d.max_seq_len_name = "the model's max_position_embeddings";
    max_seq_len = d.max_seq_len;
    d.completion_only = cfg.get_bool("train.completion_only_loss");
    d.text_field = cfg.get_string("data.text_field");
    d.eos = eos_token(cfg, *tok);
    const io::ChatTemplate chat = chat_template(cfg, "train.chat_format", *tok);
    d.chat = &chat;
    train_data = train::load_examples(cfg.get_string("data.input"), *tok, d);
    if (!cfg.get_string("eval.input").empty()) eval_data = train::load_examples(cfg.get_string("eval.input"), *tok, d);
    // Examples whose end (the EOS first) falls past train.max_seq_len: the model never learns to stop on them, and
    // the held-out loss is over the same cut examples (said since 2026-11-28; found by a hunt for runs that cannot
    // learn). The limit is the model's positions when those are fewer.
    const std::string limit = d.max_seq_len < cfg.get_int("train.max_seq_len")
                                  ? "the model's max_position_embeddings (" + std::to_string(d.max_seq_len) + ")"
                                  : "train.max_seq_len = " + std::to_string(d.max_seq_len);
    // At the model's positions raising train.max_seq_len cannot help (it told the user to until 2026-11-29).
    const std::string remedy = d.max_seq_len < cfg.get_int("train.max_seq_len")
                                   ? "shorten them, or use a model with more positions, to train them whole"
                                   : "raise train.max_seq_len to train them whole";
    for (const auto* set : {&train_data, &eval_data}) {
      const std::string note = cut_rows_note(*set, cfg.get_string(set == &train_data ? "data.input" : "eval.input"),
                                             "examples", limit, "lose the end of their completion, EOS included",
                                             remedy);
      if (!note.empty()) data_notes.push_back(note);
      // Prompts whose last tokens merge with the completion's first: trained on the tokens of the whole (as trl),
      // which differ from the prompt's own at its end (trl warns once too).
      std::size_t merged = 0, first = 0;
      for (std::size_t i = 0; i < set->size(); ++i)
        if ((*set)[i].merged && merged++ == 0) first = static_cast<std::size_t>((*set)[i].line);
      if (merged > 0)
        data_notes.push_back(cfg.get_string(set == &train_data ? "data.input" : "eval.input") + ": " +
                             std::to_string(merged) + " of " + std::to_string(set->size()) +
                             " examples have a prompt whose last tokens merge with the completion's first (the first at "
                             "line " + std::to_string(first) + "): tokenized whole, as trl does, their prompt "
                             "ends on other tokens than the prompt alone (what the model is given at inference); end "
                             "the prompts on a token boundary (a prompt ending in a space before a word merges)");
    }
    if (cfg.get_bool("eval.accuracy") && !eval_data.empty()) {
      std::size_t longest_prompt = 0;
      for (const auto& e : eval_data) longest_prompt = std::max(longest_prompt, static_cast<std::size_t>(e.prompt_len));
      check_eval_generation_fits(cfg, mc, longest_prompt, "the longest held-out prompt of " + cfg.get_string("eval.input"));
    }
    std::size_t longest = 1;  // tokens of a row: an example's, or with train.packing up to max_seq_len
    for (const auto* set : {&train_data, &eval_data})
      for (const auto& e : *set) longest = std::max(longest, e.tokens.size());
    if (packing) longest = std::max(longest, static_cast<std::size_t>(max_seq_len));
    const std::int64_t batch = cfg.get_int("train.batch_size"), accum = cfg.get_int("train.grad_accum");
    check_batch_fits(mc, "train.batch_size", batch, static_cast<double>(batch) / env.size() / static_cast<double>(accum),
                     static_cast<double>(longest), "lower it, or raise train.grad_accum");
    check_batch_fits(mc, "eval.batch_size", cfg.get_int("eval.batch_size"), static_cast<double>(cfg.get_int("eval.batch_size")),
                     static_cast<double>(longest), "lower it");
  });

  TrainingModel tm = build_training_model(ctx, mc, full);
  model::Transformer& net = *tm.net;
  const train::LossScaling& scaling = tm.scaling;
  const std::uint64_t seed = tm.seed;

  train::SftOptions o;
  o.pack_capacity = packing ? max_seq_len : 0;
  auto rows = train::sft_rows(train_data, o.pack_capacity);  // packed once, for the trainer and train.num_epochs
  read_supervised_keys(cfg, ctx.device, scaling, seed,
                       run_steps(cfg, rows.size(), cfg.get_int("train.batch_size"), 1, packing ? "packed rows" : "examples"),
                       &o);
  o.gpu_peak_tflops = gpu_peak_tflops(ctx.device);
  o.dft = cfg.get_string("train.loss_type") == "dft";
  o.neftune_alpha = static_cast<float>(cfg.get_float("train.neftune_noise_alpha"));
  if (cfg.get_bool("eval.accuracy") && !eval_data.empty())
    o.accuracy = greedy_accuracy(env, net, *tok, static_cast<int>(cfg.get_int("eval.max_new_tokens")));
  const std::size_t n_train = train_data.size(), n_eval = eval_data.size();
  std::unique_ptr<train::SftTrainer> trainer;
  env.agree([&] {  // batch sizes that do not divide are errors every rank meets
    trainer = std::make_unique<train::SftTrainer>(env, ctx.comm, net, *tok, std::move(train_data), std::move(eval_data),
                                                  std::move(rows), o);
  });
  {
    // The planned passes over the data, so that a typo in train.max_steps or train.batch_size shows at once.
    const double epochs = static_cast<double>(o.max_steps) * static_cast<double>(o.global_batch) /
                          static_cast<double>(std::max<std::size_t>(1, trainer->rows()));
    char packed[96] = "";
    if (packing)
      std::snprintf(packed, sizeof(packed), " packed into %zu rows of up to %d tokens (train.packing)", trainer->rows(),
                    max_seq_len);
    char line[420];
    std::snprintf(line, sizeof(line),
                  "sft: %s %s, %zu training examples%s, %zu held-out, %s on %d rank%s; %lld steps x %d %s = %.3g "
                  "epochs",
                  random_init ? "random-init" : "pretrained", io::model_name(mc).c_str(), n_train, packed, n_eval,
                  full ? "full fine-tuning" : "LoRA", env.size(), env.size() == 1 ? "" : "s",
                  static_cast<long long>(o.max_steps), o.global_batch, packing ? "rows" : "sequences", epochs);
    log::info(line);
  }
  for (const auto& note : data_notes) log::warn_once(note);
  say_unused_keys(ctx);  // the configuration is read: what it did not read changes nothing
  trainer->run();
  return 0;
}

}  // namespace mgrl::app
