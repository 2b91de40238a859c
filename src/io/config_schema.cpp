// config_schema.cpp: mgrl's configuration keys. Add a key here and nowhere else; docs/config.md
// is `mgrl help-config` and a test keeps the two in step.
#include "io/config_schema.h"

namespace mgrl::io {

const std::vector<std::string>& mgrl_modes() {
  static const std::vector<std::string> modes{"info", "score", "generate", "help-config"};
  return modes;
}

const Schema& mgrl_schema() {
  using T = ValueType;
  static const Schema schema = [] {
    Schema s;
    auto add = [&s](KeySpec k) { s.push_back(std::move(k)); };
    add({"mode", T::String, std::nullopt,
         "what to run: info (ranks, devices, versions), score (log-probs of token sequences), generate "
         "(completions of prompts) or help-config (this list); the command line may name it instead",
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
         {"score", "generate"}});
    add({"model.tokenizer", T::String, Value(std::string("")),
         "directory with tokenizer.json (and tokenizer_config.json); empty: model.path", {}, {}, {}, {}});
    add({"lora.adapter", T::String, Value(std::string("")),
         "PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) to apply; empty: none",
         {}, {}, {}, {}});
    add({"data.input", T::String, std::nullopt,
         "input JSONL file; score: {\"tokens\": [ids]} per line; generate: {\"prompt\": text}, {\"messages\": "
         "[{\"role\", \"content\"}]} or {\"prompt_tokens\": [ids]} per line",
         {}, {}, {}, {"score", "generate"}});
    add({"score.output", T::String, std::nullopt,
         "output HDF5 file: tokens, lengths and logprobs (see docs/score.md)", {}, {}, {}, {"score"}});
    add({"score.batch_size", T::Int, Value(std::int64_t{8}), "sequences per forward pass on each rank", {}, 1.0,
         {}, {}});
    add({"generate.output", T::String, std::nullopt, "output JSONL file, one line per completion (docs/generate.md)",
         {}, {}, {}, {"generate"}});
    add({"generate.max_new_tokens", T::Int, Value(std::int64_t{256}), "most tokens generated per completion", {},
         1.0, {}, {}});
    add({"generate.num_generations", T::Int, Value(std::int64_t{1}),
         "completions per prompt; they share one prefill of the prompt", {}, 1.0, {}, {}});
    add({"generate.temperature", T::Float, Value(1.0), "sampling temperature; 0: greedy", {}, 0.0, {}, {}});
    add({"generate.top_k", T::Int, Value(std::int64_t{0}), "sample among the k most likely tokens; 0: off", {}, 0.0,
         {}, {}});
    add({"generate.top_p", T::Float, Value(1.0),
         "sample among the most likely tokens whose probability reaches top_p; 1: off", {}, 0.0, 1.0, {}});
    add({"generate.min_p", T::Float, Value(0.0),
         "drop tokens less likely than min_p times the most likely one; 0: off", {}, 0.0, 1.0, {}});
    add({"generate.seed", T::Int, Value(std::int64_t{0}),
         "sampling seed; a completion depends only on it, its prompt's index and its own index", {}, 0.0, {}, {}});
    add({"generate.stop", T::StringList, Value(std::vector<std::string>{}),
         "strings that end a completion (cut from its text)", {}, {}, {}, {}});
    add({"generate.chat_format", T::String, Value(std::string("auto")),
         "how {\"messages\"} inputs become text: auto (from the tokenizer's chat template), chatml, llama3 or none",
         {"auto", "chatml", "llama3", "none"}, {}, {}, {}});
    add({"generate.max_sequences", T::Int, Value(std::int64_t{64}),
         "sequences generated at once on each rank (KV-cache slots)", {}, 1.0, {}, {}});
    add({"log.level", T::String, Value(std::string("info")), "least severe messages printed: debug, info, warn or error",
         {"debug", "info", "warn", "error"}, {}, {}, {}});
    return s;
  }();
  return schema;
}

}  // namespace mgrl::io
