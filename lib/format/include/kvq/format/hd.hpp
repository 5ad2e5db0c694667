#pragma once
// KVQ_HD marks a function that the CPU code and the CUDA kernels share: host + device under nvcc,
// plain inline elsewhere.
#if defined(__CUDACC__)
#define KVQ_HD __host__ __device__ __forceinline__
#else
#define KVQ_HD inline
#endif
