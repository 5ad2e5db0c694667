// This machine's fp32 (and BF16) GEMM rate through LibTorch (the forward's GEMMs go through the same call),
// at the shapes of a 1B/8B layer's projections: the peak the streamed forward's GFLOP/s is held
// against. Counter GFLOPs = 2 M N K per second.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "kvq/model/model.hpp"

static void BM_GemmFp32(benchmark::State& st) {
  kvq::set_threads(0);
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  const at::Tensor a = at::randn({M, K}), b = at::randn({N, K});
  at::Tensor c = at::empty({M, N});
  for (auto _ : st) {
    at::mm_out(c, a, b.t());
    benchmark::DoNotOptimize(c.data_ptr<float>());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * double(M) * double(N) * double(K) * 1e-9,
                                             benchmark::Counter::kIsIterationInvariantRate);
}
// Tokens x (out features) x (in features): the 1B's gate/up and the 8B's, at 2048 tokens.
BENCHMARK(BM_GemmFp32)->Args({2048, 16384, 2048})->Args({2048, 6144, 4096})->Args({2048, 4096, 4096})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

// The same products as the BF16 forward runs them (model/parts/forward_kernels.cpp's linear): BF16
// operands, fp32 accumulation inside oneDNN, a BF16 product. The peak the --precision bf16
// forward's GFLOP/s is held against.
static void BM_GemmBf16(benchmark::State& st) {
  kvq::set_threads(0);
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  const at::Tensor a = at::randn({M, K}).to(at::kBFloat16), b = at::randn({N, K}).to(at::kBFloat16);
  at::Tensor c = at::empty({M, N}, at::kBFloat16);
  for (auto _ : st) {
    at::mm_out(c, a, b.t());
    benchmark::DoNotOptimize(c.data_ptr());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * double(M) * double(N) * double(K) * 1e-9,
                                             benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GemmBf16)->Args({2048, 16384, 2048})->Args({2048, 6144, 4096})->Args({2048, 4096, 4096})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
