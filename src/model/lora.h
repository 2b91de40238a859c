// lora.h: LoRA adapters as PEFT defines them: which linear layers carry one (by module name),
// rank r, alpha, scaling (alpha / r, or alpha / sqrt(r) with rsLoRA), dropout; the parameters of
// all adapters in one flat f32 buffer (and their gradients in another, same layout), PEFT names,
// initialisation (A kaiming-uniform, B zero) and the PEFT adapter directory format.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "kernels/ops.h"

namespace mgrl::model {

// The seven linear layers of a Llama/Qwen block, in block order.
enum class Module { Q, K, V, O, Gate, Up, Down };
inline constexpr int kNumModules = 7;
const char* module_name(Module m);  // "q_proj", ...
const char* module_path(Module m);  // "self_attn.q_proj", "mlp.gate_proj", ...
bool parse_module(const std::string& name, Module* out);
// in / out features of a module in a model.
int module_in(const io::ModelConfig& c, Module m);
int module_out(const io::ModelConfig& c, Module m);

// Whether the adapters of the layers that read one input (q, k, v; gate, up) run as one group, their products over
// that input stacked (Ops::lora_group_forward / lora_group_backward): yes unless the environment sets
// MGRL_LORA_GROUPS=0 (read once), which runs every adapter on its own as before.
bool lora_groups_enabled();

struct LoraConfig {
  int r = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  bool use_rslora = false;
  std::vector<std::string> targets{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  // An adapter_config.json whose target_modules is a regular expression: it, and that file (messages). targets then
  // holds the projections it selects in some module tree; LoraParams keeps those it selects in every layer of its
  // model's own tree (refusing one selected in some layers only).
  std::string target_regex, source;
  float scale() const;
};

// The seed of a training step's LoRA dropout masks (Transformer::forward's dropout_seed), from the run's seed and
// the step: the same on every rank and for every micro-batch, the masks told apart by Batch::seq_keys.
inline std::uint64_t dropout_seed(std::uint64_t run_seed, std::int64_t step) {
  return random_bits(run_seed ^ 0x6c6f726164726f70ull, static_cast<std::uint64_t>(step));  // "loradrop"
}

// Reads a PEFT adapter_config.json (LoRA only). Throws UserError naming the file for features mgrl
// does not implement (DoRA, rank or alpha patterns, layers_to_transform, biases, fan_in_fan_out).
LoraConfig read_peft_config(const std::string& adapter_config_json);
// The same from a parsed adapter_config.json (`where` names it in errors); and the fields it reads, as JSON (what a
// LoRA run's checkpoints keep: train::Checkpoint::lora_config).
LoraConfig peft_config_from_json(const nlohmann::json& j, const std::string& where);
std::string peft_config_json(const LoraConfig& c);

// Writes a PEFT adapter directory (created if needed): adapter_model.safetensors holding `tensors` (PEFT
// names, f32) and adapter_config.json describing cfg; both written under temporary names and renamed. For the
// language model of a vision-language checkpoint (vlm), the tensors get its module names (peft_name_of_vlm) and
// target_modules is vlm_target_regex: a plain list would put PEFT's LoRA on the vision tower's q/k/v too.
void write_peft_adapter(const std::string& dir, const LoraConfig& cfg, const std::string& base_model_path,
                        const std::vector<io::TensorToWrite>& tensors, bool vlm = false);
// A vision-language checkpoint's PEFT names (transformers >= 4.52's module tree): "base_model.model.model.layers."
// -> "base_model.model.model.language_model.layers."; and mgrl's own name of any of its adapters' tensors (that, or
// transformers 4.50's "base_model.model.language_model.model.layers."), other names unchanged.
std::string peft_name_of_vlm(const std::string& name);
std::string peft_name_from_vlm(const std::string& name);
// target_modules of such an adapter: a regular expression PEFT matches against the whole module name,
// model\.language_model\.layers\.\d+\.(self_attn|mlp)\.(q_proj|...) with the targets of cfg.
std::string vlm_target_regex(const LoraConfig& cfg);

struct LoraSlot {
  int layer;
  Module module;
  int in, out;
  std::size_t a_offset, b_offset;  // in floats, into params() / grads()
};

class LoraParams {
 public:
  LoraParams(const io::ModelConfig& model, LoraConfig cfg, kernels::Ops& ops);
  ~LoraParams();
  LoraParams(const LoraParams&) = delete;
  LoraParams& operator=(const LoraParams&) = delete;

  const LoraConfig& config() const { return cfg_; }
  const std::vector<LoraSlot>& slots() const { return slots_; }
  const LoraSlot* find(int layer, Module m) const;  // nullptr: no adapter there
  std::size_t numel() const { return numel_; }
  float* params() { return params_; }  // backend memory
  float* grads() { return grads_; }
  const float* A(const LoraSlot& s) const { return params_ + s.a_offset; }
  const float* B(const LoraSlot& s) const { return params_ + s.b_offset; }
  float* dA(const LoraSlot& s) { return grads_ + s.a_offset; }
  float* dB(const LoraSlot& s) { return grads_ + s.b_offset; }
  void zero_grads();

  // "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
  static std::string peft_name(const LoraSlot& s, bool a);
  // PEFT's initialisation: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform with a = sqrt(5)), B = 0.
  void init(std::uint64_t seed);
  // Loads adapter_model.safetensors of a PEFT directory; every slot must be present with its shape.
  void load_peft(const std::string& dir);
  // Writes adapter_config.json + adapter_model.safetensors.
  void save_peft(const std::string& dir, const std::string& base_model_path) const;
  // All parameters as host f32 (slot order), and back.
  std::vector<float> to_host() const;
  void from_host(const std::vector<float>& v);

 private:
  LoraConfig cfg_;
  kernels::Ops& ops_;
  bool vlm_ = false;  // the model is a vision-language checkpoint's language model (io::ModelConfig::vlm)
  std::vector<LoraSlot> slots_;
  std::size_t numel_ = 0;
  float* params_ = nullptr;
  float* grads_ = nullptr;
};

}  // namespace mgrl::model
