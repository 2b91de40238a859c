// host_device.h: MGRL_HOST_DEVICE marks a function compiled for the host and, under nvcc, for CUDA kernels too
// (plain C++ headers shared by a kernel and a CPU test or the CPU backend).
#pragma once

#ifdef __CUDACC__
#define MGRL_HOST_DEVICE __host__ __device__
#else
#define MGRL_HOST_DEVICE
#endif
