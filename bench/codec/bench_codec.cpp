// CPU decode throughput against memcpy on one core, in the same run.
// "Decoded bytes" are the fp32 bytes the decoder writes (T * d * 4); memcpy copies a buffer of the
// same size. Counters: decode_GBps, memcpy_GBps, ratio (goal >= 0.25), packed_GBps (bytes read).
// Cases: TQ-MSE uniform 3 bits d = 128 (full decode, and latent only: what the fused attention
// consumes per key), the low-rank path (r = 64, b = 3 and r = 32, b = 4, d = 128), KIVI V 2 bits,
// Block-GTQ-shaped heads (RoPE blocks at 2/3/4 bits in turn, d = 128) with one fp16 norm per group
// and with compact group norms (--group-norms compact: one 16-bit record, 8 ratio bits), decode
// and encode, so their ratio is read from one run.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <vector>

#include <time.h>

#include "kvq/codec/codec.hpp"
#include "kvq/codec/group_norms.hpp"
#include "kvq/util/rng.hpp"

namespace {

using kvq::CodingKind;
using kvq::HeadDecision;
using kvq::Side;
using kvq::codec::HeadCodec;

// Thread CPU time: the machine is shared, and wall time would charge other processes to us.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

constexpr int kD = 128;
constexpr int kTokens = 16384;  // 8 MiB of fp32 output

std::vector<float> gaussian(size_t n, uint64_t seed) {
  kvq::Rng rng(seed);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(rng.normal());
  return x;
}

// Best-of-N memcpy throughput (GB/s) for a buffer of `bytes`, measured once per size.
double memcpy_gbps(size_t bytes) {
  static std::map<size_t, double> cache;
  auto it = cache.find(bytes);
  if (it != cache.end()) return it->second;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int rep = 0; rep < 30; ++rep) {
    const double t0 = cpu_seconds();
    for (int k = 0; k < 4; ++k) {
      std::memcpy(b.data(), a.data(), bytes);
      benchmark::DoNotOptimize(b.data());
      benchmark::ClobberMemory();
    }
    const double s = cpu_seconds() - t0;
    best = std::max(best, 4.0 * bytes / s / 1e9);
  }
  return cache[bytes] = best;
}

HeadDecision tq(int bits) {
  HeadDecision dec;
  dec.kind = CodingKind::kTqGroups;
  kvq::TqGroup g;
  g.bits = bits;
  g.dims.resize(kD);
  std::iota(g.dims.begin(), g.dims.end(), 0);
  g.rotation_seed = 1;
  dec.groups.push_back(g);
  return dec;
}

HeadDecision lowrank(int r, int bits) {
  HeadDecision dec;
  dec.kind = CodingKind::kLowRankHadamard;
  dec.rank = r;
  dec.bits = bits;
  dec.basis = gaussian(static_cast<size_t>(kD) * r, 2);  // orthonormality does not change speed
  for (float& v : dec.basis) v *= 0.1f;
  dec.mean.assign(kD, 0.f);
  dec.hadamard_seed = 3;
  return dec;
}

HeadDecision kivi_v(int bits) {
  HeadDecision dec;
  dec.kind = CodingKind::kKivi;
  dec.side = Side::kV;
  dec.bits = bits;
  dec.group_size = 32;
  return dec;
}

// RoPE blocks (i, i + d/2) at widths 2, 3, 4 in turn: three groups, as Block-GTQ K forms them.
HeadDecision gtq(bool compact) {
  HeadDecision dec;
  dec.kind = CodingKind::kTqGroups;
  dec.post_rope = true;
  for (int w = 0; w < 3; ++w) {
    kvq::TqGroup g;
    g.bits = 2 + w;
    g.rotation_seed = 10 + static_cast<uint64_t>(w);
    for (int i = w; i < kD / 2; i += 3) g.dims.push_back(i), g.dims.push_back(i + kD / 2);
    dec.groups.push_back(g);
  }
  if (compact) {
    std::vector<float> rows = gaussian(static_cast<size_t>(4096) * kD, 6);
    for (size_t t = 0; t < 4096; ++t)
      for (int i = 0; i < kD; ++i) rows[t * kD + i] *= 1.f + static_cast<float>((i + t) % 5);
    kvq::codec::fit_compact_group_norms(dec, kD, rows.data(), 4096, 8, 7);
  }
  return dec;
}

void run(benchmark::State& state, const HeadDecision& dec, bool latent_only) {
  const HeadCodec codec(dec, kD);
  const std::vector<float> x = gaussian(static_cast<size_t>(kTokens) * kD, 4);
  const std::vector<uint8_t> packed = codec.encode(x.data(), kTokens);
  const size_t out_floats = static_cast<size_t>(kTokens) * (latent_only ? codec.code_dim() : kD);
  std::vector<float> out(out_floats);
  const size_t out_bytes = out_floats * sizeof(float);
  const double mc = memcpy_gbps(out_bytes);
  int64_t iters = 0;
  const double t0 = cpu_seconds();
  for (auto _ : state) {
    if (latent_only) codec.decode_latent(packed.data(), kTokens, out.data());
    else codec.decode(packed.data(), kTokens, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    ++iters;
  }
  const double secs = cpu_seconds() - t0;
  const double gbps = static_cast<double>(out_bytes) * iters / secs / 1e9;
  state.SetBytesProcessed(static_cast<int64_t>(out_bytes) * iters);
  state.counters["decode_GBps"] = gbps;
  state.counters["memcpy_GBps"] = mc;
  state.counters["ratio"] = gbps / mc;
  state.counters["packed_GBps"] = static_cast<double>(packed.size()) * iters / secs / 1e9;
  state.counters["bpd"] = codec.effective_bpd();
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(kTokens) * kD * sizeof(float);
  std::vector<char> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

void BM_DecodeTq3(benchmark::State& s) { run(s, tq(3), false); }
void BM_DecodeTq3Latent(benchmark::State& s) { run(s, tq(3), true); }
void BM_DecodeLowRank64x3(benchmark::State& s) { run(s, lowrank(64, 3), false); }
void BM_DecodeLowRank32x4(benchmark::State& s) { run(s, lowrank(32, 4), false); }
void BM_DecodeKiviV2(benchmark::State& s) { run(s, kivi_v(2), false); }

void BM_DecodeGtqFp16Norms(benchmark::State& s) { run(s, gtq(false), false); }
void BM_DecodeGtqCompactNorms(benchmark::State& s) { run(s, gtq(true), false); }

void encode_bench(benchmark::State& state, const HeadDecision& dec) {
  const HeadCodec codec(dec, kD);
  const int n = 1024;
  const std::vector<float> x = gaussian(static_cast<size_t>(n) * kD, 5);
  std::vector<uint8_t> packed(codec.packed_bytes(n));
  for (auto _ : state) {
    codec.encode(x.data(), n, packed.data());
    benchmark::DoNotOptimize(packed.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(n) * state.iterations());
  state.counters["bpd"] = codec.effective_bpd();
}
void BM_EncodeTq3(benchmark::State& s) { encode_bench(s, tq(3)); }
void BM_EncodeGtqFp16Norms(benchmark::State& s) { encode_bench(s, gtq(false)); }
void BM_EncodeGtqCompactNorms(benchmark::State& s) { encode_bench(s, gtq(true)); }

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMicrosecond)->MeasureProcessCPUTime();
BENCHMARK(BM_DecodeTq3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeTq3Latent)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeLowRank64x3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeLowRank32x4)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeKiviV2)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeGtqFp16Norms)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeGtqCompactNorms)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EncodeTq3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EncodeGtqFp16Norms)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EncodeGtqCompactNorms)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
