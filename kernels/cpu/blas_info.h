// blas_info.h: the CPU backend's BLAS library: its description and its thread count.
#pragma once
#include <string>

namespace mgrl::kernels::cpu {

// e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64"
std::string blas_info();
// Threads BLAS may use in this rank.
void set_blas_threads(int n);
int blas_threads();

}  // namespace mgrl::kernels::cpu
