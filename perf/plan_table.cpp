// plan_table.cpp: the "what fits where" tables of docs/large-models.md, from model::memory_plan (the arithmetic of
// `mgrl plan`): per-rank memory of a LoRA SFT step (r 16 on all seven linear layers, model.recompute, one sequence
// of 2048 tokens a micro-batch) for the 7B / 32B / 70B shapes as bf16 LoRA, QLoRA (NF4 base, double-quantized
// absmax) and QLoRA with the base sharded over the ranks (model.shard_base: each rank stores its part of every
// decoder layer's NF4 bytes and gathers a layer's NF4 bytes before use), on 1, 2, 4 and 8 GPUs of 80 GB; and the
// largest micro-batch (tokens) that fits. Predicted, not measured.
//   build/perf/plan_table [GPU_GiB]    (default 79.6: what an 80 GB H100 shows to CUDA)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/model_shapes.h"
#include "model/memory_plan.h"

int main(int argc, char** argv) {
  using namespace mgrl;
  // An "80 GB" H100 shows 79.6 GiB to CUDA (85520809984 bytes total); budgets are given in GiB on the command line.
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double budget = (argc > 1 ? std::atof(argv[1]) : 79.6) * gib;
  struct Setup {
    const char* name;
    const char* quantize;
    bool shard;
  };
  const Setup setups[] = {{"bf16 LoRA", "none", false},
                          {"bf16 LoRA + shard_base", "none", true},
                          {"QLoRA (NF4)", "nf4", false},
                          {"QLoRA + shard_base", "nf4", true}};
  std::printf("| shape | setup | 1 GPU | 2 GPUs | 4 GPUs | 8 GPUs |\n|---|---|---|---|---|---|\n");
  for (const char* shape : {"qwen2.5-7b", "qwen2.5-32b", "llama-3.1-70b"}) {
    for (const Setup& s : setups) {
      std::string row = std::string("| ") + shape + " | " + s.name + " |";
      for (const int ranks : {1, 2, 4, 8}) {
        model::PlanInput in;
        in.model = io::model_shape(shape);
        in.cuda = true;
        in.storage = 2;
        in.quantize = s.quantize;
        in.double_quant = true;
        in.shard_base = s.shard;
        in.ranks = ranks;
        in.lora_cfg.r = 16;
        in.recompute = true;
        in.train_tokens = 2048;
        model::set_runtime_allowances(in);
        const double total = model::memory_plan(in).total;
        const long long best = static_cast<long long>(model::largest_fitting_tokens(in, budget, 1 << 22));
        char cell[96];
        if (best > 0)
          std::snprintf(cell, sizeof cell, " %.1f GiB; up to %lld%s tok |", total / gib, best,
                        best >= (1 << 22) ? "+" : "");
        else
          std::snprintf(cell, sizeof cell, " %.1f GiB; **no** |", total / gib);
        row += cell;
      }
      std::printf("%s\n", row.c_str());
    }
  }
  return 0;
}
