// One decode step of fused attention over the GPU-resident packed cache (kvq/cuda/kv_cache.hpp)
// at the papers' shapes: Llama-3.1-8B (32 query / 8 KV heads, d 128) and Qwen2.5-3B (16 / 2,
// d 128), T in {8K, 32K, 128K, 512K}, batch 1 and 16, for uniform TQ K3V3 and K2V2, Block-GTQ
// mixed widths {2,3,4} with compact norms (3.125 bpd, as uniform K3), KV-COBRA low rank r16 b4
// (pre-RoPE keys, rotated on the fly) with TQ V3, KIVI 2-bit, and FP8 E4M3 / NVFP4 on both sides
// (T up to 128K: 8 and 4.5 bits per value). The L2 is flushed (a 512 MiB
// write) before every timed call; each call is timed alone with CUDA events. Counters: us per
// step, GB/s of the packed bytes the step must read (K and V of every attended token, q and out),
// the fraction of the device's peak DRAM bandwidth and of a measured device-to-device copy.
// Shapes that do not fit in the device's memory are skipped. Also: the decoder to fp32, and
// (with the GPU encoder, KVQ_HAVE_GPU_ENCODER) one append step. Skips without a GPU.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <memory>
#include <numeric>
#include <random>
#include <string>

#include "kvq/codec/codec.hpp"
#include "kvq/codec/group_norms.hpp"
#include "kvq/cuda/cuda.hpp"
#include "kvq/cuda/kv_cache.hpp"

namespace {

using kvq::CodingKind;
using kvq::HeadDecision;
using kvq::Side;

constexpr int kD = 128;

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = nd(g);
  return x;
}

// Uniform TQ and KIVI keys are cached post-RoPE, as serving engines cache them (and as Block-GTQ
// does); only the low-rank keys are pre-RoPE (KV-COBRA's basis is of pre-RoPE keys) and take the
// kernel's rotate-on-the-fly path.
HeadDecision tq(int bits, uint64_t seed, Side side) {
  HeadDecision dec;
  dec.side = side;
  dec.post_rope = true;
  dec.kind = CodingKind::kTqGroups;
  kvq::TqGroup g;
  g.bits = bits;
  g.dims.resize(kD);
  std::iota(g.dims.begin(), g.dims.end(), 0);
  g.rotation_seed = seed;
  dec.groups.push_back(g);
  return dec;
}

// Block-GTQ-shaped: split-half RoPE blocks given widths 2, 3, 4 in turn (3 bits on average), one
// group per width, post-RoPE, compact group norms (8 ratio bits) fitted to Gaussian rows.
HeadDecision gtq_compact(uint64_t seed) {
  HeadDecision dec;
  dec.kind = CodingKind::kTqGroups;
  dec.post_rope = true;
  const int nb = kD / 2;
  for (int w = 0; w < 3; ++w) {
    kvq::TqGroup g;
    g.bits = 2 + w;
    g.rotation_seed = seed + static_cast<uint64_t>(w);
    for (int i = w; i < nb; i += 3) {
      g.dims.push_back(i);
      g.dims.push_back(i + nb);
    }
    dec.groups.push_back(g);
  }
  dec.block_bits.resize(static_cast<size_t>(nb));
  const std::vector<float> x = gaussian(512 * kD, 11);
  kvq::codec::fit_compact_group_norms(dec, kD, x.data(), 512, 8, seed);
  return dec;
}

HeadDecision lowrank(int rank, int bits, uint64_t seed) {
  HeadDecision dec;
  dec.kind = CodingKind::kLowRankHadamard;
  dec.post_rope = false;
  dec.rank = rank;
  dec.bits = bits;
  dec.budget_bits = rank * bits;
  dec.basis.assign(static_cast<size_t>(kD) * rank, 0.f);
  for (int j = 0; j < rank; ++j) dec.basis[static_cast<size_t>(j) * rank + j] = 1.f;
  dec.mean.assign(kD, 0.f);
  dec.hadamard_seed = seed;
  return dec;
}

HeadDecision kivi(Side side, int bits) {
  HeadDecision dec;
  dec.side = side;
  dec.post_rope = true;
  dec.kind = CodingKind::kKivi;
  dec.bits = bits;
  dec.group_size = 32;
  return dec;
}

HeadDecision minifloat(kvq::MinifloatFormat f, Side side) {
  HeadDecision dec;
  dec.side = side;
  dec.post_rope = true;
  dec.kind = CodingKind::kMinifloat;
  dec.minifloat = f;
  dec.scale = f == kvq::MinifloatFormat::kFp8E4M3 ? 1.f / 64 : 0.003f;  // Gaussian rows, no saturation
  return dec;
}

enum Mix { kTqK3V3, kTqK2V2, kGtqCompact, kLowRankR16, kKivi2, kFp8, kNvfp4, kNumMixes };
const char* mix_name(int m) {
  static const char* n[] = {"tq_k3v3", "tq_k2v2", "gtq_compact_3bpd", "lowrank_r16b4_tqv3", "kivi2", "fp8", "nvfp4"};
  return n[m];
}
std::pair<HeadDecision, HeadDecision> mix(int m, int h) {
  const uint64_t s = 7 + static_cast<uint64_t>(h);
  switch (m) {
    case kTqK3V3: return {tq(3, s, Side::kK), tq(3, s + 100, Side::kV)};
    case kTqK2V2: return {tq(2, s, Side::kK), tq(2, s + 100, Side::kV)};
    case kGtqCompact: return {gtq_compact(s), tq(3, s + 100, Side::kV)};
    case kLowRankR16: return {lowrank(16, 4, s), tq(3, s + 100, Side::kV)};
    case kFp8: return {minifloat(kvq::MinifloatFormat::kFp8E4M3, Side::kK), minifloat(kvq::MinifloatFormat::kFp8E4M3, Side::kV)};
    case kNvfp4: return {minifloat(kvq::MinifloatFormat::kNvfp4, Side::kK), minifloat(kvq::MinifloatFormat::kNvfp4, Side::kV)};
    default: return {kivi(Side::kK, 2), kivi(Side::kV, 2)};
  }
}

struct Gpu {
  double peak = 0, copy = 0;  // GB/s
  std::string name;
  void* flush = nullptr;
  static constexpr size_t kFlushBytes = 512u << 20;
  Gpu() {
    peak = kvq::cuda::device_peak_bandwidth_gbps();
    name = kvq::cuda::device_name();
    cudaMalloc(&flush, kFlushBytes);
    // Device-to-device copy bandwidth: 1 GiB, bytes read + written, best of 5.
    const size_t n = 1u << 30;
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, n) == cudaSuccess && cudaMalloc(&b, n) == cudaSuccess) {
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
      float best = 1e30f;
      for (int i = 0; i < 5; ++i) {
        cudaEventRecord(e0);
        cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        best = std::min(best, ms);
      }
      copy = 2.0 * double(n) / (double(best) * 1e6);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
    cudaFree(a);
    cudaFree(b);
    cudaGetLastError();
  }
  void flush_l2(cudaStream_t s) const { cudaMemsetAsync(flush, static_cast<int>(++flushes & 0xff), kFlushBytes, s); }
  mutable unsigned flushes = 0;
};
const Gpu& gpu() {
  static const Gpu g;
  return g;
}

// Fills every sequence with T tokens: a 4096-token chunk coded on the CPU, repeated.
void fill(kvq::cuda::PackedKvCache& cache, const kvq::cuda::KvCacheSpec& spec, int T) {
  const int chunk = std::min(T, 4096);
  const int n_kv = spec.n_kv_heads;
  std::vector<std::vector<uint8_t>> kb(static_cast<size_t>(n_kv)), vb(kb.size());
  for (int h = 0; h < n_kv; ++h)
    for (int side = 0; side < 2; ++side) {
      const kvq::codec::HeadCodec& c = side ? spec.layers[0].v[static_cast<size_t>(h)] : spec.layers[0].k[static_cast<size_t>(h)];
      const std::vector<float> x = gaussian(static_cast<size_t>(chunk) * kD, 100 + 2 * h + side);
      const std::vector<uint8_t> one = c.encode(x.data(), chunk);
      std::vector<uint8_t>& all = side ? vb[static_cast<size_t>(h)] : kb[static_cast<size_t>(h)];
      all.resize(c.packed_bytes(T));
      for (size_t o = 0; o < all.size(); o += one.size()) std::copy_n(one.begin(), std::min(one.size(), all.size() - o), all.begin() + o);
    }
  std::vector<const uint8_t*> kp, vp;
  for (int h = 0; h < n_kv; ++h) {
    kp.push_back(kb[static_cast<size_t>(h)].data());
    vp.push_back(vb[static_cast<size_t>(h)].data());
  }
  for (int b = 0; b < spec.batch; ++b) cache.load(0, b, kp, vp, T);
}

// args: n_q, n_kv, T, batch, mix
void attention_step(benchmark::State& st) {
  if (!kvq_cuda_available()) {
    st.SkipWithError("no CUDA device");
    return;
  }
  const int n_q = int(st.range(0)), n_kv = int(st.range(1)), T = int(st.range(2)), B = int(st.range(3)), m = int(st.range(4));
  kvq::cuda::KvCacheSpec spec;
  spec.n_q_heads = n_q, spec.n_kv_heads = n_kv, spec.head_dim = kD, spec.batch = B, spec.capacity = T;
  spec.rope = kvq::codec::RopeSpec{true, 500000.0, 0, kvq::RopePairing::kSplitHalf, {}, 1.0};
  kvq::cuda::KvCacheLayer layer;
  size_t step_bytes = 0;
  for (int h = 0; h < n_kv; ++h) {
    auto [k, v] = mix(m, h);
    layer.k.emplace_back(k, kD);
    layer.v.emplace_back(v, kD);
    step_bytes += layer.k.back().packed_bytes(T) + layer.v.back().packed_bytes(T);
  }
  step_bytes *= static_cast<size_t>(B);
  spec.layers.push_back(layer);
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  if (step_bytes + (1u << 30) > free_b) {
    st.SkipWithError(("needs " + std::to_string(step_bytes >> 20) + " MiB, " + std::to_string(free_b >> 20) + " free").c_str());
    return;
  }
  kvq::cuda::PackedKvCache cache(spec);
  fill(cache, spec, T);
  const size_t qn = static_cast<size_t>(B) * n_q * kD;
  float *q = nullptr, *out = nullptr;
  cudaMalloc(&q, qn * sizeof(float));
  cudaMalloc(&out, qn * sizeof(float));
  const std::vector<float> qh = gaussian(qn, 3);
  cudaMemcpy(q, qh.data(), qn * sizeof(float), cudaMemcpyHostToDevice);
  const Gpu& g = gpu();
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cache.attend(0, q, out, s);  // warm-up (module load)
  cudaStreamSynchronize(s);
  double total_ms = 0;
  int64_t n = 0;
  for (auto _ : st) {
    g.flush_l2(s);
    cudaEventRecord(e0, s);
    cache.attend(0, q, out, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    st.SetIterationTime(double(ms) / 1e3);
    total_ms += ms;
    ++n;
  }
  if (cudaGetLastError() != cudaSuccess) st.SkipWithError("CUDA error");
  const double bytes = double(step_bytes) + 2.0 * double(qn) * sizeof(float);
  const double us = n ? total_ms * 1e3 / double(n) : 0;  // mean over the timed calls
  const double gbps = us > 0 ? bytes / (us * 1e3) : 0;
  st.counters["us"] = us;
  st.counters["GB/s"] = gbps;
  st.counters["of_peak"] = gbps / g.peak;
  st.counters["of_copy"] = g.copy > 0 ? gbps / g.copy : 0;
  st.counters["MB"] = bytes / 1e6;
  st.SetLabel(std::string(mix_name(m)) + " " + g.name + " peak " + std::to_string(int(g.peak)) + " copy " +
              std::to_string(int(g.copy)) + " GB/s");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  cudaFree(q);
  cudaFree(out);
}

void attention_args(benchmark::internal::Benchmark* b) {
  for (int model = 0; model < 2; ++model)
    for (int m = 0; m < kNumMixes; ++m)
      for (int T : {8192, 32768, 131072, 524288})
        for (int B : {1, 16}) {
          if (m >= kFp8 && T > 131072) continue;  // 2-3x the bytes of the 3-bit mixes
          if (model == 0) b->Args({32, 8, T, B, m});
          else b->Args({16, 2, T, B, m});
        }
  b->ArgNames({"n_q", "n_kv", "T", "batch", "mix"});
}

// The decoder to fp32 (DeviceHead::decode's kernel), 1M tokens: 50-130 MB in, 512 MB out, so the
// L2 holds nothing of it between launches.
void decode_to_fp32(benchmark::State& st) {
  if (!kvq_cuda_available()) {
    st.SkipWithError("no CUDA device");
    return;
  }
  const int T = 1 << 20, m = int(st.range(0));
  kvq::codec::HeadCodec c(mix(m, 0).second, kD);
  const std::vector<float> x = gaussian(size_t(4096) * kD, 5);
  const std::vector<uint8_t> one = c.encode(x.data(), 4096);
  std::vector<uint8_t> packed(c.packed_bytes(T));
  for (size_t o = 0; o < packed.size(); o += one.size()) std::copy_n(one.begin(), std::min(one.size(), packed.size() - o), packed.begin() + o);
  kvq::cuda::DeviceHead dev(c);
  kvq::cuda::DecodeTiming t;
  for (auto _ : st) {
    t = kvq::cuda::time_decode(dev, packed.data(), T, 10);
    st.SetIterationTime(t.ms_per_launch / 1e3);
  }
  st.counters["GB/s"] = t.gbytes_per_s();
  st.counters["of_peak"] = t.gbytes_per_s() / gpu().peak;
  st.counters["of_copy"] = t.gbytes_per_s() / gpu().copy;
  st.SetLabel(std::string(mix_name(m)) + " V");
}

#ifdef KVQ_HAVE_GPU_ENCODER
// One append step: every sequence's new token, every KV head of one layer, coded on the GPU and
// written (Llama-3.1-8B's 8 KV heads; KIVI K re-encodes its open group). Each call timed alone.
void append_step(benchmark::State& st) {
  if (!kvq_cuda_available()) {
    st.SkipWithError("no CUDA device");
    return;
  }
  const int B = int(st.range(0)), m = int(st.range(1)), n_kv = 8;
  kvq::cuda::KvCacheSpec spec;
  spec.n_q_heads = 32, spec.n_kv_heads = n_kv, spec.head_dim = kD, spec.batch = B, spec.capacity = 4096;
  kvq::cuda::KvCacheLayer layer;
  for (int h = 0; h < n_kv; ++h) {
    auto [k, v] = mix(m, h);
    layer.k.emplace_back(k, kD);
    layer.v.emplace_back(v, kD);
  }
  spec.layers.push_back(layer);
  kvq::cuda::PackedKvCache cache(spec);
  const size_t n = static_cast<size_t>(B) * n_kv * kD;
  float *k = nullptr, *v = nullptr;
  cudaMalloc(&k, n * sizeof(float));
  cudaMalloc(&v, n * sizeof(float));
  const std::vector<float> xh = gaussian(n, 9);
  cudaMemcpy(k, xh.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(v, xh.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cache.append(0, k, v, s);  // warm-up
  for (auto _ : st) {
    cudaEventRecord(e0, s);
    cache.append(0, k, v, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    st.SetIterationTime(double(ms) / 1e3);
  }
  st.SetLabel(mix_name(m));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  cudaFree(k);
  cudaFree(v);
}
BENCHMARK(append_step)->ArgsProduct({{1, 16}, {0, 2, 3, 4, 5}})->UseManualTime()->Iterations(200)->Unit(benchmark::kMicrosecond);
#endif

}  // namespace

BENCHMARK(attention_step)->Apply(attention_args)->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_to_fp32)->DenseRange(0, kNumMixes - 1)->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
