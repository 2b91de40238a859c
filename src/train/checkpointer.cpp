// checkpointer.cpp: saving (after a cross-rank weight check) and resuming training runs.
#include "train/checkpointer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "core/build_info.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "io/atomic_file.h"

namespace mgrl::train {
namespace {
// A checkpoint is written (or read) by some ranks while the others wait in a collective for the outcome: rank 0
// writes its weights and AdamW moments (3 x 4 bytes a trainable value), the seal reads the file back, and pruning
// may read an older one back; every rank reads the candidates of a resume, some faster than others. Such a wait may
// last runtime.comm_timeout_s plus the larger of that timeout and the time to move those bytes three times at
// kSlowestFileBytesPerS (a slow network file system), so that the timeout meant for a rank that failed does not end
// a job whose checkpoint (a full fine-tuning of a 7B model: 84 GB) takes longer to write than the timeout: 20 MB/s
// gives 12,600 s more for that one. A rank that has ended, or is stopped, is still named as before.
constexpr double kSlowestFileBytesPerS = 20e6;

// An effective configuration (Config::to_toml's text) as "section.key" -> its TOML literal; the items of
// [[table]] arrays as "table[i].key".
std::map<std::string, std::string> flatten_config(const std::string& toml) {
  std::map<std::string, std::string> out;
  std::map<std::string, int> items;
  std::string section;
  std::size_t at = 0;
  while (at < toml.size()) {
    const std::size_t nl = std::min(toml.find('\n', at), toml.size());
    const std::string line = toml.substr(at, nl - at);
    at = nl + 1;
    if (line.empty() || line.front() == '#') continue;
    if (line.compare(0, 2, "[[") == 0) {
      const std::string name = line.substr(2, line.find(']') - 2);
      section = name + "[" + std::to_string(items[name]++) + "]";
      continue;
    }
    if (line.front() == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const std::size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    out[(section.empty() ? "" : section + ".") + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

// The mode of an effective configuration (its top-level `mode = "..."`); "" when none.
std::string mode_of(const std::string& toml) {
  const auto all = flatten_config(toml);
  const auto it = all.find("mode");
  if (it == all.end() || it->second.size() < 2) return "";
  return it->second.substr(1, it->second.size() - 2);
}

// Two TOML string literals that name the same existing file or directory ("train.jsonl" and
// "/work/train.jsonl" from another working directory).
bool same_path(const std::string& a, const std::string& b) {
  const auto unquote = [](const std::string& s) {
    return s.size() >= 2 && s.front() == '"' && s.back() == '"' ? s.substr(1, s.size() - 2) : std::string();
  };
  const std::string pa = unquote(a), pb = unquote(b);
  std::error_code ec;
  return !pa.empty() && !pb.empty() && std::filesystem::equivalent(pa, pb, ec) && !ec;
}

// The settings of this run that differ from those of the run that wrote a checkpoint it resumes, for one warning:
// "train.lr = 0.1 (was 0.001); data.input = ..." (at most 8, then "and N more"). Not those a resumed run is meant
// to change: its length, where it writes, how it runs, evaluates and reports (train.max_steps, checkpoint.*, log.*,
// runtime.*, eval.*, ...).
std::string changed_settings(const std::string& then_toml, const std::string& now_toml) {
  static const char* kExpected[] = {"train.max_steps", "train.num_epochs", "train.stop_at_step", "checkpoint.", "log.", "runtime.",
                                    "eval.", "export.", "score.", "generate.", "plan.", "rollouts.", "mode"};
  const auto expected = [](const std::string& key) {  // "section." a prefix, anything else one key
    for (const char* e : kExpected) {
      const std::size_t n = std::strlen(e);
      if (e[n - 1] == '.' ? key.compare(0, n, e) == 0 : key == e) return true;
    }
    return false;
  };
  const auto then = flatten_config(then_toml), now = flatten_config(now_toml);
  std::vector<std::string> diffs;
  for (const auto& [key, value] : now) {
    if (expected(key)) continue;
    const auto it = then.find(key);
    if (it == then.end()) continue;  // a key the checkpoint's mgrl did not have
    if (it->second != value && !same_path(it->second, value))
      diffs.push_back(key + " = " + value + " (was " + it->second + ")");
  }
  for (const auto& [key, value] : then)
    if (!expected(key) && key.find('[') != std::string::npos && !now.count(key))
      diffs.push_back(key + " removed (was " + value + ")");
  // A table item this run has and the checkpoint's had not (a [[reward]] added: silent until 2026-11-28), once.
  const auto item = [](const std::string& key) { return key.substr(0, key.find(']') + 1); };
  std::set<std::string> items_then, added;
  for (const auto& kv : then)
    if (kv.first.find('[') != std::string::npos) items_then.insert(item(kv.first));
  for (const auto& kv : now) {
    if (expected(kv.first) || kv.first.find('[') == std::string::npos) continue;
    const std::string it = item(kv.first);
    if (items_then.count(it) || !added.insert(it).second) continue;
    const auto kind = now.find(it + ".kind");
    diffs.push_back(it + " added" + (kind != now.end() ? " (kind = " + kind->second + ")" : std::string()));
  }
  std::string out;
  for (std::size_t i = 0; i < diffs.size() && i < 8; ++i) out += (i ? "; " : "") + diffs[i];
  if (diffs.size() > 8) out += "; and " + std::to_string(diffs.size() - 8) + " more";
  return out;
}

// The first base tensor whose fingerprint line differs between two fingerprints (ModelDef::base_fingerprint: one
// "name checksum" line a tensor); "" when they agree.
std::string first_base_difference(const std::string& then, const std::string& now) {
  std::size_t a = 0, b = 0;
  while (a < then.size() || b < now.size()) {
    const std::size_t ea = std::min(then.find('\n', a), then.size()), eb = std::min(now.find('\n', b), now.size());
    const std::string la = then.substr(a, ea - a), lb = now.substr(b, eb - b);
    if (la != lb) {
      const std::string& l = lb.empty() ? la : lb;
      return l.substr(0, l.rfind(' '));
    }
    a = ea + 1;
    b = eb + 1;
  }
  return "";
}

// Where a run's base weights came from, by its configuration: model.path, or model.init = "random" with its seed.
std::string base_source(const std::string& toml) {
  const auto all = flatten_config(toml);
  const auto get = [&all](const std::string& key) {
    const auto it = all.find(key);
    return it == all.end() ? std::string() : it->second;
  };
  if (get("model.init") == "\"random\"")
    return "random weights (train.seed = " + get("train.seed") + ", model.init_std = " + get("model.init_std") + ")";
  const std::string path = get("model.path");
  return path.empty() ? std::string("unknown weights") : "model.path = " + path;
}

// The reference a reference_identity() names, for messages, with the paths from the run's configuration.
std::string reference_description(const std::string& identity, const std::string& config_text) {
  const std::string kind = identity.substr(0, identity.find('\n'));
  const auto all = flatten_config(config_text);
  const auto get = [&all](const std::string& key) {
    const auto it = all.find(key);
    return it == all.end() ? std::string("(unknown)") : it->second;
  };
  if (kind == "base") return "the base model (the adapter switched off)";
  if (kind == "adapter") return "the starting adapter (lora.adapter = " + get("lora.adapter") + ")";
  if (kind == "teacher") return "the teacher (distill.teacher = " + get("distill.teacher") + ")";
  return "the starting weights (" + base_source(config_text) + ")";
}

std::string identity_kind(const std::string& identity) { return identity.substr(0, identity.find('\n')); }

// copies: the trainable values' copies in the file (weights, two moments; and a synced reference's weights)
dist::MpiEnv::Patience file_patience(std::size_t trainable, const std::string& what, int copies) {
  const double bytes = copies * 4.0 * static_cast<double>(trainable);
  char size[32];
  if (bytes >= 1e9) std::snprintf(size, sizeof size, "%.1f GB", bytes / 1e9);
  else std::snprintf(size, sizeof size, "%.1f MB", bytes / 1e6);
  return {3.0 * bytes / kSlowestFileBytesPerS, what + " (" + size + ")"};
}
}  // namespace

Checkpointer::Checkpointer(const dist::MpiEnv& env, kernels::Ops& ops, const Optimizer& opt, CheckpointOptions opts,
                           std::string identity)
    : env_(env), ops_(ops), opt_(opt), opts_(std::move(opts)), identity_(std::move(identity)) {}

std::string Checkpointer::params_hash() const {
  const Trainable& tr = opt_.trainable();
  std::vector<float> host(tr.n);
  ops_.download(host.data(), tr.params, tr.n * sizeof(float));
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes
  const auto* p = reinterpret_cast<const unsigned char*>(host.data());
  for (std::size_t i = 0; i < tr.n * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void Checkpointer::save(const TrainState& st, const std::string& extra) {
  // Every rank must hold the same weights: compare a hash with rank 0's before writing.
  const std::string mine = params_hash();
  const std::string root = env_.broadcast(mine, 0);
  const int mismatch = env_.allreduce_max(mine != root ? 1 : 0);
  if (mismatch) {
    const int first = env_.allreduce_min(mine != root ? env_.rank() : env_.size());
    throw FatalError("the trainable weights of rank " + std::to_string(first) + " differ from rank 0's at step " +
                     std::to_string(st.step) + " (hash " + (env_.rank() == first ? mine : std::string("?")) +
                     " vs " + root + "): the ranks have diverged; stopping instead of writing a checkpoint");
  }
  // Rank 0 writes; the others wait for the outcome (agree), so that a failed write ends every rank with rank 0's
  // one line and the same exit code, instead of leaving them in the next step's collectives until rank 0's
  // error aborts the job (mpirun's banner, no line naming the write).
  env_.agree(
      [&] {
        if (env_.rank() == 0) write(st, extra);
        else fault::point("checkpoint_write", env_.rank(), st.step);  // tests: a rank failing while rank 0 writes
      },
      file_patience(opt_.trainable().n, "rank 0's write of " + checkpoint_path(opts_.dir, st.step), copies()));
  last_ = checkpoint_path(opts_.dir, st.step);
}

void Checkpointer::write(const TrainState& st, const std::string& extra) {
  const Trainable& tr = opt_.trainable();
  Checkpoint ck;
  ck.state = st;
  for (auto& c : ck.state.rank_rng) c = static_cast<std::uint64_t>(st.step);
  ck.tensors = tr.tensors;
  ck.params.resize(tr.n);
  ck.adam_m.resize(tr.n);
  ck.adam_v.resize(tr.n);
  ops_.download(ck.params.data(), tr.params, tr.n * 4);
  ops_.download(ck.adam_m.data(), opt_.exp_avg(), tr.n * 4);
  ops_.download(ck.adam_v.data(), opt_.exp_avg_sq(), tr.n * 4);
  if (synced_) ck.reference_params = synced_->values();
  // A diverged run's weights are never written: a checkpoint with a non-finite value could only replace (and,
  // under keep_last, prune) intact ones.
  for (const std::vector<float>* v : {&ck.params, &ck.adam_m, &ck.adam_v, &ck.reference_params})
    for (const float x : *v)
      if (!std::isfinite(x))
        throw UserError(checkpoint_path(opts_.dir, st.step) + ": not written: the " +
                        (v == &ck.params ? "trainable weights"
                         : v == &ck.reference_params ? "reference weights (sync_ref_model)"
                                                     : "AdamW moments") +
                        " hold non-finite values (the run diverged; lower train.lr?); " +
                        (last_.empty() ? std::string("no checkpoint was written before it")
                                       : "the last checkpoint before it: " + last_));
  ck.config_text = opts_.config_text;
  ck.model_identity = identity_;
  ck.base_fingerprint = tr.base;
  ck.reference = opts_.reference;
  ck.numerics = opts_.numerics;
  ck.data = opts_.data;
  ck.lora_config = opts_.lora_config;
  if (log_position_) ck.log_position = log_position_();
  ck.mgrl_version = build_info().version;
  ck.extra = extra;
  write_checkpoint(opts_.dir, ck);  // removes temporaries left by an interrupted earlier write first
  known_.intact.insert(checkpoint_path(opts_.dir, st.step));  // read back against its buffers by the seal
  ck = Checkpoint();  // pruning may read an older checkpoint back: not two in memory at once
  prune_checkpoints(opts_.dir, opts_.keep_last, known_);  // the newest keep_last intact ones
}

void Checkpointer::load(const std::string& path, TrainState& st, std::string* extra) {
  Checkpoint ck = read_checked(path);
  apply(ck, path, st, extra);
}

Checkpoint Checkpointer::read_checked(const std::string& path) const {
  const Trainable& tr = opt_.trainable();
  Checkpoint ck = read_checkpoint(path, identity_);
  // A checkpoint of another training mode (a DPO run's resumed by SFT, an SFT run's by GRPO: the same adapter
  // shapes) carries another objective's step count, schedule and moments: resumed silently before 2026-11-28.
  const std::string then = mode_of(ck.config_text), now = mode_of(opts_.config_text);
  if (!then.empty() && !now.empty() && then != now)
    throw UserError(path + ": a checkpoint of mgrl " + then + ", resumed by mgrl " + now +
                    ": to start from its weights, export them (mgrl export) and set lora.adapter or model.path; or "
                    "use another checkpoint.dir");
  // Adapters trained over other base weights than this run's: another model of
  // the same shapes (an instruct version, a re-download of another revision, model.init's seed changed) at the same
  // or another path; resumed silently before 2026-11-28. Files written before then have no fingerprint.
  const std::string differs = first_base_difference(ck.base_fingerprint, tr.base);
  if (!ck.base_fingerprint.empty() && !tr.base.empty() && !differs.empty()) {
    const std::string what = path + ": trained over other base weights than this run's (tensor '" + differs +
                             "' differs; its run: " + base_source(ck.config_text) + "; this run: " +
                             base_source(opts_.config_text) + ")";
    if (!opts_.allow_other_base)
      throw UserError(what + ": adapters trained over one base do not fit another. Resume over the weights it was "
                      "trained over, or set checkpoint.allow_other_base = true to go on over these");
    log::warn_once(what + "; going on over this run's (checkpoint.allow_other_base)");
  }
  // Another reference policy than its run's: another objective from here on (DPO/KTO/GRPO against the base model
  // where the run's was its starting adapter, or against another adapter: other tensors or another lora_alpha).
  // Resumed with a warning that lora.adapter differed, or in silence when the adapter's files had been rewritten,
  // until 2026-11-29.
  if (!ck.reference.empty() && !opts_.reference.empty() && ck.reference != opts_.reference) {
    const std::string then = identity_kind(ck.reference), now = identity_kind(opts_.reference);
    const std::string how =
        then == "model" ? "Resume over the weights it started from (its model.path, or model.init = \"random\" with its "
                          "train.seed)"
        : then == "adapter" ? "Resume with its lora.adapter as it was"
        : then == "teacher" ? "Resume with its distill.teacher as it was"
                            : "Resume without lora.adapter, as its run started";
    throw UserError(path + ": its run's reference policy was " + reference_description(ck.reference, ck.config_text) +
                    ", this run's is " + reference_description(opts_.reference, opts_.config_text) +
                    (then == now ? " (other weights)" : "") + ": the objective would change under the run. " + how +
                    ", or start a new run (another checkpoint.dir) from this checkpoint's weights (mgrl export)");
  }
  // Written before checkpoints kept it: nothing to compare; said, as this run's reference is taken as its run's.
  if (ck.reference.empty() && !opts_.reference.empty())
    log::warn_once(path + ": written before checkpoints kept the reference policy (2026-11-29): this run's, " +
                   reference_description(opts_.reference, opts_.config_text) +
                   ", is taken as its run's (a run started from lora.adapter must be resumed with it)");
  if (ck.params.size() != tr.n)
    throw UserError(path + ": holds " + std::to_string(ck.params.size()) + " trainable values, this run has " +
                    std::to_string(tr.n));
  // A reference that moved with training (sync_ref_model) is part of the run's state: without its weights a resume
  // past the first sync would go on against another reference, and a run without the sync would take the starting
  // weights as its reference again.
  if (synced_ && ck.reference_params.empty() && ck.state.step >= sync_every_)
    throw UserError(path + ": step " + std::to_string(ck.state.step) + ", written without the weights of a reference "
                    "policy that moves with training, but this run mixes the policy into its reference every " +
                    std::to_string(sync_every_) + " steps (sync_ref_model) and would go on against another one: "
                    "resume with sync_ref_model as its run had it (off), or start a new run (another checkpoint.dir)");
  if (!synced_ && !ck.reference_params.empty())
    throw UserError(path + ": its run's reference policy moves with training (sync_ref_model), this run's would be "
                    "its starting weights again: resume with sync_ref_model = true as its run had it, or start a new "
                    "run (another checkpoint.dir)");
  return ck;
}

void Checkpointer::apply(const Checkpoint& ck, const std::string& path, TrainState& st, std::string* extra) {
  const Trainable& tr = opt_.trainable();
  if (static_cast<int>(ck.state.rank_rng.size()) != env_.size())
    log::warn_once(path + ": written by " + std::to_string(ck.state.rank_rng.size()) + " ranks, resumed on " +
                   std::to_string(env_.size()) + " (the data order is the same; per-rank random streams restart)");
  ops_.upload(tr.params, ck.params.data(), tr.n * 4);
  tr.params_changed();
  ops_.upload(opt_.exp_avg(), ck.adam_m.data(), tr.n * 4);
  ops_.upload(opt_.exp_avg_sq(), ck.adam_v.data(), tr.n * 4);
  if (synced_ && !ck.reference_params.empty()) synced_->set_values(ck.reference_params);
  changed_ = changed_settings(ck.config_text, opts_.config_text);  // said once the resume is accepted
  resumed_log_position_ = ck.log_position;
  resumed_ = true;
  // Beyond the settings (silent until 2026-11-28, found by a resume hunt): the training data's bytes (the file edited
  // in place, or another file under the same relative path), and the numeric setup (a requeue on a node with
  // another core count: another thread count, other last bits).
  if (!ck.data.empty() && !opts_.data.empty() && ck.data != opts_.data)
    changed_ += std::string(changed_.empty() ? "" : "; ") + "data.input's contents: " + opts_.data + " (was " + ck.data +
                ": the examples and their order from here on are not its run's)";
  if (!ck.numerics.empty() && !opts_.numerics.empty() && ck.numerics != opts_.numerics)
    numerics_ = path + ": resumed on another numeric setup than its run's (" + opts_.numerics + "; its run: " +
                ck.numerics + "): the run goes on, but not bit for bit as an uninterrupted one (a bit-exact resume "
                "needs the same backend, thread count (runtime.threads) and BLAS, or the same GPU model)";
  st = ck.state;
  st.rank_rng.assign(static_cast<std::size_t>(env_.size()), static_cast<std::uint64_t>(st.step));
  // The loss scaler of this run's settings (train.loss_scaling) taking over the checkpoint's scale.
  const std::string scaler = opt_.resumed(st);
  if (!scaler.empty()) log::warn_once(path + ": " + scaler);
  if (extra) *extra = ck.extra;
}

namespace {
std::string log_start_file(const std::string& dir) { return dir + "/.mgrl.log_start"; }
}  // namespace

std::string Checkpointer::log_position_to_trim() const {
  if (env_.rank() != 0) return "";
  if (resumed_) return resumed_log_position_;
  if (!enabled()) return "";
  std::ifstream in(log_start_file(opts_.dir));
  std::string line;
  std::getline(in, line);
  return line;
}

Checkpointer::LogAttachment Checkpointer::attach_log(std::function<std::string()> position) {
  log_position_ = std::move(position);
  const std::string at = env_.rank() == 0 && !resumed_ && enabled() && log_position_ ? log_position_() : "";
  try {
    if (!at.empty()) io::write_file_atomically(log_start_file(opts_.dir), at + "\n");
  } catch (const UserError& e) {
    log::warn(std::string(e.what()) + ": where this run's metrics begin is not recorded (a restart before the first "
              "checkpoint would keep this attempt's records beside its own)");
  }
  return LogAttachment(this);
}

bool nothing_to_train(const std::string& resumed, std::int64_t step, std::int64_t end) {
  if (resumed.empty() || step < end) return false;
  log::warn_once(resumed + ": resumed at step " + std::to_string(step) + ", and this run ends at step " +
                 std::to_string(end) + " (train.max_steps, or train.stop_at_step): nothing to train, nothing "
                 "evaluated, and the run's files are left as they are; raise train.max_steps to go on");
  return true;
}

std::string Checkpointer::resume(TrainState& st, std::string* extra,
                                 const std::function<void(const std::string& extra)>& accept) {
  const std::string path = resume_checkpoint(st, extra);
  if (path.empty()) return path;
  if (accept) {
    env_.agree([&] {
      try {
        accept(extra ? *extra : std::string());
      } catch (const UserError& e) {
        throw UserError(path + ": " + e.what());
      }
    });
  }
  // Settings changed since the checkpoint's run (another learning rate, data file, seed, LoRA alpha or base
  // model path): the run goes on with this run's, said once (until 2026-11-28, silently).
  if (!changed_.empty())
    log::warn_once(path + ": resumed with settings that differ from its run's: " + changed_ +
                   " (this run's are used from here on)");
  if (!numerics_.empty()) log::warn_once(numerics_);
  return path;
}

std::string Checkpointer::resume_checkpoint(TrainState& st, std::string* extra) {
  if (opts_.resume == "auto") {
    if (!enabled()) return "";
    // Temporaries of a writer that was killed are of no use; rank 0 (the only writer) removes them.
    if (env_.rank() == 0) remove_stale_temporaries(opts_.dir);
    // The newest intact checkpoint: a damaged one (checksum, truncation, a name that disagrees with its step)
    // is reported and passed over. Every rank reads every candidate and all agree on the outcome.
    // Rank 0's list is everyone's (ranks on other nodes could see a shared directory a moment apart).
    std::string listing;
    env_.agree([&] {
      if (env_.rank() != 0) return;
      for (const auto& p : checkpoints_newest_first(opts_.dir)) listing += p + "\n";
    });
    listing = env_.broadcast(listing, 0);
    std::vector<std::string> candidates;
    for (std::size_t start = 0, nl; (nl = listing.find('\n', start)) != std::string::npos; start = nl + 1)
      candidates.push_back(listing.substr(start, nl - start));
    std::vector<std::string> skipped, skipped_paths;  // why each newer candidate was passed over, and which
    for (const auto& path : candidates) {
      Checkpoint ck;
      std::string damage;
      env_.agree(
          [&] {
            try {
              ck = read_checked(path);
            } catch (const CorruptCheckpoint& e) {
              damage = e.what();
            }
          },
          file_patience(opt_.trainable().n, "the ranks' reads of " + path, copies()));
      const int damaged_somewhere = env_.allreduce_max(damage.empty() ? 0 : 1);
      if (damaged_somewhere) {
        const int speaker = env_.allreduce_min(damage.empty() ? env_.size() : env_.rank());
        const std::string why = env_.broadcast(damage, speaker);
        skipped.push_back(why);
        skipped_paths.push_back(path);
        continue;
      }
      // Once an intact one is found (when none is, the run stops and the error alone says it, changing nothing),
      // rank 0 sets the damaged newer ones aside (renamed <file>.damaged: never resumed from, never counted or
      // deleted by pruning, which keeps the newest keep_last intact ones) and reports each. Every rank has read
      // them by now.
      if (env_.rank() == 0) {
        for (std::size_t i = 0; i < skipped.size(); ++i) {
          std::string why_not;
          const std::string aside = set_aside_damaged(skipped_paths[i], &why_not);
          if (aside.empty()) known_.damaged.insert(skipped_paths[i]);
          log::warn_once(skipped[i] + (aside.empty() ? "; it cannot be set aside (" + why_not + "): left in place"
                                                     : "; set aside as " + aside) +
                         "; passing over it to an older checkpoint");
        }
        known_.intact.insert(path);
      }
      env_.agree([&] { apply(ck, path, st, extra); });
      log::info("resumed from " + path + " at step " + std::to_string(st.step));
      last_ = path;
      return path;
    }
    if (!skipped.empty())
      env_.agree([&] {
        throw UserError(opts_.dir + ": no intact checkpoint to resume from (" + std::to_string(skipped.size()) +
                        " damaged; the newest: " + skipped.front() + ")");
      });
    return "";
  }
  std::string from;
  if (!opts_.resume.empty() && opts_.resume != "none") from = opts_.resume;
  env_.agree([&] {
    if (!from.empty()) load(from, st, extra);
  }, from.empty() ? dist::Patience() : file_patience(opt_.trainable().n, "the ranks' reads of " + from, copies()));
  // checkpoint.dir holding checkpoints of later steps than this run starts from (an earlier run's, with resume =
  // none; those after the one resumed, with resume = a path): this run would replace them one by one, pruning
  // would count them among the newest and delete this run's own, and a later resume = auto would take the earlier
  // run's. Refused before anything is written (until 2026-11-28 they were overwritten and pruned silently).
  if (enabled())
    env_.agree([&] {
      if (env_.rank() != 0) return;
      const auto newest = newest_checkpoint(opts_.dir);
      if (!newest) return;
      const std::int64_t step = checkpoint_step(*newest);
      if (from.empty())
        throw UserError(opts_.dir + " (checkpoint.dir) holds checkpoints of an earlier run (the newest: " + *newest +
                        ") and checkpoint.resume = \"none\" starts afresh: its checkpoints would replace and prune "
                        "them. Continue it (checkpoint.resume = \"auto\"), or give this run another checkpoint.dir, "
                        "or move them away");
      if (step > st.step)
        throw UserError(opts_.dir + " (checkpoint.dir) holds checkpoints after step " + std::to_string(st.step) +
                        " of " + from + " (the newest: " + *newest + "): this run would replace and prune them, and "
                        "resume = \"auto\" would take them later. To go back to step " + std::to_string(st.step) +
                        ", move the later ones away, or give this run another checkpoint.dir");
    });
  if (!from.empty()) log::info("resumed from " + from + " at step " + std::to_string(st.step));
  last_ = from;
  return from;
}

}  // namespace mgrl::train
