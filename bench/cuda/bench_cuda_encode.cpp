// The GPU encoder (kvq/cuda/encode.hpp) on the GPU, timed with CUDA events. Skips without a GPU.
//  - layer_append: one new token for every (KV head, side) of one layer (8 KV heads, d = 128:
//    Llama-3.1-8B's shape), the decode step's append: 16 encode_async launches, plain on a stream
//    ("stream_us") and replayed from a captured CUDA graph ("graph_us"), and one encode_batch_async
//    launch for all 16 ("batch_us", the manual time; "batch_graph_us" from a graph). Goal (issue
//    24): <= 10 us.
//  - bulk_32k: one head, 32,768 tokens (a prompt's prefill); bytes = fp32 in + packed out, against
//    the device's peak DRAM bandwidth.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "kvq/codec/group_norms.hpp"
#include "kvq/cuda/cuda.hpp"
#include "kvq/cuda/encode.hpp"
#include "kvq/cuda/encode_batch.hpp"

namespace {

constexpr int kD = 128, kKvHeads = 8;

#define BENCH_CUDA(call)                                                           \
  do {                                                                             \
    const cudaError_t e_ = (call);                                                 \
    if (e_ != cudaSuccess) throw std::runtime_error(#call + std::string(": ") + cudaGetErrorString(e_)); \
  } while (0)

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(g);
  return x;
}

kvq::HeadDecision tq(int bits, kvq::Side side) {
  kvq::HeadDecision dec;
  dec.kind = kvq::CodingKind::kTqGroups;
  dec.side = side;
  kvq::TqGroup g;
  g.bits = bits;
  g.dims.resize(kD);
  std::iota(g.dims.begin(), g.dims.end(), 0);
  g.rotation_seed = 7;
  dec.groups.push_back(g);
  return dec;
}

// Block-GTQ shape: RoPE pairs (i, i + d/2) given widths 2, 3, 4 in turn (3 bpd), compact norms.
kvq::HeadDecision gtq_compact() {
  kvq::HeadDecision dec;
  dec.kind = kvq::CodingKind::kTqGroups;
  dec.post_rope = true;
  const int widths[3] = {2, 3, 4};
  for (int w = 0; w < 3; ++w) {
    kvq::TqGroup g;
    g.bits = widths[w];
    g.rotation_seed = 40 + static_cast<uint64_t>(w);
    for (int i = w; i < kD / 2; i += 3) {
      g.dims.push_back(i);
      g.dims.push_back(i + kD / 2);
    }
    dec.groups.push_back(g);
  }
  dec.block_bits.resize(kD / 2);
  const std::vector<float> x = gaussian(size_t(512) * kD, 3);
  kvq::codec::fit_compact_group_norms(dec, kD, x.data(), 512, 8, 5);
  return dec;
}

kvq::HeadDecision lowrank(int r, int bits) {
  kvq::HeadDecision dec;
  dec.kind = kvq::CodingKind::kLowRankHadamard;
  dec.rank = r;
  dec.bits = bits;
  dec.budget_bits = r * bits;
  dec.hadamard_seed = 3;
  dec.basis.assign(size_t(kD) * size_t(r), 0.f);
  for (int j = 0; j < r; ++j) dec.basis[size_t(j) * size_t(r) + size_t(j)] = 1.f;
  dec.mean.assign(size_t(kD), 0.f);
  return dec;
}

kvq::HeadDecision kivi(kvq::Side side, int bits) {
  kvq::HeadDecision dec;
  dec.kind = kvq::CodingKind::kKivi;
  dec.side = side;
  dec.bits = bits;
  dec.group_size = 32;
  return dec;
}

kvq::HeadDecision fp8() {
  kvq::HeadDecision dec;
  dec.kind = kvq::CodingKind::kMinifloat;
  dec.minifloat = kvq::MinifloatFormat::kFp8E4M3;
  dec.scale = 0.01f;
  return dec;
}

// {K, V} decisions of a mix.
std::pair<kvq::HeadDecision, kvq::HeadDecision> mix(int m) {
  switch (m) {
    case 0: return {tq(3, kvq::Side::kK), tq(3, kvq::Side::kV)};
    case 1: return {tq(2, kvq::Side::kK), tq(2, kvq::Side::kV)};
    case 2: return {gtq_compact(), tq(3, kvq::Side::kV)};
    case 3: return {lowrank(16, 4), tq(3, kvq::Side::kV)};
    case 4: return {kivi(kvq::Side::kK, 2), kivi(kvq::Side::kV, 2)};
    default: return {fp8(), fp8()};
  }
}
const char* kMixNames[] = {"tq_k3v3", "tq_k2v2", "gtq_mixed_compact", "lowrank_r16b4_tqv3", "kivi2", "fp8"};

// Mean milliseconds of `reps` calls of f between two events on stream st.
template <class F>
double time_ms(cudaStream_t st, int reps, F&& f) {
  f();  // warm-up
  BENCH_CUDA(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  BENCH_CUDA(cudaEventRecord(a, st));
  for (int i = 0; i < reps; ++i) f();
  BENCH_CUDA(cudaEventRecord(b, st));
  BENCH_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / reps;
}

void layer_append(benchmark::State& st) {
  if (!kvq_cuda_available()) {
    st.SkipWithError("no CUDA device");
    return;
  }
  const auto [kd, vd] = mix(int(st.range(0)));
  const kvq::codec::HeadCodec kc(kd, kD), vc(vd, kD);
  const kvq::cuda::DeviceHead kdev(kc), vdev(vc);
  const std::vector<float> x = gaussian(size_t(2 * kKvHeads) * kD, 1);
  float* dx = nullptr;
  uint8_t* dout = nullptr;
  const size_t kb = kc.packed_bytes(1), vb = vc.packed_bytes(1);
  BENCH_CUDA(cudaMalloc(&dx, x.size() * sizeof(float)));
  BENCH_CUDA(cudaMalloc(&dout, kKvHeads * (kb + vb)));
  BENCH_CUDA(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreate(&s));
  auto step = [&] {
    for (int h = 0; h < kKvHeads; ++h) {
      kvq::cuda::encode_async(kdev, dx + size_t(2 * h) * kD, 1, dout + size_t(h) * (kb + vb), s);
      kvq::cuda::encode_async(vdev, dx + size_t(2 * h + 1) * kD, 1, dout + size_t(h) * (kb + vb) + kb, s);
    }
  };
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  step();
  BENCH_CUDA(cudaStreamEndCapture(s, &graph));
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  // The same 16 encodes as one batch launch.
  std::vector<kvq::cuda::EncodeJob> jobs;
  for (int h = 0; h < kKvHeads; ++h) {
    jobs.push_back({kvq::cuda::device_view(kdev), dx + size_t(2 * h) * kD, dout + size_t(h) * (kb + vb)});
    jobs.push_back({kvq::cuda::device_view(vdev), dx + size_t(2 * h + 1) * kD, dout + size_t(h) * (kb + vb) + kb});
  }
  kvq::cuda::EncodeJob* djobs = nullptr;
  BENCH_CUDA(cudaMalloc(&djobs, jobs.size() * sizeof(jobs[0])));
  BENCH_CUDA(cudaMemcpy(djobs, jobs.data(), jobs.size() * sizeof(jobs[0]), cudaMemcpyHostToDevice));
  auto batch = [&] { kvq::cuda::encode_batch_async(djobs, int(jobs.size()), 1, s); };
  cudaGraph_t bgraph;
  cudaGraphExec_t bexec;
  BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  batch();
  BENCH_CUDA(cudaStreamEndCapture(s, &bgraph));
  BENCH_CUDA(cudaGraphInstantiate(&bexec, bgraph, 0));
  double stream_ms = 0, graph_ms = 0, batch_ms = 0, batch_graph_ms = 0;
  for (auto _ : st) {
    stream_ms = time_ms(s, 200, step);
    graph_ms = time_ms(s, 200, [&] { BENCH_CUDA(cudaGraphLaunch(exec, s)); });
    batch_ms = time_ms(s, 200, batch);
    batch_graph_ms = time_ms(s, 200, [&] { BENCH_CUDA(cudaGraphLaunch(bexec, s)); });
    st.SetIterationTime(batch_ms / 1e3);
  }
  st.counters["stream_us"] = stream_ms * 1e3;
  st.counters["graph_us"] = graph_ms * 1e3;
  st.counters["batch_us"] = batch_ms * 1e3;
  st.counters["batch_graph_us"] = batch_graph_ms * 1e3;
  cudaGraphExecDestroy(bexec);
  cudaGraphDestroy(bgraph);
  cudaFree(djobs);
  st.SetLabel(std::string(kMixNames[st.range(0)]) + " " + kvq::cuda::device_name());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  cudaFree(dx);
  cudaFree(dout);
}

void bulk_32k(benchmark::State& st) {
  if (!kvq_cuda_available()) {
    st.SkipWithError("no CUDA device");
    return;
  }
  const int T = 32768;
  const auto kd = mix(int(st.range(0))).first;
  const kvq::codec::HeadCodec c(kd, kD);
  const kvq::cuda::DeviceHead dev(c);
  const std::vector<float> x = gaussian(size_t(T) * kD, 2);
  float* dx = nullptr;
  uint8_t* dout = nullptr;
  const size_t ob = c.packed_bytes(T);
  BENCH_CUDA(cudaMalloc(&dx, x.size() * sizeof(float)));
  BENCH_CUDA(cudaMalloc(&dout, ob));
  BENCH_CUDA(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreate(&s));
  double ms = 0;
  for (auto _ : st) {
    ms = time_ms(s, 20, [&] { kvq::cuda::encode_async(dev, dx, T, dout, s); });
    st.SetIterationTime(ms / 1e3);
  }
  const double bytes = double(x.size() * sizeof(float) + ob);
  const double gbs = bytes / (ms * 1e6);
  st.counters["us"] = ms * 1e3;
  st.counters["GB/s"] = gbs;
  st.counters["fraction_of_peak"] = gbs / kvq::cuda::device_peak_bandwidth_gbps();
  st.SetLabel(std::string(kMixNames[st.range(0)]) + " K head " + kvq::cuda::device_name());
  cudaStreamDestroy(s);
  cudaFree(dx);
  cudaFree(dout);
}

}  // namespace

BENCHMARK(layer_append)->DenseRange(0, 5)->UseManualTime()->Iterations(3);
BENCHMARK(bulk_32k)->DenseRange(0, 5)->UseManualTime()->Iterations(3);
BENCHMARK_MAIN();
