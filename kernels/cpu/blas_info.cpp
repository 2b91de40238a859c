// blas_info.cpp: OpenBLAS description and thread control.
#include "kernels/cpu/blas_info.h"

#include <cblas.h>

namespace mgrl::kernels::cpu {

std::string blas_info() {
#ifdef OPENBLAS_VERSION
  const char* cfg = openblas_get_config();
  std::string s = cfg ? cfg : "OpenBLAS";
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
#else
  return "BLAS (not OpenBLAS)";
#endif
}

void set_blas_threads(int n) {
#ifdef OPENBLAS_VERSION
  openblas_set_num_threads(n);
#else
  (void)n;
#endif
}

int blas_threads() {
#ifdef OPENBLAS_VERSION
  return openblas_get_num_threads();
#else
  return 1;
#endif
}

}  // namespace mgrl::kernels::cpu
