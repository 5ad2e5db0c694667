#include "small_gemm.hpp"

// Built with -ffp-contract=off (lib/codec/CMakeLists.txt): no FMA anywhere, so every ISA variant
// rounds each product and each sum exactly like the baseline one.
#include "small_gemm_impl.hpp"

namespace kvq::codec::detail {
namespace {

void exact_baseline(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m,
                   int k, int n, bool accumulate) {
  gemm_body<4, 6, 2>(a, lda, b, ldb, c, ldc, m, k, n, accumulate);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVQ_GEMM_DISPATCH 1
__attribute__((target("avx2"))) void exact_avx2(const float* a, int lda, const float* b, int ldb,
                                                   float* c, int ldc, int m, int k, int n,
                                                   bool accumulate) {
  gemm_body<8, 6, 2>(a, lda, b, ldb, c, ldc, m, k, n, accumulate);
}
__attribute__((target("avx512f"))) void exact_avx512(const float* a, int lda, const float* b,
                                                        int ldb, float* c, int ldc, int m, int k,
                                                        int n, bool accumulate) {
  gemm_body<16, 8, 2>(a, lda, b, ldb, c, ldc, m, k, n, accumulate);
}
#endif

using GemmFn = void (*)(const float*, int, const float*, int, float*, int, int, int, int, bool);

GemmFn pick() {
#ifdef KVQ_GEMM_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return exact_avx512;
  if (__builtin_cpu_supports("avx2")) return exact_avx2;
#endif
  return exact_baseline;
}

}  // namespace

void small_gemm_exact(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int m, int k,
                int n, bool accumulate) {
  static const GemmFn fn = pick();
  fn(a, lda, b, ldb, c, ldc, m, k, n, accumulate);
}

}  // namespace kvq::codec::detail
