#pragma once
// C[M][N] (+)= A[M][K] * B[K][N], row-major with leading dimensions: the dense part of coding
// (TQ: latent * Pi, x * Pi^T; low-rank: latent * M, x * M^T). Dispatches at run time to an
// AVX-512, AVX2 or baseline kernel built with per-function target attributes, so the library
// stays runnable on any x86-64. Every output sums its k products in order p = 0..k-1.
namespace kvq::codec::detail {

// Decoding: may fuse multiply-adds, so results can differ in the last bits between CPUs.
void small_gemm(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m, int k,
                int n, bool accumulate);

// Encoding: no fused multiply-adds, hence bit-identical results on every CPU, so the same input
// gives the same codes everywhere (deterministic caches and measured distortions).
void small_gemm_exact(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m,
                      int k, int n, bool accumulate);

}  // namespace kvq::codec::detail
