#pragma once
// The register-blocked kernel behind small_gemm() and small_gemm_exact(): templates with
// internal linkage, so each including .cpp (built with its own floating-point flags) gets its own
// copy and no instantiation is shared across them.
#include <cstdint>

namespace kvq::codec::detail {
namespace {

template <int W>
struct Vec {
  typedef float type __attribute__((vector_size(W * 4), aligned(4), may_alias));
};

// Register-blocked micro-kernel: MR rows x NV vectors of W floats per step of k. Always inlined
// into the per-ISA wrappers below so the vector code is generated for each wrapper's target.
// acc[MR][NV] += A[i..i+MR)[0..k) * B[0..k)[j..j+NV*W), kept in registers for the whole k loop.
template <int W, int MR, int NV>
__attribute__((always_inline)) inline void micro_tile(const float* a, int lda, const float* b,
                                                      int ldb, float* c, int ldc, int k,
                                                      bool accumulate) {
  using V = typename Vec<W>::type;
  // The unroll pragmas let the compiler keep acc[][] in registers (at -O2 it otherwise stays on
  // the stack, reloaded every step: 6x slower).
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? *reinterpret_cast<const V*>(c + r * ldc + v * W) : V{};
  for (int p = 0; p < k; ++p) {
    V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = *reinterpret_cast<const V*>(b + p * ldb + v * W);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const float s = a[r * lda + p];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += s * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) *reinterpret_cast<V*>(c + r * ldc + v * W) = acc[r][v];
}

// Columns in panels of NV vectors, then single vectors, then scalars; rows in blocks of MR, then
// single rows. Always inlined into the per-ISA wrappers so the vector code is generated for each
// wrapper's target.
template <int W, int MR, int NV>
__attribute__((always_inline)) inline void gemm_body(const float* a, int lda, const float* b,
                                                     int ldb, float* c, int ldc, int m, int k,
                                                     int n, bool accumulate) {
  constexpr int NR = W * NV;
  const int n_panel = n - n % NR;
  const int n_vec = n - n % W;
  int i = 0;
  for (; i + MR <= m; i += MR) {
    const float* ai = a + i * lda;
    float* ci = c + i * ldc;
    for (int j = 0; j < n_panel; j += NR) micro_tile<W, MR, NV>(ai, lda, b + j, ldb, ci + j, ldc, k, accumulate);
    for (int j = n_panel; j < n_vec; j += W) micro_tile<W, MR, 1>(ai, lda, b + j, ldb, ci + j, ldc, k, accumulate);
  }
  for (; i < m; ++i)
    for (int j = 0; j < n_vec; j += W)
      micro_tile<W, 1, 1>(a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, k, accumulate);
  for (int r = 0; r < m; ++r)
    for (int j = n_vec; j < n; ++j) {
      float s = accumulate ? c[r * ldc + j] : 0.f;
      for (int p = 0; p < k; ++p) s += a[r * lda + p] * b[p * ldb + j];
      c[r * ldc + j] = s;
    }
}

}  // namespace
}  // namespace kvq::codec::detail
