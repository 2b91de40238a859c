// lora_grads.h: the check the trl fixture tests share (unit.dpo, unit.grpo_loss): every LoRA gradient of a model
// after its backward against a fixture's grads.safetensors (PEFT names), within a relative tolerance.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tests/unit/test_util.h"

namespace mgrl::test {

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
