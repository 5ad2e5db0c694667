// Decoder bandwidth on the GPU: bytes moved (packed in + fp32 out) per second against the device's
// peak DRAM bandwidth. Skips without a GPU.
#include <benchmark/benchmark.h>

#include <numeric>
#include <random>

#include "kvq/cuda/cuda.hpp"

namespace {

kvq::HeadDecision decision(int kind, int d, int bits) {
  kvq::HeadDecision dec;
  if (kind == 0) {  // uniform TQ-MSE, one group
    dec.kind = kvq::CodingKind::kTqGroups;
    kvq::TqGroup g;
    g.bits = bits;
    g.dims.resize(size_t(d));
    std::iota(g.dims.begin(), g.dims.end(), 0);
    g.rotation_seed = 7;
    dec.groups.push_back(g);
  } else {  // low rank r = d/2 + Hadamard
    dec.kind = kvq::CodingKind::kLowRankHadamard;
    dec.rank = d / 2;
    dec.bits = bits;
    dec.budget_bits = dec.rank * bits;
    dec.hadamard_seed = 3;
    dec.basis.assign(size_t(d) * size_t(dec.rank), 0.f);
    for (int j = 0; j < dec.rank; ++j) dec.basis[size_t(j) * size_t(dec.rank) + size_t(j)] = 1.f;
    dec.mean.assign(size_t(d), 0.f);
  }
  return dec;
}

void decode_bandwidth(benchmark::State& st, int kind) {
  if (!kvq_cuda_available()) {
    st.SkipWithError("no CUDA device");
    return;
  }
  const int d = 128, bits = int(st.range(0)), T = 1 << 20;
  kvq::codec::HeadCodec c(decision(kind, d, bits), d);
  std::mt19937 g(1);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x(size_t(T) * d);
  for (auto& v : x) v = n(g);
  auto packed = c.encode(x.data(), T);
  kvq::cuda::DeviceHead dev(c);
  const double peak = kvq::cuda::device_peak_bandwidth_gbps();
  kvq::cuda::DecodeTiming t;
  for (auto _ : st) {
    t = kvq::cuda::time_decode(dev, packed.data(), T, 20);
    st.SetIterationTime(t.ms_per_launch / 1e3);
  }
  st.counters["GB/s"] = t.gbytes_per_s();
  st.counters["peak_GB/s"] = peak;
  st.counters["fraction_of_peak"] = t.gbytes_per_s() / peak;
  st.SetLabel(kvq::cuda::device_name());
}

}  // namespace

BENCHMARK_CAPTURE(decode_bandwidth, tq_mse, 0)->Arg(2)->Arg(3)->Arg(4)->UseManualTime()->Iterations(3);
BENCHMARK_CAPTURE(decode_bandwidth, lowrank_hadamard, 1)->Arg(2)->Arg(4)->UseManualTime()->Iterations(3);
BENCHMARK_MAIN();
