// common.cpp: what several modes share: the op backend of a rank's device, loading a model (+ adapter) on
// every rank, the shard of a rank, the tokenizer directory.
#include "app/modes.h"
#include "dist/mpi_env.h"
#include "io/config.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "dist/device.h"
#include "kernels/ops.h"
#if MGRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mgrl::app {

std::unique_ptr<kernels::Ops> make_ops(const dist::Device& device) {
#if MGRL_WITH_CUDA
  if (device.backend == dist::Backend::Cuda) return kernels::make_cuda_ops(device.gpu.index);
#else
  (void)device;
#endif
  return kernels::make_cpu_ops();
}

void load_model(const Context& ctx, model::Transformer& net, const std::string& model_dir, const std::string& adapter) {
  ctx.env.agree([&] {
    net.load_weights(model_dir);
    if (!adapter.empty())
      net.add_lora(model::read_peft_config(adapter + "/adapter_config.json"), 0).load_peft(adapter);
  });
}

std::pair<std::size_t, std::size_t> shard(const dist::MpiEnv& env, std::size_t n) {
  return {n * static_cast<std::size_t>(env.rank()) / static_cast<std::size_t>(env.size()),
          n * static_cast<std::size_t>(env.rank() + 1) / static_cast<std::size_t>(env.size())};
}

std::string tokenizer_dir(const io::Config& cfg) {
  return cfg.get_string("model.tokenizer").empty() ? cfg.get_string("model.path") : cfg.get_string("model.tokenizer");
}

}  // namespace mgrl::app
