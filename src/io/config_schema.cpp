// config_schema.cpp: mgrl's configuration keys. Add a key here and nowhere else; docs/config.md
// is `mgrl help-config` and a test keeps the two in step.
#include "io/config_schema.h"

namespace mgrl::io {

const std::vector<std::string>& mgrl_modes() {
  static const std::vector<std::string> modes{"info", "score", "help-config"};
  return modes;
}

const Schema& mgrl_schema() {
  using T = ValueType;
  static const Schema schema = [] {
    Schema s;
    auto add = [&s](KeySpec k) { s.push_back(std::move(k)); };
    add({"mode", T::String, std::nullopt,
         "what to run: info (ranks, devices, versions), score (log-probs of token sequences) or help-config (this "
         "list); the command line may name it instead",
         mgrl_modes(), {}, {}, {}});
    add({"runtime.backend", T::String, Value(std::string("auto")),
         "compute backend: auto (CUDA when every rank has a GPU of its own, else CPU), cpu or cuda",
         {"auto", "cpu", "cuda"}, {}, {}, {}});
    add({"runtime.threads", T::Int, Value(std::int64_t{0}),
         "CPU threads per rank; 0: the cores this rank may use (its affinity mask, shared when unbound)",
         {}, 0.0, 4096.0, {}});
    add({"runtime.comm_timeout_s", T::Float, Value(600.0),
         "seconds a collective may take before the job is ended with a message naming it; 0: no limit",
         {}, 0.0, std::nullopt, {}});
    add({"model.path", T::String, std::nullopt,
         "Hugging Face model directory: config.json and model.safetensors (or a sharded index)", {}, {}, {},
         {"score"}});
    add({"lora.adapter", T::String, Value(std::string("")),
         "PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) to apply; empty: none",
         {}, {}, {}, {}});
    add({"data.input", T::String, std::nullopt,
         "input JSONL file; for score, one {\"tokens\": [ids...]} object per line", {}, {}, {}, {"score"}});
    add({"score.output", T::String, std::nullopt,
         "output HDF5 file: tokens, lengths and logprobs (see docs/score.md)", {}, {}, {}, {"score"}});
    add({"score.batch_size", T::Int, Value(std::int64_t{8}), "sequences per forward pass on each rank", {}, 1.0,
         {}, {}});
    add({"log.level", T::String, Value(std::string("info")), "least severe messages printed: debug, info, warn or error",
         {"debug", "info", "warn", "error"}, {}, {}, {}});
    return s;
  }();
  return schema;
}

}  // namespace mgrl::io
