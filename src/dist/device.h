// device.h: the compute device of each rank. CUDA when every rank has a GPU of its own
// (the node-local rank's GPU, or the one GPU the launcher shows the rank), the CPU otherwise;
// the choice is made collectively so that all ranks use the same backend.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mgrl::dist {

class MpiEnv;

enum class Backend { Cpu, Cuda };
const char* backend_name(Backend b);

struct GpuInfo {
  int index = -1;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  std::size_t memory_bytes = 0;
  std::string pci_bus_id;
};

struct Device {
  Backend backend = Backend::Cpu;
  GpuInfo gpu;             // valid for Backend::Cuda
  int cpu_threads = 1;     // threads for the CPU backend (and host-side work)
  std::string cpu_model;   // from /proc/cpuinfo
};

// Number of CUDA devices this process sees (0 without CUDA, a driver or a GPU).
int cuda_device_count();
GpuInfo cuda_device_info(int index);
// "13.0" or "none"
std::string cuda_runtime_version();
std::string cuda_driver_version();
// P2P access matrix of the GPUs of this node, one text row per GPU ("" without GPUs).
std::vector<std::string> cuda_p2p_matrix();

// Device memory in use on the current GPU (total - free), 0 without CUDA.
std::size_t gpu_memory_used();

std::string cpu_model_name();
// Cores this rank may use: its affinity mask, shared among the node's ranks when unbound.
int default_cpu_threads(int local_size);

// The GPU (index among those this process sees) of a rank: its node-local rank when it sees at least one GPU per
// rank of the node (a launcher that shows every GPU), else local_rank modulo what it sees (srun --gpus-per-task=1,
// --gpu-bind: SLURM shows each task its own GPU as device 0); -1 without a GPU.
int gpu_index_for(int local_rank, int local_size, int visible_gpus);

// The storage dtype of a backend (frozen weights and activations; LoRA weights, gradients and AdamW state stay f32)
// as model.dtype (`requested`: "auto", "bf16" or "fp16") asks, for a job whose oldest GPU has compute capability cc
// (10 * major + minor: 70 for V100, 75 for T4, 80 for A100; ignored on the CPU). auto: bf16 from 8.0 on, fp16 before
// (no bf16 before Ampere; fp16 trains with dynamic loss scaling); the CPU backend is f32. UserError naming
// model.dtype for bf16 before 8.0 and for bf16 or fp16 on the CPU backend. Pure: tested without a GPU.
DType storage_dtype(Backend backend, int cc, const std::string& requested);
// Collective: the smallest compute capability (10 * major + minor) of the job's GPUs, 0 on the CPU backend.
int job_compute_capability(const MpiEnv& env, const Device& device);

// Collective. requested: "auto", "cpu" or "cuda"; threads: 0 = default_cpu_threads.
// Throws UserError (same on every rank) when "cuda" is asked for and cannot be had.
Device choose_device(const MpiEnv& env, const std::string& requested, int threads);

}  // namespace mgrl::dist
