// mode_export.cpp: `mgrl export`: a training checkpoint as a PEFT adapter directory (adapter_config.json +
// adapter_model.safetensors) or, for full fine-tuning, a Hugging Face model directory; optionally the
// adapter merged into the base weights (W + scale * B A) as a full model directory. A damaged checkpoint is never
// exported, nor silently replaced by an older one: the error names the newest intact one.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>

#include "app/modes.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/mpi_env.h"
#include "io/config.h"
#include "io/atomic_file.h"
#include "io/config_schema.h"
#include <nlohmann/json.hpp>

#include "io/jsonl.h"
#include "io/nf4_tensor.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "kernels/cpu/nf4.h"
#include "model/lora.h"
#include "model/model_def.h"
#include "train/checkpoint.h"

namespace mgrl::app {
namespace {

// Whole or not at all (io/atomic_file.h): a failed export leaves an earlier file under `to` as it was.
void copy_file_if_exists(const std::string& from, const std::string& to) {
  io::check_regular_input(from);
  std::ifstream in(from, std::ios::binary);
  if (!in) return;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw UserError(from + ": cannot read");
  io::write_file_atomically(to, bytes.str());
}


void make_dir(const std::string& d) {
  if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST)
    throw UserError(d + ": cannot create the directory (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw UserError(d + ": exists and is not a directory (export.output names a directory)");
}

const char* kLoraPrefix = "base_model.model.";

// A config.json's dtype, for the weights written beside it: transformers 5 reads "dtype" (and loads in it by default),
// older versions "torch_dtype"; both are set (until 2026-11-28 only torch_dtype, so a float32 export of a bf16 base
// loaded in bf16 and an exported full fine-tuning in its base's dtype).
void set_config_dtype(const std::string& config, DType dt) {
  nlohmann::json j = io::read_json_file(config, "the model config");
  if (!j.is_object()) return;
  const char* name = dt == DType::BF16 ? "bfloat16" : dt == DType::F16 ? "float16" : "float32";
  bool changed = false;
  for (const char* key : {"dtype", "torch_dtype"})
    if (!j.contains(key) || j[key] != name) {
      j[key] = name;
      changed = true;
    }
  if (changed) io::write_file_atomically(config, j.dump(2) + "\n");
}

// An export's staging directory inside its output: ".mgrl-export.tmp.<pid>".
const char* kStagePrefix = ".mgrl-export.tmp.";
// The files an export may write into its output directory and into merged/.
const char* const kExportFiles[] = {"adapter_model.safetensors", "adapter_config.json", "model.safetensors", "config.json",
                                    "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                    "special_tokens_map.json", "chat_template.jinja", "preprocessor_config.json",
                                    "processor_config.json", "chat_template.json"};

// The tokenizer's files of the run (model.tokenizer, else the base's) and its chat template: `chat_template` (the run's
// chat.template file, or the built-in format it trained with as a Jinja template; "" when it used the tokenizer's own)
// is the model's from here on: written as chat_template.jinja, and as tokenizer_config.json's chat_template when that
// has one. Beside a full model (until 2026-11-28 the tokenizer's own template was exported whatever the run used) and
// beside an adapter, as trl's trainers save the tokenizer with it (until 2026-11-28 an adapter went without).
void copy_tokenizer_files(const std::string& tok_dir, const std::string& chat_template, const std::string& to) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"})
    copy_file_if_exists(tok_dir + "/" + f, to + "/" + f);
  if (chat_template.empty()) return;
  io::write_file_atomically(to + "/chat_template.jinja", chat_template);
  struct stat st {};
  if (::stat((to + "/tokenizer_config.json").c_str(), &st) == 0) {
    nlohmann::json j = io::read_json_file(to + "/tokenizer_config.json", "the tokenizer config");
    if (j.is_object() && j.contains("chat_template")) {
      j["chat_template"] = chat_template;
      io::write_file_atomically(to + "/tokenizer_config.json", j.dump(2) + "\n");
    }
  }
}

// A full model's files beside its weights: the model's config from the base directory, the tokenizer's
// (copy_tokenizer_files). config.json and tokenizer.json must be there (a full model without them loads nowhere:
// until 2026-11-28 an export from another working directory than the run's, its relative model.path unresolved,
// wrote the weights alone).
void copy_model_files(const std::string& base_dir, const std::string& tok_dir, const std::string& chat_template,
                      const std::string& to) {
  for (const auto& [dir, file, what] : {std::tuple<std::string, const char*, const char*>{base_dir, "config.json", "model.path"},
                                        {tok_dir, "tokenizer.json", "model.tokenizer (or model.path)"}}) {
    struct stat st {};
    if (::stat((dir + "/" + file).c_str(), &st) != 0)
      throw UserError(dir + "/" + file + ": not found (" + what + " of the run, as its configuration names it: run the "
                      "export from the run's working directory, or give the run absolute paths); a model without it "
                      "cannot be loaded");
  }
  // A vision-language checkpoint's processor files too, so that the model loads with its processor as the base did.
  for (const char* f : {"config.json", "generation_config.json", "preprocessor_config.json", "processor_config.json",
                        "chat_template.json"})
    copy_file_if_exists(base_dir + "/" + f, to + "/" + f);
  copy_tokenizer_files(tok_dir, chat_template, to);
}

// The chat template a run trained with, when it is not the tokenizer's own: its chat.template file's text, or the
// built-in format of train.chat_format as a Jinja template (io::builtin_chat_template); "" otherwise. The built-in
// "none" format has no template (said).
std::string run_chat_template(const io::Config& run_cfg) {
  const std::string file = run_cfg.get_string("chat.template");
  const std::string& format = run_cfg.get_string("train.chat_format");
  if (format != "auto") {
    const std::string t = io::builtin_chat_template(io::chat_format_from_name(format));
    if (t.empty())
      log::info("the run formatted conversations with the built-in 'none' format (the contents back to back), which "
                "no chat template writes: the export carries the tokenizer's own template, if it has one");
    return t;
  }
  if (file.empty()) return "";
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UserError(file + ": cannot read the run's chat template (chat.template) to export it");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Removes the staging directories of exports into `out` whose process no longer runs on this host (killed while
// writing), one line each, and the file temporaries of writers killed before staging existed.
void remove_stale_staging(const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kStagePrefix, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + std::strlen(kStagePrefix), &end, 10);
    if (end == nullptr || *end != '\0' || pid <= 0) continue;
    if (pid == ::getpid() || io::writer_may_be_running(pid)) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) log::info("removed " + e.path().string() + ", the staging directory of an interrupted export");
  }
  for (const char* f : kExportFiles) {
    io::remove_stale_temporaries_of(out + "/" + f);
    io::remove_stale_temporaries_of(out + "/merged/" + f);
  }
}

// Refuses, before anything is written, a file of the export whose place in `out` (or out/merged) is taken by
// something that is not a regular file (a directory, a FIFO): the move into place would fail after all the work.
void check_destinations(const std::string& out, bool merge) {
  for (const std::string& dir : merge ? std::vector<std::string>{out, out + "/merged"} : std::vector<std::string>{out})
    for (const char* f : kExportFiles) {
      struct stat st {};
      if (::lstat((dir + "/" + f).c_str(), &st) == 0) io::check_output_writable(dir + "/" + f);
    }
}

// Moves every file of `stage` (and of stage/merged) into `out` (out/merged), the merged model first and
// adapter_config.json last, then makes the renames durable.
void publish(const std::string& stage, const std::string& out) {
  namespace fs = std::filesystem;
  const auto move_files = [](const std::string& from, const std::string& to) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(from, ec))
      if (e.is_regular_file(ec)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
      const bool ca = a == "adapter_config.json", cb = b == "adapter_config.json";
      return ca != cb ? cb : a < b;
    });
    for (const auto& n : names)
      if (std::rename((from + "/" + n).c_str(), (to + "/" + n).c_str()) != 0)
        throw UserError(to + "/" + n + ": cannot move the export into place (" + std::strerror(errno) + ")");
    io::sync_directory(to);
  };
  // The files of an earlier export of another kind go (a full model's model.safetensors and config.json beside a new
  // adapter, an adapter_config.json beside a new full model, which transformers then loads instead; a merged/ of an
  // earlier export beside an unmerged one): kept until 2026-11-28, they made the directory load the wrong model.
  const auto new_files = [](const std::string& stage_dir) {  // before they are moved
    std::set<std::string> names;
    for (const char* f : kExportFiles) {
      std::error_code ec;
      if (fs::exists(stage_dir + "/" + f, ec)) names.insert(f);
    }
    return names;
  };
  const auto remove_stale = [](const std::set<std::string>& written, const std::string& out_dir) {
    std::vector<std::string> gone;
    for (const char* f : kExportFiles) {
      std::error_code ec;
      if (!written.count(f) && fs::exists(out_dir + "/" + f, ec) && fs::remove(out_dir + "/" + f, ec)) gone.push_back(f);
    }
    if (!gone.empty()) {
      std::string list;
      for (const auto& g : gone) list += (list.empty() ? "" : ", ") + g;
      log::info(out_dir + ": removed " + list + " of an earlier export (this export writes none of them)");
    }
  };
  const std::set<std::string> top = new_files(stage);
  if (fs::is_directory(stage + "/merged")) {
    const std::set<std::string> merged = new_files(stage + "/merged");
    make_dir(out + "/merged");
    move_files(stage + "/merged", out + "/merged");
    remove_stale(merged, out + "/merged");
  } else if (fs::is_directory(out + "/merged")) {
    remove_stale({}, out + "/merged");
    std::error_code ec;
    if (fs::is_empty(out + "/merged", ec)) fs::remove(out + "/merged", ec);
  }
  move_files(stage, out);
  remove_stale(top, out);
}

// What to export instead of a damaged newest checkpoint of dir: "the newest intact checkpoint is <path> (step N):
// --export.checkpoint=<path> exports it", or that there is none.
std::string newest_intact_hint(const std::string& dir) {
  const auto all = train::checkpoints_newest_first(dir);
  for (std::size_t i = 1; i < all.size(); ++i) {
    try {
      const train::Checkpoint older = train::read_checkpoint(all[i]);
      return "the newest intact checkpoint is " + all[i] + " (step " + std::to_string(older.state.step) +
             "): --export.checkpoint=" + all[i] + " exports it";
    } catch (const UserError&) {
      // damaged too (or not for this mgrl): look further
    }
  }
  return "no other checkpoint of " + dir + " is intact";
}

}  // namespace

int run_export(Context& ctx) {
  const auto& cfg = ctx.cfg;
  std::string path = cfg.get_string("export.checkpoint");
  const std::string out = cfg.get_string("export.output");
  train::Checkpoint ck;
  io::Config run_cfg;
  ctx.env.agree([&] {
    if (path == "auto") {
      const std::string dir = cfg.get_string("checkpoint.dir");
      if (dir.empty()) throw UserError("export.checkpoint = \"auto\" needs checkpoint.dir");
      // A running training prunes: the newest file may be deleted between the listing and the read (a newer one has
      // been written then). Listed again, a few times, instead of calling it damaged (until 2026-11-28).
      const auto gone = [&] {
        struct stat st {};
        return ::stat(path.c_str(), &st) != 0 && errno == ENOENT;
      };
      for (int attempt = 0;; ++attempt) {
        const auto newest = train::newest_checkpoint(dir);
        if (!newest) throw UserError(dir + ": no checkpoint to export");
        path = *newest;
        try {
          ck = train::read_checkpoint(path);
          break;
        } catch (const train::CheckpointUnreadable&) {
          if (attempt < 4 && gone()) continue;
          throw;
        } catch (const train::CorruptCheckpoint& e) {
          if (attempt < 4 && gone()) continue;
          // Unlike resume (which reaches the same weights again from an older checkpoint), an export of an older
          // step would be another result than the one asked for: stop, and name the newest intact checkpoint.
          throw UserError(std::string(e.what()) + "; " + newest_intact_hint(dir));
        }
      }
    } else {
      ck = train::read_checkpoint(path);
    }
    run_cfg = io::Config::from_string(io::mgrl_schema(), ck.config_text, path + ":/config");
    // A run of a built-in shape (model.shape, random weights) has no model directory, hence no config.json to export
    // beside the weights, and an adapter of it no base to apply to (an internal error, exit 1, until 2026-11-28).
    const std::string shape = run_cfg.get_string("model.shape");
    if (!shape.empty() && (!run_cfg.is_set("model.path") || run_cfg.get_string("model.path").empty()))
      throw UserError(path + ": its run built the model from model.shape = \"" + shape +
                      "\" (random weights, no model directory): there is no config.json to export beside its weights, "
                      "nor a base model for an adapter; to export, train over a model directory (model.path, with "
                      "model.init = \"random\" for random weights)");
  });
  const bool lora = !ck.tensors.empty() && ck.tensors.front().name.rfind(kLoraPrefix, 0) == 0;
  // An adapter trained over random weights (model.init = "random") fits no saved model: its export named the model
  // directory's pretrained weights as its base, and merged into them, until 2026-11-28.
  if (lora && run_cfg.get_string("model.init") == "random")
    throw UserError(path + ": its run trained the adapter over random weights (model.init = \"random\"), which are "
                    "not saved anywhere: the adapter fits no model to export it for; train it over a model's weights");
  const std::string chat_template = run_chat_template(run_cfg);
  const std::string base_dir = run_cfg.get_string("model.path");
  const std::string& run_tok = run_cfg.get_string("model.tokenizer");
  const std::string tok_dir = run_tok.empty() ? base_dir : run_tok;
  if (cfg.get_bool("export.merged") && !lora)
    log::warn_once("export.merged is ignored: " + path + " is a full fine-tuning's checkpoint, exported whole as a "
                   "model (there is no adapter to merge)");
  const bool merge = cfg.get_bool("export.merged") && lora;
  // A vision-language checkpoint's language model (Gemma3ForConditionalGeneration): the adapter gets its module names
  // and a target_modules that spares the vision tower; a merged or fully fine-tuned model is written with the base's
  // tensor names, its vision tower copied through unchanged.
  // An adapter alone needs no base: when the base's config.json cannot be read, the adapter gets a causal LM's names.
  bool vlm = false;
  if (!base_dir.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(base_dir + "/config.json", ec)) {
      try {
        vlm = io::parse_hf_config(base_dir + "/config.json").vlm();
      } catch (const UserError& e) {
        if (merge || !lora) throw;
        log::warn_once(std::string(e.what()) + ": the adapter is written with a causal LM's module names");
      }
    } else if (lora && !merge) {
      log::warn_once(base_dir + "/config.json: not found (model.path of the run): the adapter is written with a causal "
                     "LM's module names (a vision-language base's adapter needs its language model's)");
    }
  }
  std::unique_ptr<io::SafetensorsModel> base_model;  // a merge's base, opened by rank 0's checks
  // Every file is first written into a staging directory inside the output (`dir`), then moved into place (below).
  const auto write_export = [&](const std::string& dir) {
    std::vector<io::TensorToWrite> tensors;
    for (const auto& t : ck.tensors) tensors.push_back({t.name, DType::F32, t.shape, ck.params.data() + t.offset});
    if (lora) {
      // As trained (the checkpoint keeps it); older checkpoints: from the run's configuration (its lora.adapter's
      // adapter_config.json as that directory holds it now).
      const model::LoraConfig lc = ck.lora_config.empty()
                                       ? lora_config(run_cfg)
                                       : model::peft_config_from_json(nlohmann::json::parse(ck.lora_config),
                                                                      path + ":/lora_config");
      model::write_peft_adapter(dir, lc, base_dir, tensors, vlm);
      copy_tokenizer_files(tok_dir, chat_template, dir);
    } else {
      if (vlm) {  // the language model under the base's names, the vision tower as the base holds it
        const io::SafetensorsModel& base = *base_model;
        for (auto& t : tensors) t.name = base.stored_name(t.name);
        for (const auto& name : base.names())
          if (io::is_vision_tensor(name)) {
            const io::TensorInfo& info = base.get(name);
            tensors.push_back({info.name, info.dtype, info.shape, info.data});
          }
      }
      io::write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
      copy_model_files(base_dir, tok_dir, chat_template, dir);
      set_config_dtype(dir + "/config.json", DType::F32);  // the weights are f32
    }

    if (merge) {
      // W' = W + scale * B @ A for every adapter, computed in f32, written as a Hugging Face directory in the dtype of
      // export.merged_dtype: auto keeps each base tensor's (an NF4 projection's: bfloat16); until 2026-11-28 all f32,
      // twice the size of a bf16 base's.
      const std::string merged = dir + "/merged";
      const std::string want = cfg.get_string("export.merged_dtype");
      const auto out_dtype = [&want](DType base, bool nf4) {
        if (want == "float32") return DType::F32;
        if (want == "bfloat16") return DType::BF16;
        if (want == "float16") return DType::F16;
        if (nf4) return DType::BF16;
        return base == DType::BF16 || base == DType::F16 ? base : DType::F32;
      };
      std::vector<std::vector<std::uint16_t>> halves;  // the bf16 / f16 tensors' values
      std::set<DType> written;
      make_dir(merged);
      const io::SafetensorsModel& base = *base_model;
      const model::LoraConfig lc = model::read_peft_config(dir + "/adapter_config.json");
      const int r = lc.r;
      const float scale = lc.scale();
      std::map<std::string, const train::TensorEntry*> by_name;
      for (const auto& t : ck.tensors) by_name[t.name] = &t;
      std::map<std::string, std::string> trained_over;  // "<name>[ nf4]" -> its line of the checkpoint's fingerprint
      for (std::size_t at = 0; at < ck.base_fingerprint.size();) {
        const std::size_t nl = std::min(ck.base_fingerprint.find('\n', at), ck.base_fingerprint.size());
        const std::string l = ck.base_fingerprint.substr(at, nl - at);
        if (l.rfind(' ') != std::string::npos) trained_over[l.substr(0, l.rfind(' '))] = l;
        at = nl + 1;
      }
      std::string mismatch;
      const auto check_fingerprint = [&](const std::string& line) {
        const std::string key = line.substr(0, line.rfind(' '));
        const auto it = trained_over.find(key);
        if (mismatch.empty() && it != trained_over.end() && it->second != line) mismatch = key;
      };
      std::vector<std::vector<float>> storage;
      std::vector<io::TensorToWrite> full;
      const auto names = base.names();
      storage.reserve(names.size());
      halves.reserve(names.size());
      for (const auto& name : names) {
        if (io::is_bnb_companion(name)) continue;  // a bitsandbytes 4-bit base: merged in f32, dense
        const io::TensorInfo& info = base.get(name);
        io::Shape shape = info.shape;
        const bool nf4 = io::has_bnb_nf4(base, name);
        if (nf4) {  // dequantized on the host (bit-equal to bitsandbytes), then merged
          const io::Nf4Tensor q = io::read_bnb_nf4(base, name);
          shape = {q.rows, q.cols};
          std::vector<float> absmax = q.absmax;
          if (q.double_quant) {
            absmax.resize(static_cast<std::size_t>(q.blocks()));
            kernels::cpu::nf4_absmax_dequantize(q.qabsmax.data(), q.nested_absmax.data(), q.offset,
                                                q.nested_code.data(), q.blocks(), absmax.data());
          }
          storage.emplace_back(static_cast<std::size_t>(q.numel()));
          kernels::cpu::nf4_dequantize(q.codes.data(), absmax.data(), q.code.data(), q.numel(), storage.back().data());
          check_fingerprint(model::fingerprint_line_nf4(name, q.codes));
        } else {
          storage.push_back(io::to_f32(info));
          check_fingerprint(model::fingerprint_line(name, storage.back()));
        }
        auto& w = storage.back();
        const std::string stem = name.size() > 7 ? name.substr(0, name.size() - 7) : name;  // drop ".weight"
        auto a = by_name.find(kLoraPrefix + stem + ".lora_A.weight");
        auto b = by_name.find(kLoraPrefix + stem + ".lora_B.weight");
        if (a != by_name.end() && b != by_name.end()) {
          const std::int64_t outf = shape[0], inf = shape[1];
          const float* A = ck.params.data() + a->second->offset;  // [r, in]
          const float* B = ck.params.data() + b->second->offset;  // [out, r]
          for (std::int64_t o = 0; o < outf; ++o)
            for (std::int64_t i = 0; i < inf; ++i) {
              double s = 0;
              for (int k = 0; k < r; ++k) s += static_cast<double>(B[o * r + k]) * A[k * inf + i];
              w[static_cast<std::size_t>(o * inf + i)] += static_cast<float>(scale * s);
            }
        }
        const DType dt = out_dtype(info.dtype, nf4);
        written.insert(dt);
        if (dt == DType::F32) {
          full.push_back({base.stored_name(name), DType::F32, shape, w.data()});
        } else {
          halves.emplace_back(w.size());
          for (std::size_t i = 0; i < w.size(); ++i)
            halves.back()[i] = dt == DType::BF16 ? io::float_to_bf16(w[i]) : io::float_to_half(w[i]);
          std::vector<float>().swap(w);  // the f32 copy is no longer needed
          full.push_back({base.stored_name(name), dt, shape, halves.back().data()});
        }
      }
      io::write_safetensors(merged + "/model.safetensors", full, {{"format", "pt"}});
      copy_model_files(base_dir, tok_dir, chat_template, merged);
      {  // the merged weights are dense: a bitsandbytes base's quantization_config no longer applies
        nlohmann::json j = io::read_json_file(merged + "/config.json", "the model config");
        if (j.is_object() && j.erase("quantization_config") > 0)
          io::write_file_atomically(merged + "/config.json", j.dump(2) + "\n");
      }
      if (written.size() == 1) set_config_dtype(merged + "/config.json", *written.begin());
      // The base the adapter was trained over (its fingerprint in the checkpoint) must be the one merged into: a base
      // replaced since went into merged/ with the adapter in silence until 2026-11-28 (a resume refused it).
      if (!mismatch.empty()) {
        const std::string what = path + ": trained over other base weights than " + base_dir + " holds now (tensor '" +
                                 mismatch + "' differs)";
        if (!cfg.get_bool("checkpoint.allow_other_base"))
          throw UserError(what + ": its merge would not be the trained model. Export over the weights it was trained "
                          "over, or set checkpoint.allow_other_base = true to merge into these");
        log::warn_once(what + "; merging into these (checkpoint.allow_other_base)");
      }
    }
  };
  // Rank 0 exports; every rank agrees on the outcome of its checks and of its writes (one line and one exit code
  // on every rank, not rank 0's error and an MPI_Abort).
  ctx.env.agree([&] {
    if (ctx.env.rank() != 0) return;
    // The export must not write over the base model it was trained from (its config.json, model.safetensors or an
    // adapter beside them): refused before anything is written. So is a merge whose base cannot be read.
    std::error_code ec;  // the same directory, by what the file system says (links and relative paths resolved)
    for (const std::string& dir : merge ? std::vector<std::string>{out, out + "/merged"} : std::vector<std::string>{out})
      if (!base_dir.empty() && std::filesystem::equivalent(dir, base_dir, ec))
        throw UserError("key 'export.output' = " + out + ": " + (dir == out ? std::string() : dir + " is ") +
                        "the directory of the base model (model.path of the run: " + base_dir +
                        "); exporting there would overwrite it: choose another directory");
    if (merge || (vlm && !lora)) {  // UserError naming it when unreadable
      base_model = std::make_unique<io::SafetensorsModel>(base_dir);
      if (vlm) io::use_language_model_names(*base_model);
    }
    make_dir(out);
    check_destinations(out, merge);
    remove_stale_staging(out);  // what a killed earlier export left
  });
  // The others wait while rank 0 writes: as long as the bytes take at 20 MB/s (a merge writes the base in f32).
  double bytes = 4.0 * static_cast<double>(ck.params.size());
  if (merge) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(base_dir, ec))
      if (e.path().extension() == ".safetensors") bytes += 2.0 * static_cast<double>(e.file_size(ec));
  }
  // The export is staged, then moved into place file by file (renames in one directory: a moment), so that a
  // failed export (a full disk) or one killed while writing leaves the files of an earlier export in `out` as they
  // were, not some of them replaced (until 2026-11-28 a re-export that failed half way left a new adapter beside an
  // old merged model).
  ctx.env.agree([&] {
    if (ctx.env.rank() != 0) return;
    const std::string stage = out + "/" + kStagePrefix + std::to_string(::getpid());
    std::error_code ec;
    std::filesystem::remove_all(stage, ec);
    make_dir(stage);
    try {
      write_export(stage);
      publish(stage, out);
    } catch (...) {
      std::filesystem::remove_all(stage, ec);
      throw;
    }
    std::filesystem::remove_all(stage, ec);
    log::info("export: " + std::string(lora ? "PEFT adapter" : "full model") + " of " + path + " (step " +
              std::to_string(ck.state.step) + ") in " + out);
    if (merge) log::info("export: merged model in " + out + "/merged");
  }, dist::Patience{2.0 * bytes / 20e6, "rank 0's export to " + out});
  return 0;
}

}  // namespace mgrl::app
