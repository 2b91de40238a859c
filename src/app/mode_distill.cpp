// mode_distill.cpp: `mgrl distill`: on-policy knowledge distillation (trl's DistillationTrainer) of a Hugging Face
// model (LoRA or full) from a teacher model of its vocabulary, data-parallel over ranks (rl/distill.h).
#include <cstdio>
#include <memory>

#include "app/modes.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/comm.h"
#include "dist/device.h"
#include "dist/mpi_env.h"
#include "io/config.h"
#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "model/transformer.h"
#include "rl/distill.h"
#include "rl/prompts.h"
#include "train/comm_gatherer.h"

namespace mgrl::app {

int run_distill(Context& ctx) {
  const auto& env = ctx.env;
  const auto& cfg = ctx.cfg;
  prepare_run_dirs(ctx, false);
  const bool random_init = cfg.get_string("model.init") == "random";
  const bool full = cfg.get_bool("train.full_finetune");
  const std::string teacher_dir = cfg.get_string("distill.teacher");
  const bool teacher_nf4 = cfg.get_string("distill.teacher_quantize") == "nf4";
  if (given_for_this_mode(cfg, "distill.teacher_quantize_double") && !teacher_nf4)
    log::warn_once("distill.teacher_quantize_double is ignored: it qualifies distill.teacher_quantize = \"nf4\", "
                   "which is not set");

  RlInputs inputs;
  io::ModelConfig tc;
  rl::GenerationOptions::Merge merge = rl::GenerationOptions::Merge::Off;
  env.agree([&] {
    inputs = load_rl_inputs(ctx, full, "distill.max_prompt_length", "distill.max_completion_length");
    tc = io::parse_hf_config(teacher_dir + "/config.json");
    if (tc.vocab_size != inputs.model.vocab_size)
      throw UserError(teacher_dir + "/config.json: the teacher's vocab_size is " + std::to_string(tc.vocab_size) +
                      ", the student's " + std::to_string(inputs.model.vocab_size) +
                      ": the divergence compares their distributions over the same tokens (distill.teacher)");
    if (tc.max_position_embeddings > 0 && inputs.longest > tc.max_position_embeddings)
      throw UserError("distill.max_prompt_length + distill.max_completion_length (" + std::to_string(inputs.longest) +
                      ") exceeds the teacher's max_position_embeddings (" +
                      std::to_string(tc.max_position_embeddings) + ", " + teacher_dir + "/config.json): lower them");
    check_model_fits(ctx, inputs.model, "", full, false, &tc, teacher_dir + "/config.json");
    if (!full) merge = merge_lora_option(cfg, inputs.model, ctx.device.backend == dist::Backend::Cuda);
    for (const auto& s : cfg.get_strings("distill.stop"))
      if (s.empty()) throw UserError("key 'distill.stop': an empty stop string would end every completion at once");
    const std::int64_t batch = cfg.get_int("train.batch_size");
    check_batch_fits(inputs.model, "train.batch_size", batch,
                     static_cast<double>(batch) / env.size() / static_cast<double>(cfg.get_int("train.grad_accum")),
                     static_cast<double>(inputs.longest), "lower it, or raise train.grad_accum");
  });
  const io::ModelConfig& mc = inputs.model;
  TrainingModel tm = build_training_model(ctx, mc, full);
  model::Transformer& net = *tm.net;
  // The teacher: frozen, no adapter, in the student's dtype and backend; its projections NF4 with
  // distill.teacher_quantize (model.quantize is the student's) or from a bitsandbytes 4-bit directory, dense
  // otherwise. model.shard_base shards it as the student's base, over a gatherer of its own: its layers are gathered
  // for its no-grad pass only (model.shard_base_keep, which keeps a training forward's layers for its backward, is
  // the student's).
  model::ModelOptions to = model_options(cfg, false);
  to.full_finetune = false;
  to.recompute = false;
  to.quantize = teacher_nf4 ? model::Quantize::Nf4 : model::Quantize::None;
  to.quantize_double = cfg.get_bool("distill.teacher_quantize_double");
  to.shard_keep = false;
  train::CommGatherer teacher_gatherer(ctx.comm, *tm.ops);
  auto teacher = std::make_unique<model::Transformer>(tc, *tm.ops, to, to.shard_base ? &teacher_gatherer : nullptr);
  load_model(ctx, *teacher, teacher_dir, "");

  rl::DistillOptions o;
  o.max_steps = run_steps(cfg, inputs.train.size(), cfg.get_int("train.batch_size"), 1, "prompts", true);
  o.stop_at_step = cfg.get_int("train.stop_at_step");
  o.batch_prompts = static_cast<int>(cfg.get_int("train.batch_size"));
  o.grad_accum = static_cast<int>(cfg.get_int("train.grad_accum"));
  o.optim = optimizer_options(cfg, o.max_steps, tm.scaling);
  o.checkpoint = checkpoint_options(cfg, ctx.device);
  o.max_nonfinite_steps = static_cast<int>(cfg.get_int("train.max_nonfinite_steps"));
  warn_if_no_learning_rate(cfg);
  o.beta = static_cast<float>(cfg.get_float("distill.beta"));
  o.max_completion_length = static_cast<int>(cfg.get_int("distill.max_completion_length"));
  o.sampling.temperature = static_cast<float>(cfg.get_float("distill.temperature"));
  o.sampling.top_p = static_cast<float>(cfg.get_float("distill.top_p"));
  o.sampling.top_k = static_cast<int>(cfg.get_int("distill.top_k"));
  o.sampling.min_p = static_cast<float>(cfg.get_float("distill.min_p"));
  o.repetition_penalty = static_cast<float>(cfg.get_float("distill.repetition_penalty"));
  o.stop = cfg.get_strings("distill.stop");
  o.cache = cache_settings(cfg, merge, net);
  o.seed = tm.seed;
  o.shuffle = cfg.get_bool("data.shuffle");
  o.log_every = static_cast<int>(cfg.get_int("log.every_steps"));
  o.eval_every = static_cast<int>(cfg.get_int("eval.every_steps"));
  o.log_dir = cfg.get_string("log.dir");
  o.config_text = cfg.to_toml();
  o.gpu_peak_tflops = gpu_peak_tflops(ctx.device);
  {
    const double epochs = static_cast<double>(o.max_steps) * static_cast<double>(o.batch_prompts) /
                          static_cast<double>(std::max<std::size_t>(1, inputs.train.size()));
    const char* kind = o.beta == 0.0f ? "forward KL" : o.beta == 1.0f ? "reverse KL" : "generalized JSD";
    char line[480];
    std::snprintf(line, sizeof(line),
                  "distill: %s %s from teacher %s (%d layers, hidden %lld%s), %zu prompts, %zu held-out, %s on %d "
                  "rank%s; %s (beta %g) at temperature %g; %d prompts x 1 completion per step; %lld steps = %.3g "
                  "epochs",
                  random_init ? "random-init" : "pretrained", io::model_name(mc).c_str(), io::model_name(tc).c_str(),
                  static_cast<int>(tc.num_hidden_layers), static_cast<long long>(tc.hidden_size),
                  teacher->definition().quantized() ? ", NF4 projections" : "", inputs.train.size(),
                  inputs.eval.size(), full ? "full fine-tuning" : "LoRA", env.size(), env.size() == 1 ? "" : "s", kind,
                  static_cast<double>(o.beta), static_cast<double>(o.sampling.temperature), o.batch_prompts,
                  static_cast<long long>(o.max_steps), epochs);
    log::info(line);
  }
  std::unique_ptr<rl::DistillTrainer> trainer;
  env.agree([&] {
    trainer = std::make_unique<rl::DistillTrainer>(env, ctx.comm, net, *teacher, *inputs.tokenizer,
                                                   std::move(inputs.train), std::move(inputs.eval), o);
  });
  say_rl_notes(inputs);
  say_unused_keys(ctx);
  trainer->run();
  return 0;
}

}  // namespace mgrl::app
