// common.cpp: what several modes share: the op backend of a rank's device, loading a model (+ adapter) on
// every rank, the model a training mode trains and the keys SFT and DPO read alike, the held-out greedy accuracy,
// the shard of a rank, the tokenizer directory.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "app/modes.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/mpi_env.h"
#include "io/chat_template.h"
#include "io/checksum.h"
#include "io/config.h"
#include "io/jsonl.h"
#include "io/model_shapes.h"
#include "io/tokenizer.h"
#include "rl/prompts.h"
#include "train/comm_gatherer.h"
#include "train/dpo.h"
#include "train/sft.h"
#include "model/lora.h"
#include "model/memory_plan.h"
#include "model/transformer.h"
#include "dist/device.h"
#include "kernels/cpu/blas_info.h"
#include "kernels/ops.h"
#if MGRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mgrl::app {

std::unique_ptr<kernels::Ops> make_ops(const Context& ctx) {
  const dist::Device& device = ctx.device;
  // The job's oldest GPU decides model.dtype = "auto", so that every rank stores the same dtype.
  const int cc = dist::job_compute_capability(ctx.env, device);
  std::unique_ptr<kernels::Ops> ops;
  ctx.env.agree([&] {
    const DType storage = dist::storage_dtype(device.backend, cc, ctx.cfg.get_string("model.dtype"));
    if (device.backend != dist::Backend::Cuda) {
      ops = kernels::make_cpu_ops();
      return;
    }
#if MGRL_WITH_CUDA
    ops = kernels::make_cuda_ops(device.gpu.index, storage);
#else
    (void)storage;
#endif
  });
  MGRL_CHECK(ops != nullptr, "no op backend for this device");
  return ops;
}

train::LossScaling loss_scaling(const Context& ctx, DType storage) {
  train::LossScaling s;
  ctx.env.agree([&] {
    s = train::loss_scaling_of(ctx.cfg.get_string("train.loss_scaling"), storage,
                               ctx.cfg.get_float("train.loss_scale_init"), ctx.cfg.get_float("train.loss_scale_min"),
                               ctx.cfg.get_int("train.loss_scale_growth_interval"));
  });
  return s;
}

void log_base_memory(model::Transformer& net) {
  const model::ModelDef& d = net.definition();
  if (!d.quantized()) return;
  char buf[300];
  std::snprintf(buf, sizeof buf,
                "model: base projections NF4 (%.2f MiB), dequantized a layer at a time into a %.2f MiB workspace; "
                "%.2f MiB dense",
                static_cast<double>(d.nf4_bytes()) / 1048576.0, static_cast<double>(d.nf4_workspace_bytes()) / 1048576.0,
                static_cast<double>(d.dense_numel() * d.ops().storage_size()) / 1048576.0);
  std::string line = buf;
  if (d.sharded()) {  // model.shard_base: the layers' NF4 and dense bytes sharded, gathered as stored
    std::snprintf(buf, sizeof buf, "; sharded: %.2f MiB of the base on this rank, a %.2f MiB gather workspace",
                  static_cast<double>(d.base_bytes_held()) / 1048576.0,
                  static_cast<double>(d.gather_workspace_bytes()) / 1048576.0);
    line += buf;
  }
  log::info(line);
}

namespace {

// A file's size and the checksum of a sample of its bytes (all of them up to 4 MiB, else 64 blocks of 64 KiB spread
// evenly, the first and the last among them): enough to tell two copies of a file apart, read in milliseconds.
std::string sampled_file_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "not readable";
  const auto size = static_cast<std::uint64_t>(in.tellg());
  constexpr std::uint64_t kWhole = 4u << 20, kBlock = 64u << 10, kBlocks = 64;
  std::string bytes;
  if (size <= kWhole) {
    bytes.resize(size);
    in.seekg(0);
    in.read(bytes.data(), static_cast<std::streamsize>(size));
  } else {
    std::string block(kBlock, '\0');
    for (std::uint64_t k = 0; k < kBlocks; ++k) {
      in.seekg(static_cast<std::streamoff>(k * (size - kBlock) / (kBlocks - 1)));
      in.read(block.data(), static_cast<std::streamsize>(kBlock));
      bytes += block;
    }
  }
  if (!in) return "not readable";
  return std::to_string(size) + " bytes, sample checksum " + io::checksum_hex(bytes.data(), bytes.size());
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "?";
  return buf;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> input_files(const io::Config& cfg, const std::string& adapter,
                                                            bool training) {
  std::string tok_dir;
  try {
    tok_dir = tokenizer_dir(cfg);
  } catch (const UserError&) {  // no tokenizer: the mode says so where it loads one
  }
  std::vector<std::pair<std::string, std::string>> files{
      {"data.input", cfg.get_string("data.input")},
      {"chat.template", cfg.get_string("chat.template")},
      {"tokenizer.json", tok_dir.empty() ? "" : tok_dir + "/tokenizer.json"},
      {"tokenizer_config.json", tok_dir.empty() ? "" : tok_dir + "/tokenizer_config.json"},
      {"the adapter", adapter.empty() ? "" : adapter + "/adapter_model.safetensors"}};
  if (training) files.emplace_back("eval.input", cfg.get_string("eval.input"));
  return files;
}

void agree_on_inputs(const Context& ctx, const model::Transformer& net,
                     const std::vector<std::pair<std::string, std::string>>& files) {
  if (ctx.env.size() == 1) return;
  std::string mine;
  for (const auto& [what, path] : files)
    if (!path.empty()) mine += "file " + what + " (" + path + "): " + sampled_file_fingerprint(path) + "\n";
  for (std::size_t at = 0; at < net.definition().base_fingerprint().size();) {  // "<tensor> <checksum>" lines
    const std::string& fp = net.definition().base_fingerprint();
    const std::size_t nl = std::min(fp.find('\n', at), fp.size());
    mine += "base " + fp.substr(at, nl - at) + "\n";
    at = nl + 1;
  }
  ctx.env.agree([&] {
    const std::string root = ctx.env.broadcast(mine, 0);
    if (mine == root) return;
    std::istringstream a(mine), b(root);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
    }
    const std::string where = " (this rank's host: " + host_name() + ")";
    if (la.rfind("file ", 0) == 0) {
      const std::size_t colon = la.find("): ");
      throw UserError(la.substr(5, colon + 1 - 5) + " is not rank 0's copy: " + la.substr(colon + 3) + " here, " +
                      lb.substr(lb.find("): ") + 3) + " on rank 0" + where +
                      "; every rank must read the same files (a node's own copy that is stale or partial?)");
    }
    const std::string tensor = la.substr(5, la.rfind(' ') - 5);
    throw UserError("the base weights are not rank 0's: tensor '" + tensor + "' differs" + where +
                    "; every rank must load the same model (a node's own copy of model.path that is stale or "
                    "partial?)");
  });
}

void load_model(const Context& ctx, model::Transformer& net, const std::string& model_dir, const std::string& adapter) {
  ctx.env.agree([&] {
    net.load_weights(model_dir);
    log_base_memory(net);
    if (!adapter.empty())
      net.add_lora(model::read_peft_config(adapter + "/adapter_config.json"), 0).load_peft(adapter);
  });
  agree_on_inputs(ctx, net, input_files(ctx.cfg, adapter, false));
}

double gpu_peak_tflops(const dist::Device& d) {
  if (d.backend != dist::Backend::Cuda) return 0;
  const std::string& n = d.gpu.name;
  if (n.find("H200") != std::string::npos || n.find("H100") != std::string::npos) return 989;
  if (n.find("A100") != std::string::npos) return 312;
  if (n.find("V100") != std::string::npos) return 125;
  if (n.find("L40S") != std::string::npos) return 362;
  return 0;
}

io::ChatTemplate chat_template(const io::Config& cfg, const char* format_key, const io::Tokenizer& tok) {
  io::ChatOptions o;
  o.format = cfg.get_string(format_key);
  o.format_key = format_key;
  o.template_path = cfg.get_string("chat.template");
  o.template_kwargs = cfg.get_string("chat.template_kwargs");
  return io::ChatTemplate(tok, o);
}

train::OptimizerOptions optimizer_options(const io::Config& cfg, std::int64_t max_steps, const train::LossScaling& scaling) {
  train::OptimizerOptions o;
  o.max_grad_norm = cfg.get_float("train.max_grad_norm");
  o.scaling = scaling;
  o.adamw.beta1 = static_cast<float>(cfg.get_float("train.adam_beta1"));
  o.adamw.beta2 = static_cast<float>(cfg.get_float("train.adam_beta2"));
  o.adamw.eps = static_cast<float>(cfg.get_float("train.adam_eps"));
  o.adamw.weight_decay = static_cast<float>(cfg.get_float("train.weight_decay"));
  o.schedule.kind = cfg.get_string("train.schedule");
  o.schedule.lr = cfg.get_float("train.lr");
  o.schedule.total_steps = max_steps;
  o.schedule.warmup_steps = cfg.get_int("train.warmup_steps") > 0
                                ? cfg.get_int("train.warmup_steps")
                                : train::Schedule::warmup_from_ratio(cfg.get_float("train.warmup_ratio"), max_steps);
  // transformers' "constant" ignores a warmup (a trl recipe with lr_scheduler_type "constant" and warmup_ratio 0.1
  // trains at the full rate from its first step): mgrl says so instead of choosing silently.
  if (o.schedule.kind == "constant" && o.schedule.warmup_steps > 0)
    throw UserError("key 'train.schedule' = constant has no warmup (transformers' 'constant' ignores one), but "
                    "train.warmup_steps or train.warmup_ratio asks for " + std::to_string(o.schedule.warmup_steps) +
                    " steps: use train.schedule = \"constant_with_warmup\", or no warmup");
  const bool min_lr = o.schedule.kind == "cosine_with_min_lr";
  const bool rate_given = cfg.origin("train.min_lr_rate").kind != io::Origin::Default;
  if (min_lr && !rate_given)
    throw UserError("key 'train.schedule' = cosine_with_min_lr needs train.min_lr_rate (the final learning rate as a "
                    "fraction of train.lr), as transformers does");
  if (!min_lr && rate_given)
    throw UserError("key 'train.min_lr_rate' is used by train.schedule = cosine_with_min_lr only (train.schedule is " +
                    o.schedule.kind + ")");
  if (min_lr) o.schedule.min_lr_rate = cfg.get_float("train.min_lr_rate");
  // A schedule that never reaches train.lr: the run trains at a fraction of the rate asked for (silent until
  // 2026-11-28). (train.lr = 0 is said by the modes: PPO's value head may train alone at it.)
  if (o.schedule.warmup_steps >= max_steps && o.schedule.lr > 0) {  // the last step has (max_steps - 1) / warmup
    char peak[32];
    std::snprintf(peak, sizeof peak, "%.3g", o.schedule.at(max_steps - 1));
    log::warn_once("the warm-up (" + std::to_string(o.schedule.warmup_steps) + " steps, train.warmup_steps or "
                   "train.warmup_ratio) is " + (o.schedule.warmup_steps > max_steps ? "longer than" : "as long as") +
                   " the run (train.max_steps = " + std::to_string(max_steps) +
                   "): the learning rate never reaches train.lr; it peaks at " + peak + " at the last step");
  }
  return o;
}

model::ModelOptions model_options(const io::Config& cfg, bool full_finetune) {
  model::ModelOptions o;
  o.full_finetune = full_finetune;
  o.recompute = cfg.get_bool("model.recompute");
  o.master_weights = cfg.get_string("train.master_weights") == "always";
  o.quantize = cfg.get_string("model.quantize") == "nf4" ? model::Quantize::Nf4 : model::Quantize::None;
  o.quantize_double = cfg.get_bool("model.quantize_double");
  o.shard_base = cfg.get_bool("model.shard_base");
  o.shard_keep = cfg.get_bool("model.shard_base_keep");
  // Keys that qualify another one, given without it (accepted in silence until 2026-11-28).
  if (given_for_this_mode(cfg, "model.quantize_double") && o.quantize != model::Quantize::Nf4)
    log::warn_once("model.quantize_double is ignored: it qualifies model.quantize = \"nf4\", which is not set");
  if (given_for_this_mode(cfg, "model.shard_base_keep") && !o.shard_base)
    log::warn_once("model.shard_base_keep is ignored: it qualifies model.shard_base = true, which is not set");
  return o;
}

model::LoraConfig lora_config(const io::Config& cfg) {
  const std::string adapter = cfg.get_string("lora.adapter");
  model::LoraConfig lc;
  if (!adapter.empty()) {
    lc = model::read_peft_config(adapter + "/adapter_config.json");  // its r, alpha, targets and rsLoRA flag hold
  } else {
    lc.r = static_cast<int>(cfg.get_int("lora.r"));
    lc.alpha = cfg.get_float("lora.alpha");
    lc.use_rslora = cfg.get_bool("lora.use_rslora");
    lc.targets = cfg.get_strings("lora.targets");
  }
  // Training on from an adapter keeps its lora_dropout unless lora.dropout is given (as PEFT trains a loaded adapter;
  // the adapter's was ignored until 2026-11-29). This is the adapter's configuration (written with it); what a DPO
  // run trains with is training_lora_config's.
  if (adapter.empty() || given_for_this_mode(cfg, "lora.dropout")) lc.dropout = cfg.get_float("lora.dropout");
  return lc;
}

model::LoraConfig training_lora_config(const io::Config& cfg) {
  model::LoraConfig lc = lora_config(cfg);
  // DPO: trl's default disable_dropout = True turns every dropout off (LoRA's too; the saved adapter_config.json keeps
  // its lora_dropout). Until 2026-11-29 a given lora.dropout was applied in DPO, where trl's recipe with the same
  // LoraConfig trains without it.
  const std::string mode = cfg.get_string("mode");
  if ((mode == "dpo" || mode == "kto") && cfg.get_bool(mode + ".disable_dropout")) {
    if (lc.dropout > 0) {
      char p[32];
      std::snprintf(p, sizeof p, "%g", lc.dropout);
      const std::string upper = mode == "dpo" ? "DPO" : "KTO";
      log::warn_once(std::string("LoRA dropout ") + p + " (" +
                     (given_for_this_mode(cfg, "lora.dropout") ? "lora.dropout" : "the adapter's lora_dropout") +
                     ") is not applied: " + mode + ".disable_dropout = true (trl's default) turns dropout off in " +
                     upper + "; set " + mode + ".disable_dropout = false to train with it");
    }
    lc.dropout = 0;
  }
  return lc;
}

bool setup_trainable_lora(const Context& ctx, model::Transformer& net, std::uint64_t seed) {
  const auto& cfg = ctx.cfg;
  const std::string adapter = cfg.get_string("lora.adapter");
  const model::LoraConfig lc = training_lora_config(cfg);
  if (!adapter.empty()) {
    // Training continues from the given PEFT adapter.
    warn_lora_keys_ignored(cfg, "the adapter " + adapter + " sets it (adapter_config.json)", false);
    net.add_lora(lc, seed).load_peft(adapter);
    return false;
  }
  if (lc.targets.empty())
    throw UserError("key 'lora.targets' is empty: name the layers that get an adapter (q_proj, k_proj, v_proj, "
                    "o_proj, gate_proj, up_proj, down_proj), or set train.full_finetune = true");
  // A rank above a layer's own rank (the smaller of its in and out features) adds parameters and nothing else:
  // x A^T B^T can never exceed min(in, out). Almost always a typo.
  // The target with the smallest rank is the one named.
  std::string worst;
  int worst_in = 0, worst_out = 0;
  for (const auto& name : lc.targets) {
    model::Module m;
    if (!model::parse_module(name, &m)) continue;  // add_lora names an unknown target
    const int in = model::module_in(net.config(), m), out = model::module_out(net.config(), m);
    if (worst.empty() || std::min(in, out) < std::min(worst_in, worst_out)) {
      worst = name;
      worst_in = in;
      worst_out = out;
    }
  }
  if (!worst.empty() && lc.r > std::min(worst_in, worst_out))
    throw UserError("lora.r = " + std::to_string(lc.r) + " exceeds the rank of the " + worst + " layers (" +
                    std::to_string(worst_in) + " in, " + std::to_string(worst_out) + " out features): at most " +
                    std::to_string(std::min(worst_in, worst_out)) + " (lower lora.r, or leave " + worst +
                    " out of lora.targets)");
  net.add_lora(lc, seed);
  return true;
}

bool given_for_this_mode(const io::Config& cfg, const std::string& key) {
  const io::Origin o = cfg.origin(key);
  if (o.kind == io::Origin::CommandLine) return true;
  return o.kind == io::Origin::File &&
         (cfg.mode_before_cli().empty() || cfg.mode_before_cli() == cfg.get_string("mode"));
}

void say_unused_keys(const Context& ctx) {
  const io::Config& cfg = ctx.cfg;
  static std::set<std::string> said;
  const std::string mode = cfg.get_string("mode");
  if (mode == "info" || mode == "plan") return;
  std::string list;
  for (const std::string& key : cfg.unread_given()) {
    const io::Origin o = cfg.origin(key);
    if (said.count(key) || !given_for_this_mode(cfg, key)) continue;
    said.insert(key);
    list += (list.empty() ? "" : ", ") + key + " (" +
            (o.kind == io::Origin::File ? cfg.file() + ":" + std::to_string(o.line) : std::string("the command line")) +
            ")";
  }
  if (!list.empty())
    log::warn_once("not used by mgrl " + mode + ", so they change nothing here: " + list +
                   " (keys of another mode, or of a part this run does not have)");
}

void warn_if_no_learning_rate(const io::Config& cfg) {
  if (cfg.get_float("train.lr") == 0.0)
    log::warn_once("train.lr = 0: the trainable weights do not change (the run computes its losses and changes nothing)");
}

// What the results of a step depend on beyond the configuration (checkpoint.h, Checkpoint::numerics): on the CPU the
// thread count and the BLAS build and its kernels; on a GPU the device's name and compute capability.
std::string numerics_of(const dist::Device& d) {
  if (d.backend == dist::Backend::Cuda)
    return "cuda, " + d.gpu.name + " (sm_" + std::to_string(d.gpu.cc_major) + std::to_string(d.gpu.cc_minor) + ")";
  return "cpu, " + std::to_string(d.cpu_threads) + " thread" + (d.cpu_threads == 1 ? "" : "s") + ", " +
         kernels::cpu::blas_info();
}

// The bytes of the training data file (data.input), as "N bytes, checksum X"; "" when it cannot be read (its
// loading says why).
std::string data_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  io::BlockChecksum sum;
  std::vector<char> buf(io::BlockChecksum::kBlock);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) sum.update(buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(sum.digest()));
  return std::to_string(sum.length()) + " bytes, checksum " + hex;
}

train::CheckpointOptions checkpoint_options(const io::Config& cfg, const dist::Device& device) {
  train::CheckpointOptions o;
  o.dir = cfg.get_string("checkpoint.dir");
  o.every = static_cast<int>(cfg.get_int("checkpoint.every_steps"));
  o.keep_last = static_cast<int>(cfg.get_int("checkpoint.keep_last"));
  o.resume = cfg.get_string("checkpoint.resume");
  o.config_text = cfg.to_toml();
  o.allow_other_base = cfg.get_bool("checkpoint.allow_other_base");
  o.numerics = numerics_of(device);
  if (!cfg.get_bool("train.full_finetune")) o.lora_config = model::peft_config_json(lora_config(cfg));
  // Read (the whole file, a second time) only when a checkpoint may be written or read: a checkpoint.dir, or
  // checkpoint.resume naming a file (its default "auto" reads nothing without a checkpoint.dir).
  if (!o.dir.empty() || (o.resume != "none" && o.resume != "auto" && !o.resume.empty()))
    o.data = data_fingerprint(cfg.get_string("data.input"));
  // A stop at a step is meant to be resumed from (a time-limited job): without checkpoints nothing of it is kept.
  // Said once, as for a signal's stop (train/stop_agreement.cpp); silent before 2026-11-28.
  if (o.dir.empty())  // (allow_other_base also acts on checkpoint.resume = <path> without a directory)
    for (const char* key : {"checkpoint.every_steps", "checkpoint.keep_last"})
      if (given_for_this_mode(cfg, key))
        log::warn_once(std::string(key) + " is ignored: no checkpoint.dir is set, so no checkpoint is written");
  const std::int64_t stop_at = cfg.get_int("train.stop_at_step");
  if (stop_at > 0 && o.dir.empty())
    log::warn_once("train.stop_at_step = " + std::to_string(stop_at) + " without checkpoint.dir: the run stops after "
                   "step " + std::to_string(stop_at) + " and nothing of it is saved to resume from (set checkpoint.dir)");
  return o;
}

std::optional<std::int32_t> eos_token(const io::Config& cfg, const io::Tokenizer& tok) {
  const std::string& name = cfg.get_string("train.eos_token");
  if (name.empty()) return std::nullopt;
  const auto id = tok.token_to_id(name);
  if (!id) throw UserError("key 'train.eos_token' = \"" + name + "\" is not a token of " + tok.path());
  return id;
}

std::int64_t run_steps(const io::Config& cfg, std::size_t units, std::int64_t batch, std::int64_t steps_per_batch,
                       const std::string& what, bool whole_batches) {
  if (cfg.get_float("train.num_epochs") == 0.0) return cfg.get_int("train.max_steps");
  if (cfg.origin("train.max_steps").kind != io::Origin::Default)
    throw UserError("keys 'train.num_epochs' and 'train.max_steps' are both given: the run's length is one of them");
  const double epochs = cfg.get_float("train.num_epochs");
  // transformers: max_steps = ceil(num_train_epochs x update steps per epoch), an epoch's update steps the batches of
  // the data rounded up (the last one partial; mgrl's next batch takes the next epoch's first examples instead).
  const double b = static_cast<double>(std::max<std::int64_t>(1, batch)), u = static_cast<double>(units);
  if (whole_batches && units < static_cast<std::size_t>(std::max<std::int64_t>(1, batch)))
    throw UserError("key 'train.num_epochs': the " + std::to_string(units) + " " + what + " do not fill one generation " +
                    "round of " + std::to_string(batch) + " (trl's sampler yields whole rounds only): give train.max_steps, " +
                    "or lower train.batch_size or grpo.steps_per_generation");
  const double steps =
      whole_batches ? std::ceil(epochs * std::floor(u / b) * static_cast<double>(steps_per_batch) - 1e-9)
                    : std::ceil(epochs * std::ceil(u / b) - 1e-9) * static_cast<double>(steps_per_batch);
  if (!(steps >= 1) || steps > 1e15)
    throw UserError("key 'train.num_epochs' = " + std::to_string(epochs) + " over " + std::to_string(units) + " " +
                    what + " in batches of " + std::to_string(batch) + " makes no step");
  return static_cast<std::int64_t>(steps);
}

template <class Options>
void read_supervised_keys(const io::Config& cfg, const dist::Device& device, const train::LossScaling& scaling,
                          std::uint64_t seed, std::int64_t max_steps, Options* o) {
  o->max_steps = max_steps;
  o->max_nonfinite_steps = static_cast<int>(cfg.get_int("train.max_nonfinite_steps"));
  o->stop_at_step = cfg.get_int("train.stop_at_step");
  o->global_batch = static_cast<int>(cfg.get_int("train.batch_size"));
  o->grad_accum = static_cast<int>(cfg.get_int("train.grad_accum"));
  const train::OptimizerOptions oo = optimizer_options(cfg, o->max_steps, scaling);
  o->max_grad_norm = oo.max_grad_norm;
  o->scaling = oo.scaling;
  o->adamw = oo.adamw;
  o->schedule = oo.schedule;
  o->seed = seed;
  o->shuffle = cfg.get_bool("data.shuffle");
  o->log_every = static_cast<int>(cfg.get_int("log.every_steps"));
  o->eval_every = static_cast<int>(cfg.get_int("eval.every_steps"));
  o->eval_batch = static_cast<int>(cfg.get_int("eval.batch_size"));
  o->checkpoint = checkpoint_options(cfg, device);
  warn_if_no_learning_rate(cfg);
  o->log_dir = cfg.get_string("log.dir");
}
template void read_supervised_keys(const io::Config&, const dist::Device&, const train::LossScaling&, std::uint64_t,
                                   std::int64_t,
                                   train::SftOptions*);
template void read_supervised_keys(const io::Config&, const dist::Device&, const train::LossScaling&, std::uint64_t,
                                   std::int64_t,
                                   train::DpoOptions*);

TrainingModel build_training_model(const Context& ctx, const io::ModelConfig& mc, bool full) {
  const auto& cfg = ctx.cfg;
  TrainingModel m;
  // Until 2026-11-28 the adapter was dropped without a word: full fine-tuning trained the base alone.
  ctx.env.agree([&] {
    // NEFTune is SFT's (trl's SFTTrainer): another mode would ignore it in silence.
    const std::string mode = cfg.get_string("mode");
    if (mode != "sft" && cfg.get_float("train.neftune_noise_alpha") > 0)
      throw UserError("key 'train.neftune_noise_alpha' adds NEFTune's noise to SFT's training embeddings; mgrl " + mode +
                      " does not use it: remove it");
    if (full && !cfg.get_string("lora.adapter").empty())
      throw UserError("key 'lora.adapter' does not apply with train.full_finetune = true, which trains the base "
                      "weights: merge the adapter into the model first (PEFT's merge_and_unload) and set model.path "
                      "to the merged model, or set train.full_finetune = false to go on training the adapter");
  });
  m.ops = make_ops(ctx);
  m.scaling = loss_scaling(ctx, m.ops->storage());
  const model::ModelOptions mo = model_options(cfg, full);
  m.gatherer = std::make_unique<train::CommGatherer>(ctx.comm, *m.ops);
  m.net = std::make_unique<model::Transformer>(mc, *m.ops, mo, mo.shard_base ? m.gatherer.get() : nullptr);
  m.seed = static_cast<std::uint64_t>(cfg.get_int("train.seed"));
  ctx.env.agree([&] {
    if (cfg.get_string("model.init") == "random")
      m.net->init_random(m.seed, static_cast<float>(cfg.get_float("model.init_std")));
    else
      m.net->load_weights(cfg.is_set("model.path") ? cfg.get_string("model.path") : std::string());
    log_base_memory(*m.net);
    if (!full) m.fresh_adapter = setup_trainable_lora(ctx, *m.net, m.seed);
  });
  // Said once the model is built (a refusal of the combination, as NF4 with full fine-tuning, comes first).
  if (full) warn_lora_keys_ignored(cfg, "train.full_finetune = true trains the base weights, without an adapter", true);
  agree_on_inputs(ctx, *m.net, input_files(cfg, cfg.get_string("lora.adapter"), true));
  return m;
}

std::function<double(const std::vector<train::Example>&)> greedy_accuracy(const dist::MpiEnv& env,
                                                                          model::Transformer& net,
                                                                          const io::Tokenizer& tok,
                                                                          int max_new_tokens) {
  return [&env, &net, &tok, max_new_tokens](const std::vector<train::Example>& eval) {
    rl::GenerationOptions g;
    g.max_new_tokens = max_new_tokens;
    g.sampling.temperature = 0;
    g.eos_ids = rl::stop_ids(net.config(), &tok);
    const bool sharded = net.definition().sharded();
    if (sharded) g.lockstep = rl::lockstep_over(env);
    const auto [lo, hi] = shard(env, eval.size());
    std::vector<rl::Prompt> prompts;
    for (std::size_t i = lo; i < hi; ++i) prompts.push_back({static_cast<std::int64_t>(i), eval[i].prompt_tokens()});
    long long right = 0;
    if (!prompts.empty() || sharded) {
      rl::Generator gen(net, g, [&](const std::vector<std::int32_t>& ids) { return tok.decode(ids, true); });
      for (const auto& c : gen.generate(prompts))
        right += c.text == eval[static_cast<std::size_t>(c.prompt_index)].completion ? 1 : 0;
    }
    return static_cast<double>(env.allreduce_sum(right)) / static_cast<double>(eval.size());
  };
}

void check_eval_generation_fits(const io::Config& cfg, const io::ModelConfig& mc, std::size_t longest_prompt,
                                const std::string& where) {
  const std::int64_t max_new = cfg.get_int("eval.max_new_tokens"), P = mc.max_position_embeddings;
  const auto n = static_cast<std::int64_t>(longest_prompt);
  if (P > 0 && n + max_new > P)
    throw UserError("key 'eval.max_new_tokens' = " + std::to_string(max_new) + ": " + where + " has " +
                    std::to_string(n) + " prompt tokens, and with eval.max_new_tokens that exceeds the model's " +
                    "max_position_embeddings (" + std::to_string(P) + ")" +
                    (n < P ? ": at most " + std::to_string(P - n) + " new tokens fit" : ""));
}

std::int32_t token_id(const nlohmann::json& v, std::int64_t vocab_size, const std::string& file, int line) {
  if (!v.is_number_integer()) io::jsonl_error(file, line, "token " + v.dump() + " is not an integer id");
  const bool outside = v.is_number_unsigned() ? v.get<std::uint64_t>() >= static_cast<std::uint64_t>(vocab_size)
                                              : v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= vocab_size;
  if (outside)
    io::jsonl_error(file, line, "token " + v.dump() + " is not an id of the model's vocabulary (0.." +
                                    std::to_string(vocab_size - 1) + ")");
  return static_cast<std::int32_t>(v.get<std::int64_t>());
}

std::pair<std::size_t, std::size_t> shard(const dist::MpiEnv& env, std::size_t n) {
  return {n * static_cast<std::size_t>(env.rank()) / static_cast<std::size_t>(env.size()),
          n * static_cast<std::size_t>(env.rank() + 1) / static_cast<std::size_t>(env.size())};
}

void refuse_sharded_full_finetune(const io::Config& cfg) {
  if (cfg.get_bool("train.full_finetune") && cfg.get_bool("model.shard_base"))
    throw UserError("key 'model.shard_base' = true with train.full_finetune = true: only a frozen base is sharded "
                    "(LoRA training); set one of them to false");
}

namespace {
// A lock file's holder refreshes its time every kLockHeartbeatS seconds; one not refreshed for kLockStaleS seconds is
// a dead holder's (a node that died holding it on a network file system whose server keeps the lock: NFSv3's lock
// manager until the client comes back), and a new run takes it over.
constexpr int kLockHeartbeatS = 30;
constexpr double kLockStaleS = 180;

// The descriptors of the locks this process holds (never closed: the kernel releases them when it ends); allocated
// once and never freed, so that the heartbeat thread never meets it destroyed at exit.
std::vector<int>& held_locks() {
  static auto* fds = new std::vector<int>;
  return *fds;
}
std::mutex& held_locks_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}

// Starts (once) the thread that refreshes the time of every held lock file.
void start_lock_heartbeat() {
  static bool started = false;
  if (started) return;
  started = true;
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(kLockHeartbeatS));
      std::lock_guard<std::mutex> lock(held_locks_mu());
      for (const int fd : held_locks()) (void)::futimens(fd, nullptr);
    }
  }).detach();
}

// Rank 0: the lock of one run directory (modes.h, prepare_run_dirs), `me` naming this run in its file.
void lock_dir(const std::string& key, const std::string& dir, const std::string& me, const std::string& host,
              double wait_s) {
  const std::string path = dir + "/.mgrl.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(path + ": cannot create the lock file (" + std::strerror(errno) + "; " + key + ")");
  const auto holder = [&] {
    char buf[512] = {0};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    std::string h = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
    while (!h.empty() && (h.back() == '\n' || h.back() == '\0')) h.pop_back();
    return h.empty() ? std::string("a process that has not said who it is") : h;
  };
  const auto start = std::chrono::steady_clock::now();
  bool said = false;
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno != EWOULDBLOCK && errno != EINTR) {  // no locks on this file system (ENOLCK, EOPNOTSUPP, ENOSYS)
      log::warn(path + ": cannot be locked (" + std::string(std::strerror(errno)) + "): another run using " + dir +
                " at the same time would not be seen");
      ::close(fd);
      return;
    }
    struct stat st {};
    const double age = ::fstat(fd, &st) == 0 ? std::difftime(std::time(nullptr), st.st_mtime) : 0.0;
    // Held, but its holder has stopped refreshing it: a dead node's. Not when the holder is on this host: a lock this
    // host's kernel says is held belongs to a live process (its locks go with it), only stopped or suspended (taken
    // over until 2026-11-28 after a SIGSTOP or `scontrol suspend` of more than kLockStaleS: two runs in one directory).
    const bool here = holder().find(" on host " + host + ",") != std::string::npos;
    if (age > kLockStaleS && !here) {
      // This run takes it over: it names itself in the file and refreshes it, so that a third run waits for it.
      log::warn(dir + " (" + key + ") is locked by " + holder() + ", but the lock has not been refreshed for " +
                std::to_string(static_cast<long long>(age)) + " s (its node died?): this run takes it over");
      break;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= wait_s) {
      const std::string who = holder();
      ::close(fd);
      throw UserError(dir + " (" + key + ") is in use by another mgrl run (" + who + "): two runs in one " +
                      "directory replace and prune each other's files. Let it end (waited " +
                      std::to_string(static_cast<long long>(wait_s)) + " s: runtime.dir_lock_wait_s), or give "
                      "this run another " + key);
    }
    if (!said) {
      said = true;
      log::info(dir + " (" + key + ") is in use by another mgrl run (" + holder() + "); waiting up to " +
                std::to_string(static_cast<long long>(wait_s)) + " s for it to end (runtime.dir_lock_wait_s)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (::ftruncate(fd, 0) == 0) {
    const std::string line = me + "\n";
    (void)!::pwrite(fd, line.data(), line.size(), 0);
  }
  (void)::futimens(fd, nullptr);
  {
    std::lock_guard<std::mutex> lock(held_locks_mu());
    held_locks().push_back(fd);
  }
  start_lock_heartbeat();
}
}  // namespace

void prepare_run_dirs(const Context& ctx, bool rollouts) {
  namespace fs = std::filesystem;
  const std::string ck = ctx.cfg.get_string("checkpoint.dir"), log_dir = ctx.cfg.get_string("log.dir");
  if (ck.empty() && log_dir.empty()) return;
  const double wait_s = ctx.cfg.get_float("runtime.dir_lock_wait_s");
  // The other ranks wait while rank 0 waits for a lock (comm_timeout_s alone would end the job first).
  const dist::Patience patience{wait_s + 10, "rank 0's wait for the lock of " + (ck.empty() ? log_dir : ck)};
  ctx.env.agree([&] {
    if (ctx.env.rank() != 0) return;
    const auto create = [](const std::string& dir, const char* what) {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec || !fs::is_directory(dir))
        throw UserError(dir + ": cannot create the " + what + (ec ? ec.message() : std::string("not a directory")) + ")");
    };
    if (!log_dir.empty()) {
      create(log_dir, "log directory (log.dir; ");
      for (const char* name : {"metrics.jsonl", "job_summary.txt"})
        io::check_regular_input(log_dir + "/" + name, "log.dir's " + std::string(name));
      // Opened for appending, as the run will (an existing file keeps its lines).
      if (!std::ofstream(log_dir + "/metrics.jsonl", std::ios::app))
        throw UserError(log_dir + "/metrics.jsonl: cannot be written (log.dir)");
      const std::string r = log_dir + "/rollouts";
      std::error_code ec;
      if (rollouts && fs::exists(r, ec) && !fs::is_directory(r, ec))
        throw UserError(r + ": not a directory (log.dir's rollout files are written there)");
      // The rollout files are named as checkpoints are (step_<N>.h5): in one directory, each would replace the
      // other and pruning would set the rollouts aside as damaged checkpoints.
      const auto canonical = [](const std::string& p, std::error_code& e) {  // "L/rollouts/" as "L/rollouts"
        fs::path c = fs::weakly_canonical(p, e);
        return c.has_filename() ? c : c.parent_path();
      };
      std::error_code e1, e2;
      if (rollouts && !ck.empty() && canonical(ck, e1) == canonical(r, e2) && !e1 && !e2)
        throw UserError("key 'checkpoint.dir' = " + ck + ": it is log.dir's rollouts directory (" + r +
                        "), whose files are named as checkpoints are; choose another checkpoint.dir");
    }
    if (!ck.empty()) create(ck, "checkpoint directory (");
    std::vector<std::pair<std::string, std::string>> dirs;  // (key, dir) to lock, each directory once
    std::error_code ec;
    if (!log_dir.empty()) dirs.push_back({"log.dir", log_dir});
    if (!ck.empty() && !(!log_dir.empty() && fs::equivalent(ck, log_dir, ec))) dirs.push_back({"checkpoint.dir", ck});
    char when[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
    const std::string me = "pid " + std::to_string(::getpid()) + " on host " + ctx.env.host() + ", mgrl " +
                           ctx.cfg.get_string("mode") + " started " + when;
    for (const auto& [key, dir] : dirs) lock_dir(key, dir, me, ctx.env.host(), wait_s);
  }, patience);
}

void refuse_output_over_inputs(const std::string& key, const std::string& output,
                               const std::vector<std::pair<std::string, std::string>>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A new file replaces nothing; a link is replaced by the output (written under a temporary name and renamed), not
  // the file it points to.
  const fs::file_status st = fs::symlink_status(output, ec);
  if (output.empty() || !fs::exists(st) || fs::is_symlink(st)) return;
  const fs::path parent = fs::path(output).has_parent_path() ? fs::path(output).parent_path() : fs::path(".");
  for (const auto& [in_key, path] : inputs) {
    if (path.empty()) continue;
    const bool dir = fs::is_directory(path, ec);
    if (dir ? fs::equivalent(parent, path, ec) : fs::exists(path, ec) && fs::equivalent(output, path, ec))
      throw UserError("key '" + key + "' = " + output + ": " +
                      (dir ? "a file of " + in_key + " (" + path + "), an input of this run"
                                                  : "it is " + in_key + " (" + path + "), the input of this run") +
                      "; writing there would replace it: choose another path");
  }
}

std::pair<bool, bool> teacher_nf4(const io::Config& cfg, const io::ModelConfig& tc) {
  const bool nf4 = tc.bnb4bit || cfg.get_string("distill.teacher_quantize") == "nf4";
  return {nf4, nf4 && (tc.bnb4bit ? tc.bnb4bit->double_quant : cfg.get_bool("distill.teacher_quantize_double"))};
}

void check_model_fits(const Context& ctx, const io::ModelConfig& mc, const std::string& config_json, bool full,
                      bool reference_copy, const io::ModelConfig* teacher, const std::string& teacher_json) {
  refuse_sharded_full_finetune(ctx.cfg);
  const bool gpu = ctx.device.backend == dist::Backend::Cuda;
  const std::size_t stored = gpu ? 2 : 4;  // bytes a stored weight
  // QLoRA (model.quantize = "nf4", or a bitsandbytes 4-bit directory): the projections as NF4 plus one layer of them
  // dequantized in the workspace; model.shard_base: 1/P of the decoder layers on a rank plus two gathered layers.
  // The same arithmetic as `mgrl plan` (model/memory_plan.h). Full fine-tuning (never sharded: the modes refuse it)
  // adds f32 gradients and two AdamW moments (12 bytes), and on the GPU the fp32 master weights (4).
  const bool nf4 = !full && (mc.bnb4bit || ctx.cfg.get_string("model.quantize") == "nf4");
  const bool shard = ctx.cfg.get_bool("model.shard_base");  // two gathered layers even on one rank (ModelDef)
  const int parts = shard ? ctx.env.size() : 1;
  double bytes = 0;
  if (full) {
    bytes = io::parameter_count(mc) * ((gpu ? 18.0 : 16.0) + (reference_copy ? 8.0 : 0.0));
  } else {
    const bool dq = nf4 && (mc.bnb4bit ? mc.bnb4bit->double_quant : ctx.cfg.get_bool("model.quantize_double"));
    bytes = model::resident_weight_bytes(mc, stored, nf4 ? "nf4" : "none", dq, shard, parts);
  }
  const double memory = static_cast<double>(gpu ? ctx.device.gpu.memory_bytes : io::host_memory_bytes());
  if (teacher) {  // mgrl distill: its teacher beside the student, as stored, sharded as the student's base
    const auto [tnf4, tdq] = teacher_nf4(ctx.cfg, *teacher);
    const double t = model::resident_weight_bytes(*teacher, stored, tnf4 ? "nf4" : "none", tdq, shard, parts);
    if (memory > 0 && bytes + t > memory) {
      char buf[240];
      std::snprintf(buf, sizeof buf, "%.3g parameters need %.1f GiB beside the student's %.1f GiB, more than the "
                    "%.1f GiB of %s",
                    io::parameter_count(*teacher), t / (1024.0 * 1024.0 * 1024.0), bytes / (1024.0 * 1024.0 * 1024.0),
                    memory / (1024.0 * 1024.0 * 1024.0), gpu ? "this rank's GPU" : "this machine");
      throw UserError(teacher_json + ": the teacher's " + buf +
                      (shard ? std::string(" (model.shard_base shards both over the ranks: more ranks hold less")
                                 : std::string(" (model.shard_base = true shards both over the ranks")) +
                      (tnf4 ? std::string(")") : std::string("; distill.teacher_quantize = \"nf4\" stores its "
                                                             "projections in 4 bits)")));
    }
    return;
  }
  if (memory > 0 && bytes > memory) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%.3g parameters need %.1f GiB %s, more than the %.1f GiB of %s",
                  io::parameter_count(mc), bytes / (1024.0 * 1024.0 * 1024.0),
                  full  ? "for full fine-tuning (weights, fp32 gradients and AdamW moments)"
                  : nf4 ? "with NF4 projections"
                        : (gpu ? "as bf16/fp16" : "in fp32 on the CPU backend"),
                  memory / (1024.0 * 1024.0 * 1024.0), gpu ? "this rank's GPU" : "this machine");
    throw UserError(config_json + ": the model's " + buf + " (vocab_size, hidden_size, intermediate_size, num_hidden_layers)");
  }
}

void check_batch_fits(const io::ModelConfig& mc, const std::string& key, std::int64_t value, double sequences,
                      double tokens, const std::string& advice) {
  // A lower bound per token, whatever the backend and model.recompute: every layer keeps at least its input
  // (hidden_size values) and the logits hold vocab_size values, at no less than 2 bytes a value.
  const double per_token = 2.0 * (static_cast<double>(mc.num_hidden_layers) * static_cast<double>(mc.hidden_size) +
                                  static_cast<double>(mc.vocab_size));
  const double need = sequences * tokens * per_token;
  const double memory = static_cast<double>(io::host_memory_bytes());
  if (memory > 0 && need > memory) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.0f sequences of up to %.0f tokens at once on a rank need more than %.1f GiB",
                  sequences, tokens, need / (1024.0 * 1024.0 * 1024.0));
    throw UserError("key '" + key + "' (" + std::to_string(value) + "): " + buf + ", more than this machine's memory (" +
                    std::to_string(static_cast<long long>(memory / (1024.0 * 1024.0 * 1024.0))) + " GiB); " + advice);
  }
}

RlInputs load_rl_inputs(const Context& ctx, bool full, const std::string& prompt_key,
                        const std::string& completion_key) {
  const io::Config& cfg = ctx.cfg;
  RlInputs in;
  std::string model_src;
  in.model = training_model_config(cfg, &model_src);
  const io::ModelConfig& mc = in.model;
  // GRPO's reference with grpo.beta > 0 (full fine-tuning: a frozen copy of every starting weight)
  check_model_fits(ctx, mc, model_src, full, prompt_key.rfind("grpo.", 0) == 0 && cfg.get_float("grpo.beta") > 0);
  in.tokenizer = std::make_unique<io::Tokenizer>(io::Tokenizer::from_dir(tokenizer_dir(cfg)));
  const io::Tokenizer& tok = *in.tokenizer;
  if (tok.vocab_size() > mc.vocab_size)
    throw UserError(tok.path() + ": the tokenizer has " + std::to_string(tok.vocab_size()) +
                    " tokens, more than the model's vocab_size (" + std::to_string(mc.vocab_size) + ")");
  const io::ChatTemplate chat = chat_template(cfg, "train.chat_format", tok);
  const int max_prompt = static_cast<int>(cfg.get_int(prompt_key));
  in.train = rl::load_prompts(cfg.get_string("data.input"), tok, chat, max_prompt);
  if (!cfg.get_string("eval.input").empty()) in.eval = rl::load_prompts(cfg.get_string("eval.input"), tok, chat, max_prompt);
  in.longest = max_prompt + cfg.get_int(completion_key);
  in.max_completion = static_cast<int>(cfg.get_int(completion_key));
  in.completion_key = completion_key;
  if (mc.max_position_embeddings > 0 && in.longest > mc.max_position_embeddings)
    throw UserError(prompt_key + " + " + completion_key + " (" + std::to_string(in.longest) +
                    ") exceeds the model's max_position_embeddings (" + std::to_string(mc.max_position_embeddings) +
                    "): lower them");
  // Prompts that lose their start (a long system prompt, the instructions: until 2026-11-28 in silence), and held-out
  // completions cut shorter than the training ones (an answer after eval.max_new_tokens tokens scores 0): said once.
  for (const auto* rows : {&in.train, &in.eval}) {
    const std::string note = cut_rows_note(*rows, cfg.get_string(rows == &in.train ? "data.input" : "eval.input"),
                                           "prompts", prompt_key + " = " + std::to_string(max_prompt),
                                           "lose their first tokens", "raise " + prompt_key + " to keep them whole");
    if (!note.empty()) in.notes.push_back(note);
  }
  if (!in.eval.empty() && cfg.get_int("eval.max_new_tokens") < cfg.get_int(completion_key))
    in.notes.push_back("eval.max_new_tokens (" + std::to_string(cfg.get_int("eval.max_new_tokens")) + ") is shorter than " +
                   completion_key + " (" + std::to_string(cfg.get_int(completion_key)) + "): held-out completions are "
                   "cut there, and an answer after it scores 0; raise eval.max_new_tokens to match");
  const rl::PromptRow* longest_eval = nullptr;
  for (const auto& p : in.eval)
    if (!longest_eval || p.tokens.size() > longest_eval->tokens.size()) longest_eval = &p;
  if (longest_eval)
    check_eval_generation_fits(cfg, mc, longest_eval->tokens.size(),
                               cfg.get_string("eval.input") + ":" + std::to_string(longest_eval->index + 1));
  return in;
}

void say_rl_notes(const RlInputs& in) {
  for (const auto& note : in.notes) log::warn_once(note);
}

void check_reward_data(const rl::Rewards& rewards, RlInputs& in, const io::Config& cfg) {
  // Weights all 0: every completion's total reward is 0, no advantage, nothing learned (exit 0 until 2026-11-28).
  const auto& w = rewards.weights();
  if (!w.empty() && std::all_of(w.begin(), w.end(), [](double x) { return x == 0.0; }))
    throw UserError(cfg.tables("reward").front().where("weight") + "every [[reward]] has weight 0: the total reward "
                    "would be 0 for every completion, and nothing could be learned from it");
  for (auto& note : rewards.check_lengths(in.max_completion, in.completion_key)) in.notes.push_back(std::move(note));
  for (const auto* rows : {&in.train, &in.eval}) {
    if (rows->empty()) continue;
    std::vector<const nlohmann::json*> data;
    std::vector<std::int64_t> lines;
    for (const auto& p : *rows) {
      data.push_back(&p.row);
      lines.push_back(p.index + 1);
    }
    for (auto& note : rewards.check_data(data, lines, cfg.get_string(rows == &in.train ? "data.input" : "eval.input")))
      in.notes.push_back(std::move(note));
  }
}

std::string tokenizer_dir(const io::Config& cfg) {
  if (!cfg.get_string("model.tokenizer").empty()) return cfg.get_string("model.tokenizer");
  const std::string path = cfg.is_set("model.path") ? cfg.get_string("model.path") : std::string();
  if (path.empty() && !cfg.get_string("model.shape").empty())
    throw UserError("model.shape = \"" + cfg.get_string("model.shape") +
                    "\" comes without a tokenizer: set model.tokenizer (a directory with tokenizer.json, e.g. "
                    "inputs/quickstart's character tokenizer)");
  return path;
}

io::ModelConfig model_config(const io::Config& cfg, std::string* source) {
  const std::string shape = cfg.get_string("model.shape");
  io::ModelConfig mc;
  std::string src;
  if (!shape.empty()) {
    mc = io::model_shape(shape);
    src = "model.shape = \"" + shape + "\"";
  } else {
    const std::string path = cfg.is_set("model.path") ? cfg.get_string("model.path") : std::string();
    if (path.empty()) throw UserError("no model: set model.path (a Hugging Face model directory) or model.shape");
    src = path + "/config.json";
    mc = io::parse_hf_config(src);
  }
  if (const std::int64_t layers = cfg.get_int("model.num_layers"); layers > 0) mc.num_hidden_layers = layers;
  if (source) *source = src;
  return mc;
}

io::ModelConfig training_model_config(const io::Config& cfg, std::string* source) {
  if (cfg.get_string("model.init") != "random") {
    for (const char* key : {"model.shape", "model.num_layers"})
      if (cfg.origin(key).kind != io::Origin::Default)
        throw UserError(std::string(key) + " is set but model.init = \"" + cfg.get_string("model.init") +
                        "\": a model of a given shape has no weights to load; set model.init = \"random\"");
  }
  return model_config(cfg, source);
}

void warn_lora_keys_ignored(const io::Config& cfg, const std::string& why, bool dropout) {
  for (const char* key : {"lora.r", "lora.alpha", "lora.targets", "lora.use_rslora", "lora.dropout"})
    if ((dropout || std::string(key) != "lora.dropout") && given_for_this_mode(cfg, key))
      log::warn_once(std::string(key) + " is ignored: " + why);
}

void check_inference_keys(const io::Config& cfg, const std::string& mode) {
  for (const char* key : {"model.shape", "model.num_layers"})
    if (cfg.origin(key).kind != io::Origin::Default)
      throw UserError(std::string(key) + " is for sft, grpo, dpo, ppo (with model.init = \"random\") and plan; " + mode +
                      " loads the weights of model.path");
  // model.init = "random" given for this run was ignored by generate and score without a word until 2026-11-28 (the
  // key of a file written for a training mode is that mode's; model.init_std alone is said by say_unused_keys).
  if (cfg.get_string("model.init") == "random" && given_for_this_mode(cfg, "model.init"))
    throw UserError("model.init = \"random\" is for sft, grpo, dpo, ppo and plan; " + mode +
                    " loads the weights of model.path");
  const std::string adapter = cfg.get_string("lora.adapter");
  if (adapter.empty()) {
    warn_lora_keys_ignored(cfg, mode + " runs the model without an adapter (lora.adapter is empty)", true);
  } else {
    warn_lora_keys_ignored(cfg, "the adapter " + adapter + " sets it (adapter_config.json)", false);
    if (given_for_this_mode(cfg, "lora.dropout"))
      log::warn_once("lora.dropout is ignored: " + mode + " trains nothing (dropout acts in training only)");
  }
}

rl::GenerationOptions::Merge merge_lora_option(const io::Config& cfg, const io::ModelConfig& mc, bool cuda) {
  using Merge = rl::GenerationOptions::Merge;
  const std::string v = cfg.get_string("generate.merge_lora");
  if (v == "off") return Merge::Off;
  const bool nf4 = mc.bnb4bit.has_value() || cfg.get_string("model.quantize") == "nf4";
  const bool sharded = cfg.get_bool("model.shard_base");
  if (v == "on") {
    if (nf4 || sharded)
      throw UserError(std::string("generate.merge_lora = \"on\" needs a dense base, but ") +
                      (nf4 ? (mc.bnb4bit ? "the model is a bitsandbytes 4-bit directory (NF4)" : "model.quantize = \"nf4\"")
                           : "model.shard_base = true") +
                      " (set generate.merge_lora = \"auto\" or \"off\")");
    return Merge::On;
  }
  // MGRL_MERGE_LORA=0 (read once) makes "auto" sample unmerged, the path before merging existed: for comparisons
  // and as a fallback.
  static const bool auto_merges = env::switch_on("MGRL_MERGE_LORA");
  return cuda && !nf4 && !sharded && auto_merges ? Merge::IfMemory : Merge::Off;
}

void log_merge_lora(rl::GenerationOptions::Merge m, model::Transformer& net) {
  if (m == rl::GenerationOptions::Merge::Off || !net.lora()) return;
  const model::LoraConfig& lc = net.lora()->config();
  char buf[300];
  std::snprintf(buf, sizeof buf,
                "sampling: LoRA merged into the base weights (generate.merge_lora = %s): %zu projections, %.2f MiB "
                "copy, refreshed before every generation",
                m == rl::GenerationOptions::Merge::On ? "on" : "auto", net.lora()->slots().size(),
                static_cast<double>(model::InferenceEngine::merged_bytes(net.config(), net.ops().storage_size(), lc)) /
                    (1024.0 * 1024.0));
  log::info(buf);
}

train::RefSync ref_sync_option(const io::Config& cfg, const std::string& section) {
  train::RefSync s;
  if (cfg.get_bool(section + "sync_ref_model")) {
    s.every = cfg.get_int(section + "ref_model_sync_steps");
    s.alpha = cfg.get_float(section + "ref_model_mixup_alpha");
    return s;
  }
  for (const char* key : {"ref_model_sync_steps", "ref_model_mixup_alpha"})
    if (given_for_this_mode(cfg, section + key))
      log::warn_once(section + key + " is ignored: it qualifies " + section + "sync_ref_model = true, which is not set");
  return s;
}

std::string ref_sync_text(const train::RefSync& s) {
  char b[120];
  std::snprintf(b, sizeof b, "mixed with the policy every %lld steps (alpha %g: TR-DPO)",
                static_cast<long long>(s.every), s.alpha);
  return b;
}

rl::CacheSettings cache_settings(const io::Config& cfg, rl::GenerationOptions::Merge merge, model::Transformer& net) {
  rl::CacheSettings c;
  c.max_sequences = static_cast<int>(cfg.get_int("generate.max_sequences"));
  c.max_prefill_tokens = static_cast<int>(cfg.get_int("generate.max_prefill_tokens"));
  c.sync_interval = static_cast<int>(cfg.get_int("generate.sync_interval"));
  c.kv_block_size = static_cast<int>(cfg.get_int("generate.kv_block_size"));
  c.merge_lora = merge;
  log_merge_lora(merge, net);
  return c;
}

}  // namespace mgrl::app
