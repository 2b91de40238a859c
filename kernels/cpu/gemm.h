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

// The batch-invariant kernel itself (gemm_nt in batch-invariant mode calls it with Best). Its order of summation is
// fixed (gemm.cpp says which); every path gives the same bits. Scalar (one element at a time: the path of CPUs other
// than x86-64), Sse2 and Avx2 pick a path for tests (Sse2/Avx2 on x86-64 only, else Scalar runs; Avx2 falls back to
// SSE2 on a CPU without it: gemm_nt_fixed_has_avx2 says whether it did).
enum class FixedIsa { Best, Scalar, Sse2, Avx2 };
void gemm_nt_fixed(float* C, const float* A, const float* B, int M, int N, int K, float alpha, float beta,
                   FixedIsa isa);
bool gemm_nt_fixed_has_avx2();

}  // namespace mgrl::kernels::cpu
