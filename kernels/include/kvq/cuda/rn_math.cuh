#pragma once
// IEEE operations with one rounding each, never fused: the GPU encoder replicates the CPU encoder's
// float and double operations exactly (g++ on x86-64 without -mfma never fuses; nvcc contracts
// a * b + c into an FMA unless told not to). On the device these are the __*_rn intrinsics; in a
// host compilation (the CPU emulation in tests/cuda) the plain operators, which round the same way
// there.
#include <stdint.h>
#include <math.h>
#include <string.h>
#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace kvq::cuda::detail {

#if defined(__CUDA_ARCH__)
__device__ inline float rn_add(float a, float b) { return __fadd_rn(a, b); }
__device__ inline float rn_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ inline float rn_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float rn_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline double rn_add(double a, double b) { return __dadd_rn(a, b); }
__device__ inline double rn_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ inline double rn_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ inline double rn_sqrt(double a) { return __dsqrt_rn(a); }
__device__ inline float rn_to_float(double a) { return __double2float_rn(a); }
__device__ inline uint64_t double_bits(double a) { return (uint64_t)__double_as_longlong(a); }
#else
__device__ inline float rn_add(float a, float b) { return a + b; }
__device__ inline float rn_sub(float a, float b) { return a - b; }
__device__ inline float rn_mul(float a, float b) { return a * b; }
__device__ inline float rn_div(float a, float b) { return a / b; }
__device__ inline double rn_add(double a, double b) { return a + b; }
__device__ inline double rn_mul(double a, double b) { return a * b; }
__device__ inline double rn_div(double a, double b) { return a / b; }
__device__ inline double rn_sqrt(double a) { return sqrt(a); }
__device__ inline float rn_to_float(double a) { return (float)a; }
__device__ inline uint64_t double_bits(double a) {
  uint64_t u;
  memcpy(&u, &a, sizeof u);
  return u;
}
#endif

}  // namespace kvq::cuda::detail
