// lora_grads.h: what the trl fixture tests share (unit.dpo, unit.grpo_loss): a fixture model with a PEFT adapter, and
// the check of every LoRA gradient of a model after its backward against a fixture's grads.safetensors (PEFT names),
// within a relative tolerance.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "io/hf_config.h"

#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tests/unit/test_util.h"

namespace mgrl::test {

// The model of model_dir (config.json, weights) with the PEFT adapter of adapter_dir, on ops.
inline std::unique_ptr<model::Transformer> lora_model(kernels::Ops& ops, const std::string& model_dir,
                                                     const std::string& adapter_dir) {
  auto net = std::make_unique<model::Transformer>(io::parse_hf_config(model_dir + "/config.json"), ops);
  net->load_weights(model_dir);
  net->add_lora(model::read_peft_config(adapter_dir + "/adapter_config.json"), 0).load_peft(adapter_dir);
  return net;
}

// Every LoRA tensor's gradient in `net` (after its backward) against the file's tensor of the same PEFT name, and the
// file has no other tensor.
inline void expect_lora_grads_match(model::Transformer& net, kernels::Ops& ops, const std::string& grads_file,
                                    double tol = 1e-4) {
  io::SafetensorsFile grads(grads_file);
  model::LoraParams& lora = *net.lora();
  std::vector<float> host(lora.numel());
  ops.download(host.data(), lora.grads(), host.size() * sizeof(float));
  int compared = 0;
  for (const auto& sl : lora.slots())
    for (bool is_a : {true, false}) {
      const std::string name = model::LoraParams::peft_name(sl, is_a);
      const auto want = io::to_f32(grads.get(name));
      const std::size_t off = is_a ? sl.a_offset : sl.b_offset;
      const std::vector<float> got(host.begin() + static_cast<std::ptrdiff_t>(off),
                                   host.begin() + static_cast<std::ptrdiff_t>(off + want.size()));
      EXPECT_LE(rel_error(got, want), tol) << name;
      ++compared;
    }
  EXPECT_EQ(compared, static_cast<int>(grads.tensors().size())) << grads_file;
}

}  // namespace mgrl::test
