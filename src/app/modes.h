// modes.h: what a mode receives, and the modes.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

namespace mgrl::dist {
class MpiEnv;
class Comm;
struct Device;
}  // namespace mgrl::dist
namespace mgrl::io {
class Config;
}
namespace mgrl::kernels {
class Ops;
}
namespace mgrl::model {
class Transformer;
}

namespace mgrl::app {

struct Context {
  dist::MpiEnv& env;
  const io::Config& cfg;
  const dist::Device& device;
  dist::Comm& comm;
};

// `mgrl info`: one line per rank (in rank order), then versions, build options, P2P matrix.
int run_info(Context& ctx);
// `mgrl score`: per-token log-probs of JSONL token sequences into an HDF5 file (docs/score.md).
int run_score(Context& ctx);
// `mgrl sft`: supervised fine-tuning (docs/sft.md).
int run_sft(Context& ctx);
// `mgrl export`: a checkpoint as a PEFT adapter directory, optionally also merged into a full model.
int run_export(Context& ctx);
// `mgrl generate`: completions of JSONL prompts into a JSONL file (docs/generate.md).
int run_generate(Context& ctx);

// The op backend for the rank's device.
std::unique_ptr<kernels::Ops> make_ops(const dist::Device& device);
// Base weights from model_dir and, when adapter is not empty, that PEFT adapter; errors agreed on by all ranks.
void load_model(const Context& ctx, model::Transformer& net, const std::string& model_dir, const std::string& adapter);
// [begin, end) of this rank's contiguous share of n items.
std::pair<std::size_t, std::size_t> shard(const dist::MpiEnv& env, std::size_t n);
// model.tokenizer, or model.path when it is empty.
std::string tokenizer_dir(const io::Config& cfg);

}  // namespace mgrl::app
