// bench_io.cpp: throughput of mgrl's file formats through the code paths mgrl itself runs: tokenizer encode
// (MB/s of UTF-8 text), HDF5 training checkpoints written and read (GB/s of tensor data) and a safetensors
// model directory loaded into fp32 host memory (GB/s of stored tensor bytes). One process, no MPI.
//
//   build/perf/bench_io [--bench_dir=DIR] [Google Benchmark flags, e.g. --benchmark_filter=Checkpoint]
//
// Files are written under --bench_dir (default: a fresh directory in $TMPDIR or /tmp, removed at the end): point
// it at the file system checkpoints go to on a cluster (Lustre, GPFS scratch) to measure that one. Reads are of
// files just written, so they come from the page cache: the figures are the cost of parsing, checksums,
// conversion and copies, not of the disk. Checkpoint writes include the fsync that write_checkpoint does.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "core/random.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "train/checkpoint.h"

#ifndef MGRL_SOURCE_DIR
#error "MGRL_SOURCE_DIR (the repository root, for the tokenizer fixtures) must be defined by the build"
#endif

namespace {

namespace fs = std::filesystem;

std::string g_dir;  // scratch directory of this run

// ---- tokenizer encode ----

// A deterministic corpus of ~320 KB in documents of ~1 KB, as a JSONL data set holds them: English prose with
// numbers and punctuation, some indented code, and now and then German, Russian, Chinese and emoji, so that
// every branch of the pre-tokenizer regex and byte-level mapping is taken. Built from a fixed word list with
// the project's counter-based generator, so every machine encodes the same bytes.
std::vector<std::string> make_corpus() {
  static const char* const kWords[] = {
      "the",    "model",   "learns",  "a",        "function", "of",     "its",      "inputs",  "and",     "we",
      "train",  "with",    "gradient", "descent", "on",       "batches", "tokens",  "are",     "packed",  "into",
      "one",    "buffer",  "without", "padding",  "so",       "every",  "row",      "counts",  "loss",    "is",
      "weighted", "by",    "mask",    "when",     "answer",   "correct", "reward",  "equals",  "group",   "mean",
      "don't",  "it's",    "we'll",   "THE",      "Adapter",  "rank",   "alpha",    "scale",   "LoRA",    "weights",
      "Straße", "Größe",   "привет",  "мир",      "日本語",   "中文",   "模型",     "🙂",      "👍🏽",      "naïve"};
  constexpr std::uint64_t kNumWords = sizeof kWords / sizeof kWords[0];
  constexpr std::uint64_t kAsciiWords = 50;  // the first 50 are ASCII; the rest are drawn 1 time in 16
  static const char* const kCode[] = {
      "def solve(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n    return total\n",
      "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
      "    if x is None:\n        raise ValueError(\"x must be set\")\n"};
  std::vector<std::string> docs;
  std::uint64_t c = 0;
  const auto next = [&c](std::uint64_t n) { return mgrl::random_bits(2024, c++) % n; };
  for (int d = 0; d < 320; ++d) {
    std::string doc;
    while (doc.size() < 1000) {
      const std::uint64_t kind = next(32);
      if (kind == 0) {
        doc += kCode[next(3)];
      } else if (kind == 1) {
        doc += std::to_string(next(1000000)) + (next(2) ? ".5" : "") + " ";
      } else {
        std::string w = kWords[next(16) == 0 ? kAsciiWords + next(kNumWords - kAsciiWords) : next(kAsciiWords)];
        const bool capital = doc.empty() || doc.back() == '\n' || doc.back() == '.';
        if (capital && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 'a' + 'A');
        doc += (doc.empty() || doc.back() == '\n' ? "" : " ") + w;
        const std::uint64_t p = next(20);
        if (p == 0) doc += ".";
        else if (p == 1) doc += ",";
        else if (p == 2) doc += "\n\n";
      }
    }
    docs.push_back(std::move(doc));
  }
  return docs;
}

// Encodes every document once per iteration, one encode() call per document as the data loader does.
void BM_TokenizerEncode(benchmark::State& state, const std::string& fixture) {
  const auto tok = mgrl::io::Tokenizer::from_dir(std::string(MGRL_SOURCE_DIR) + "/tests/data/tokenizers/" + fixture);
  const auto docs = make_corpus();
  std::int64_t bytes = 0, tokens = 0;
  for (const auto& d : docs) {
    bytes += static_cast<std::int64_t>(d.size());
    tokens += static_cast<std::int64_t>(tok.encode(d).size());
  }
  for (auto _ : state) {
    for (const auto& d : docs) benchmark::DoNotOptimize(tok.encode(d));
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetItemsProcessed(state.iterations() * tokens);  // items = tokens produced
  state.counters["bytes_per_token"] = static_cast<double>(bytes) / static_cast<double>(tokens);
}

// ---- HDF5 checkpoints ----

// A checkpoint holding `mib` MiB of trainable weights (and as much again twice for the AdamW moments), cut
// into LoRA-shaped tensors: r = 16 by 4096 (a 7-8B model's hidden size), 256 KiB each, A and B of a module
// alternating, so the file has as many datasets per byte as a real adapter's.
mgrl::train::Checkpoint make_checkpoint(std::int64_t mib) {
  mgrl::train::Checkpoint ck;
  constexpr std::int64_t kR = 16, kHidden = 4096, kNumel = kR * kHidden;
  const std::int64_t n_tensors = mib * (1 << 20) / (kNumel * static_cast<std::int64_t>(sizeof(float)));
  std::size_t offset = 0;
  for (std::int64_t i = 0; i < n_tensors; ++i) {
    const bool a = i % 2 == 0;
    const std::string name = "base_model.model.model.layers." + std::to_string(i / 2) + ".self_attn.q_proj.lora_" +
                             (a ? "A" : "B") + ".weight";
    ck.tensors.push_back({name, a ? mgrl::io::Shape{kR, kHidden} : mgrl::io::Shape{kHidden, kR}, offset});
    offset += static_cast<std::size_t>(kNumel);
  }
  ck.params.resize(offset);
  ck.adam_m.resize(offset);
  ck.adam_v.resize(offset);
  for (std::size_t i = 0; i < offset; ++i) {  // finite values of mixed magnitudes: read_checkpoint checks finiteness
    const double u = mgrl::random_uniform(7, i);
    ck.params[i] = static_cast<float>(0.02 * (u - 0.5));
    ck.adam_m[i] = static_cast<float>(1e-4 * (u - 0.5));
    ck.adam_v[i] = static_cast<float>(1e-8 * u);
  }
  ck.state.step = 1000;
  ck.state.rank_rng = {1, 2, 3, 4};
  ck.config_text = "[model]\npath = \"bench\"\n";
  ck.model_identity = mgrl::train::model_identity("LlamaForCausalLM", ck.tensors);
  return ck;
}

std::int64_t checkpoint_bytes(const mgrl::train::Checkpoint& ck) {
  return static_cast<std::int64_t>(3 * ck.params.size() * sizeof(float));
}

void BM_CheckpointWrite(benchmark::State& state) {
  const auto ck = make_checkpoint(state.range(0));
  const std::string dir = g_dir + "/ck_write_" + std::to_string(state.range(0));
  for (auto _ : state) mgrl::train::write_checkpoint(dir, ck);  // the same step each time: replaces the file
  state.SetBytesProcessed(state.iterations() * checkpoint_bytes(ck));
  state.counters["file_MiB"] = static_cast<double>(fs::file_size(mgrl::train::checkpoint_path(dir, 1000))) / (1 << 20);
  fs::remove_all(dir);
}

void BM_CheckpointRead(benchmark::State& state) {
  const std::string dir = g_dir + "/ck_read_" + std::to_string(state.range(0));
  std::int64_t bytes = 0;
  std::string identity;
  {
    const auto ck = make_checkpoint(state.range(0));
    mgrl::train::write_checkpoint(dir, ck);
    bytes = checkpoint_bytes(ck);
    identity = ck.model_identity;
  }
  const std::string path = mgrl::train::checkpoint_path(dir, 1000);
  for (auto _ : state) benchmark::DoNotOptimize(mgrl::train::read_checkpoint(path, identity));
  state.SetBytesProcessed(state.iterations() * bytes);
  fs::remove_all(dir);
}

// ---- safetensors ----

// A model directory (model.safetensors) of range(0) transformer layers of Qwen2.5-0.5B (hidden 896, 2 KV heads of
// 64, MLP 4864; biases on q, k, v; 15 M parameters a layer, 30 MB in bf16) in `dtype`. Loading it does what
// Transformer::load_weights does minus the upload to the device: open and map the directory, look every tensor
// up with its expected shape, convert it to fp32 checking that it is finite.
void BM_SafetensorsLoad(benchmark::State& state, mgrl::DType dtype) {
  const std::int64_t n_layers = state.range(0);
  const std::string dir = g_dir + "/st_" + mgrl::io::safetensors_dtype_name(dtype) + "_" + std::to_string(n_layers);
  fs::create_directories(dir);
  constexpr std::int64_t kD = 896, kKv = 128, kI = 4864;
  const std::vector<std::pair<std::string, mgrl::io::Shape>> layer = {
      {"self_attn.q_proj.weight", {kD, kD}},   {"self_attn.q_proj.bias", {kD}},
      {"self_attn.k_proj.weight", {kKv, kD}},  {"self_attn.k_proj.bias", {kKv}},
      {"self_attn.v_proj.weight", {kKv, kD}},  {"self_attn.v_proj.bias", {kKv}},
      {"self_attn.o_proj.weight", {kD, kD}},   {"mlp.gate_proj.weight", {kI, kD}},
      {"mlp.up_proj.weight", {kI, kD}},        {"mlp.down_proj.weight", {kD, kI}},
      {"input_layernorm.weight", {kD}},        {"post_attention_layernorm.weight", {kD}}};
  const std::size_t esize = mgrl::dtype_size(dtype);
  std::vector<std::pair<std::string, mgrl::io::Shape>> tensors;
  for (std::int64_t l = 0; l < n_layers; ++l)
    for (const auto& [name, shape] : layer) tensors.push_back({"model.layers." + std::to_string(l) + "." + name, shape});
  std::vector<std::vector<std::uint8_t>> data;
  std::vector<mgrl::io::TensorToWrite> to_write;
  std::int64_t bytes = 0;
  std::uint64_t c = 0;
  for (const auto& [name, shape] : tensors) {
    const auto n = static_cast<std::size_t>(mgrl::io::shape_numel(shape));
    data.emplace_back(n * esize);
    for (std::size_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(0.05 * (mgrl::random_uniform(11, c++) - 0.5));
      if (dtype == mgrl::DType::F32) std::memcpy(data.back().data() + 4 * i, &x, 4);
      else {
        const std::uint16_t h = dtype == mgrl::DType::BF16 ? mgrl::io::float_to_bf16(x) : mgrl::io::float_to_half(x);
        std::memcpy(data.back().data() + 2 * i, &h, 2);
      }
    }
    to_write.push_back({name, dtype, shape, data.back().data()});
    bytes += static_cast<std::int64_t>(n * esize);
  }
  mgrl::io::write_safetensors(dir + "/model.safetensors", to_write);
  data.clear();

  std::vector<float> host;
  for (auto _ : state) {
    mgrl::io::SafetensorsModel model(dir);
    for (const auto& [name, shape] : tensors) {
      const auto& info = model.get(name, shape);
      host.resize(static_cast<std::size_t>(info.numel()));
      mgrl::io::copy_finite_to_f32(info, host.data());
    }
    benchmark::DoNotOptimize(host.data());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["file_MiB"] = static_cast<double>(fs::file_size(dir + "/model.safetensors")) / (1 << 20);
  fs::remove_all(dir);
}

}  // namespace

// Checkpoint sizes in MiB of weights (the file is 3x that: weights and two AdamW moments); the small sizes keep
// the smoke test (tests/perf.cmake) short, the large ones are a LoRA adapter of a 7-8B model (r = 16 on every
// projection: ~40 M parameters, 160 MiB) scaled down to what a 2-core CI machine writes in a second.
BENCHMARK(BM_CheckpointWrite)->Arg(1)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CheckpointRead)->Arg(1)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  std::vector<char*> args;
  std::string dir_arg;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--bench_dir=", 12) == 0) dir_arg = argv[i] + 12;
    else args.push_back(argv[i]);
  }
  // A directory of our own, even under a given one: removing it at the end must not touch anything else.
  const fs::path base = dir_arg.empty() ? fs::temp_directory_path() : fs::path(dir_arg);
  g_dir = (base / ("mgrl_bench_io." + std::to_string(::getpid()))).string();
  fs::create_directories(g_dir);

  for (const char* fixture : {"qwen2_bytelevel", "llama3_bytelevel", "llama2_sentencepiece"})
    benchmark::RegisterBenchmark((std::string("BM_TokenizerEncode/") + fixture).c_str(), BM_TokenizerEncode,
                                 std::string(fixture))
        ->Unit(benchmark::kMillisecond);
  for (const auto dtype : {mgrl::DType::BF16, mgrl::DType::F32})
    benchmark::RegisterBenchmark(
        (std::string("BM_SafetensorsLoad/") + mgrl::io::safetensors_dtype_name(dtype)).c_str(), BM_SafetensorsLoad,
        dtype)
        ->Arg(1)
        ->Arg(4)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();

  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::AddCustomContext("bench_dir", g_dir);
  int rc = 0;
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {  // an mgrl error (e.g. a full disk): say so and leave nothing behind
    std::cerr << "bench_io: " << e.what() << "\n";
    rc = 1;
  }
  benchmark::Shutdown();
  std::error_code ec;
  fs::remove_all(g_dir, ec);
  return rc;
}
