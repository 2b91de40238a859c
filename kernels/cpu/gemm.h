// gemm.h: C = alpha * A @ B^T + beta * C for the CPU backend, with an optional batch-invariant mode.
// BLAS picks kernels and blocking by the matrix sizes and rounds a row differently depending on where
// it sits in the call (measured: OpenBLAS gives other last bits for a row at another position). In
// batch-invariant mode every element is one dot product summed in a fixed order, so a row's result
// never depends on the other rows: a sequence's logits are then bit-identical whatever it is batched
// with, which is what makes generation on 1 and N ranks write identical files. Slower than BLAS; the
// model turns it on for inference only.
#pragma once

namespace mgrl::kernels::cpu {

// Batch-invariant mode of the calling thread (off by default).
void set_batch_invariant(bool on);
bool batch_invariant();

// C[M, N] = alpha * A[M, K] @ B[N, K]^T + beta * C  (row-major; lda = K, ldb = K, ldc = N)
void gemm_nt(float* C, const float* A, const float* B, int M, int N, int K, float alpha, float beta);

}  // namespace mgrl::kernels::cpu
