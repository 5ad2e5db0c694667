// The GPU-resident packed cache (kvq/cuda/kv_cache.hpp) and its fused attention against the CPU
// reference codec::reference_decode_attention, one problem per sequence. Every test skips
// without a GPU (the binary always builds and links). Tolerance, per sequence (as
// test_cuda_codec.cpp): |gpu - cpu| <= 2e-4 * (1 + max |cpu out|). Appended codes are compared
// byte for byte.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/cuda/cuda.hpp"
#include "kvq/cuda/kv_cache.hpp"
#include "kvq/util/error.hpp"
#include "test_util.hpp"

namespace kvq::cuda {
namespace {

using codec::HeadCodec;
namespace t = codec::test;

#define REQUIRE_GPU() \
  if (!kvq_cuda_available()) GTEST_SKIP() << "no CUDA device (the kernels still compiled and linked)"

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

template <class T>
struct Dev {
  T* p = nullptr;
  explicit Dev(size_t n) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  void put(const std::vector<T>& v) { EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

HeadDecision minifloat(MinifloatFormat f, float scale, Side side) {
  HeadDecision x;
  x.side = side;
  x.kind = CodingKind::kMinifloat;
  x.minifloat = f;
  x.scale = scale;
  return x;
}

struct CacheCase {
  std::string name;
  int d, n_q, n_kv;
  std::vector<int> lengths;
  std::function<HeadDecision(int)> k, v;
  bool rope = false;
  int window = 0;
  int capacity = 0;
};

// The cache's sequences as host data: fp32 rows and their CPU codes, kept for the reference.
struct Host {
  std::vector<HeadCodec> kc, vc;
  std::vector<std::vector<float>> kx, vx;  // [b * n_kv + h], [len][d]
};

KvCacheSpec make_spec(const CacheCase& s, Host& host) {
  KvCacheSpec spec;
  spec.n_q_heads = s.n_q, spec.n_kv_heads = s.n_kv, spec.head_dim = s.d;
  spec.batch = static_cast<int>(s.lengths.size());
  spec.capacity = s.capacity;
  spec.rope = codec::RopeSpec{s.rope, 10000.0, 0, RopePairing::kSplitHalf, {}, 1.0};
  KvCacheLayer layer;
  for (int h = 0; h < s.n_kv; ++h) {
    host.kc.emplace_back(s.k(h), s.d);
    host.vc.emplace_back(s.v(h), s.d);
  }
  layer.k = host.kc;
  layer.v = host.vc;
  layer.window = s.window;
  spec.layers.push_back(layer);
  return spec;
}

// Reference output of sequence b over its host rows; positions = the token index.
std::vector<float> reference(const CacheCase& s, const Host& host, int b, const float* q) {
  codec::AttentionProblem p;
  const int T = static_cast<int>(host.kx[static_cast<size_t>(b * s.n_kv)].size() / s.d);
  p.n_q_heads = s.n_q, p.n_kv_heads = s.n_kv, p.head_dim = s.d, p.n_tokens = T, p.window = s.window;
  p.q = q;
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int i = 0; i < T; ++i) pos[static_cast<size_t>(i)] = i;
  p.positions = pos.data();
  p.rope = codec::RopeSpec{s.rope, 10000.0, 0, RopePairing::kSplitHalf, {}, 1.0};
  std::vector<std::vector<uint8_t>> kp, vp;
  for (int h = 0; h < s.n_kv; ++h) {
    kp.push_back(host.kc[static_cast<size_t>(h)].encode(host.kx[static_cast<size_t>(b * s.n_kv + h)].data(), T));
    vp.push_back(host.vc[static_cast<size_t>(h)].encode(host.vx[static_cast<size_t>(b * s.n_kv + h)].data(), T));
    p.k_codecs.push_back(&host.kc[static_cast<size_t>(h)]);
    p.v_codecs.push_back(&host.vc[static_cast<size_t>(h)]);
  }
  for (int h = 0; h < s.n_kv; ++h) {
    p.k_packed.push_back(kp[static_cast<size_t>(h)].data());
    p.v_packed.push_back(vp[static_cast<size_t>(h)].data());
  }
  std::vector<float> out(static_cast<size_t>(s.n_q) * s.d);
  codec::reference_decode_attention(p, out.data());
  return out;
}

void expect_close(const std::string& what, const std::vector<float>& cpu, const float* gpu) {
  float mx = 0;
  for (float v : cpu) mx = std::max(mx, std::fabs(v));
  for (size_t i = 0; i < cpu.size(); ++i)
    if (!(std::fabs(gpu[i] - cpu[i]) <= 2e-4 * (1 + mx))) {
      ADD_FAILURE() << what << ": out[" << i << "] cpu " << cpu[i] << " gpu " << gpu[i];
      return;
    }
}

// Loads every sequence's rows (coded on the CPU), attends, compares.
void load_all(const CacheCase& s, Host& host, PackedKvCache& cache) {
  const int B = static_cast<int>(s.lengths.size());
  for (int b = 0; b < B; ++b) {
    const int L = s.lengths[static_cast<size_t>(b)];
    std::vector<std::vector<uint8_t>> kp, vp;
    std::vector<const uint8_t*> kptr, vptr;
    for (int h = 0; h < s.n_kv; ++h) {
      host.kx.push_back(t::gaussian_rows(L, s.d, 100 + 7 * b + h));
      host.vx.push_back(t::gaussian_rows(L, s.d, 300 + 7 * b + h));
      kp.push_back(host.kc[static_cast<size_t>(h)].encode(host.kx.back().data(), L));
      vp.push_back(host.vc[static_cast<size_t>(h)].encode(host.vx.back().data(), L));
    }
    for (int h = 0; h < s.n_kv; ++h) {
      kptr.push_back(kp[static_cast<size_t>(h)].data());
      vptr.push_back(vp[static_cast<size_t>(h)].data());
    }
    cache.load(0, b, kptr, vptr, L);
  }
}

void check_attend(const CacheCase& s, const Host& host, const PackedKvCache& cache, const std::vector<float>& q,
                  const std::string& what) {
  const int B = static_cast<int>(s.lengths.size());
  const size_t per = static_cast<size_t>(s.n_q) * s.d;
  Dev<float> dq(q.size()), dout(q.size());
  dq.put(q);
  cache.attend(0, dq.p, dout.p);
  const std::vector<float> out = dout.get(q.size());
  for (int b = 0; b < B; ++b)
    expect_close(s.name + " " + what + " seq " + std::to_string(b), reference(s, host, b, q.data() + b * per),
                 out.data() + b * per);
}

std::vector<CacheCase> setups() {
  return {
      {"tq_k3v3_gqa4_ragged", 128, 32, 8, {1, 700, 5000, 64}, [](int) { return t::tq_uniform(128, 3); },
       [](int h) { return t::tq_uniform(128, 3, 9 + h, Side::kV); }, false, 0, 6000},
      {"gtq_compact_gqa8_window", 128, 16, 2, {300, 2000}, [](int h) { return t::compact_norms(t::tq_blocks(128, {2, 3, 4}), 128, 8, 5 + h); },
       [](int h) { return t::norm_corrected(t::tq_uniform(128, 3, 9 + h, Side::kV)); }, false, 257, 4096},
      {"lrh_pre_rope_gqa16", 64, 16, 1, {33, 900}, [](int) { HeadDecision x = t::with_mean(t::lrh(64, 16, 4)); x.post_rope = false; return x; },
       [](int) { return t::tq_uniform(64, 2, 9, Side::kV); }, true, 0, 1024},
      {"kivi_v_d256_mha", 256, 2, 2, {129, 5}, [](int) { return t::tq_uniform(256, 2); },
       [](int) { return t::kivi(Side::kV, 2); }, false, 0, 256},
      {"fp8_k_nvfp4_v_gqa4", 128, 16, 4, {1, 300, 77}, [](int) { return minifloat(MinifloatFormat::kFp8E4M3, 1.f / 64, Side::kK); },
       [](int) { return minifloat(MinifloatFormat::kNvfp4, 0.003f, Side::kV); }, false, 0, 512},
      {"nvfp4_pre_rope_k_fp8_v", 64, 8, 2, {50, 3}, [](int) { HeadDecision x = minifloat(MinifloatFormat::kNvfp4, 0.003f, Side::kK); x.post_rope = false; return x; },
       [](int) { return minifloat(MinifloatFormat::kFp8E4M3, 1.f / 64, Side::kV); }, true, 0, 128},
  };
}

TEST(CudaKvCache, AttendMatchesCpuReferenceOnRaggedBatches) {
  REQUIRE_GPU();
  for (const CacheCase& s : setups()) {
    Host host;
    PackedKvCache cache(make_spec(s, host));
    load_all(s, host, cache);
    EXPECT_EQ(cache.lengths(0), std::vector<int32_t>(s.lengths.begin(), s.lengths.end())) << s.name;
    const std::vector<float> q = t::gaussian_rows(static_cast<int>(s.lengths.size()) * s.n_q, s.d, 5, 1.5);
    check_attend(s, host, cache, q, "loaded");
  }
}

// One decode step (append_packed + attend) captured in a CUDA graph, replayed twice: each replay
// appends the same new token again and attends; both equal the CPU reference over the same rows.
TEST(CudaKvCache, StepCapturedInAGraphReplaysCorrectly) {
  REQUIRE_GPU();
  for (const CacheCase& s : setups()) {
    Host host;
    PackedKvCache cache(make_spec(s, host));
    load_all(s, host, cache);
    const int B = static_cast<int>(s.lengths.size());
    // The new token of every sequence, coded on the CPU in append_packed's layout.
    std::vector<std::vector<float>> kn, vn;  // [b * n_kv + h]
    std::vector<uint8_t> kbytes, vbytes;
    for (int side = 0; side < 2; ++side)
      for (int h = 0; h < s.n_kv; ++h) {
        std::vector<float> rows;
        for (int b = 0; b < B; ++b) {
          const std::vector<float> r = t::gaussian_rows(1, s.d, 900 + 31 * side + 7 * b + h);
          rows.insert(rows.end(), r.begin(), r.end());
        }
        const HeadCodec& c = side ? host.vc[static_cast<size_t>(h)] : host.kc[static_cast<size_t>(h)];
        const std::vector<uint8_t> bytes = c.encode(rows.data(), B);
        (side ? vbytes : kbytes).insert((side ? vbytes : kbytes).end(), bytes.begin(), bytes.end());
        if (side == 0) kn.push_back(rows); else vn.push_back(rows);
      }
    ASSERT_EQ(kbytes.size(), cache.packed_step_bytes(0, Side::kK));
    ASSERT_EQ(vbytes.size(), cache.packed_step_bytes(0, Side::kV));
    Dev<uint8_t> dk(kbytes.size()), dv(vbytes.size());
    dk.put(kbytes);
    dv.put(vbytes);
    const std::vector<float> q = t::gaussian_rows(B * s.n_q, s.d, 6, 1.5);
    const size_t per = static_cast<size_t>(s.n_q) * s.d;
    Dev<float> dq(q.size()), dout(q.size());
    dq.put(q);
    cudaStream_t st;
    CUDA_OK(cudaStreamCreate(&st));
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cache.append_packed(0, dk.p, dv.p, st);
    cache.attend(0, dq.p, dout.p, st);
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 1; replay <= 2; ++replay) {
      CUDA_OK(cudaGraphLaunch(exec, st));
      CUDA_OK(cudaStreamSynchronize(st));
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < s.n_kv; ++h) {
          auto& kx = host.kx[static_cast<size_t>(b * s.n_kv + h)];
          auto& vx = host.vx[static_cast<size_t>(b * s.n_kv + h)];
          const auto& kr = kn[static_cast<size_t>(h)];
          const auto& vr = vn[static_cast<size_t>(h)];
          kx.insert(kx.end(), kr.begin() + b * s.d, kr.begin() + (b + 1) * s.d);
          vx.insert(vx.end(), vr.begin() + b * s.d, vr.begin() + (b + 1) * s.d);
        }
      const std::vector<float> out = dout.get(q.size());
      for (int b = 0; b < B; ++b) {
        EXPECT_EQ(cache.lengths(0)[static_cast<size_t>(b)], s.lengths[static_cast<size_t>(b)] + replay) << s.name;
        expect_close(s.name + " replay " + std::to_string(replay) + " seq " + std::to_string(b),
                     reference(s, host, b, q.data() + b * per), out.data() + b * per);
        // The cache holds exactly the CPU codes of the rows.
        const int T = s.lengths[static_cast<size_t>(b)] + replay;
        for (int h = 0; h < s.n_kv; ++h) {
          EXPECT_EQ(cache.packed(0, b, h, Side::kK),
                    host.kc[static_cast<size_t>(h)].encode(host.kx[static_cast<size_t>(b * s.n_kv + h)].data(), T))
              << s.name << " seq " << b << " head " << h;
          EXPECT_EQ(cache.packed(0, b, h, Side::kV),
                    host.vc[static_cast<size_t>(h)].encode(host.vx[static_cast<size_t>(b * s.n_kv + h)].data(), T))
              << s.name << " seq " << b << " head " << h;
        }
      }
    }
    EXPECT_FALSE(cache.overflowed());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
}

TEST(CudaKvCache, FullSequenceDropsItsTokenAndSaysSo) {
  REQUIRE_GPU();
  CacheCase s{"full", 64, 4, 1, {4, 2}, [](int) { return t::tq_uniform(64, 3); },
          [](int) { return t::tq_uniform(64, 3, 9, Side::kV); }, false, 0, 4};
  Host host;
  PackedKvCache cache(make_spec(s, host));
  load_all(s, host, cache);
  std::vector<uint8_t> kb(cache.packed_step_bytes(0, Side::kK)), vb(cache.packed_step_bytes(0, Side::kV));
  Dev<uint8_t> dk(kb.size()), dv(vb.size());
  dk.put(kb);
  dv.put(vb);
  cache.append_packed(0, dk.p, dv.p);
  EXPECT_EQ(cache.lengths(0), (std::vector<int32_t>{4, 3}));
  EXPECT_TRUE(cache.overflowed());
}

TEST(CudaKvCache, RejectsBadArguments) {
  REQUIRE_GPU();
  CacheCase s{"kivi_k", 64, 4, 1, {40}, [](int) { return t::kivi(Side::kK, 2); },
          [](int) { return t::kivi(Side::kV, 2); }, false, 0, 64};
  Host host;
  PackedKvCache cache(make_spec(s, host));
  load_all(s, host, cache);  // whole KIVI K blocks load fine
  EXPECT_THROW(cache.append_packed(0, nullptr, nullptr), Error);  // one token per block needed
#ifdef KVQ_HAVE_GPU_ENCODER
  // 40 tokens: a partial KIVI K group whose rows the cache never saw.
  EXPECT_THROW(cache.append(0, nullptr, nullptr), Error);
#endif
  std::vector<const uint8_t*> none(1, nullptr);
  EXPECT_THROW(cache.load(0, 0, none, none, 65), Error);  // beyond the capacity
  EXPECT_THROW(cache.load(0, 1, none, none, 1), Error);   // no such sequence
  EXPECT_THROW(cache.lengths(1), Error);                   // no such layer
  Host h2;
  CacheCase big = s;
  big.n_q = 17 * s.n_kv;  // GQA 17
  EXPECT_THROW(PackedKvCache(make_spec(big, h2)), Error);
}

#ifdef KVQ_HAVE_GPU_ENCODER
// append codes on the GPU (encode_async): the cache then holds the CPU encoder's bytes.
TEST(CudaKvCache, AppendCodesLikeTheCpuEncoder) {
  REQUIRE_GPU();
  for (const CacheCase& s : setups()) {
    Host host;
    PackedKvCache cache(make_spec(s, host));
    load_all(s, host, cache);
    const int B = static_cast<int>(s.lengths.size());
    const std::vector<float> k = t::gaussian_rows(B * s.n_kv, s.d, 77), v = t::gaussian_rows(B * s.n_kv, s.d, 78);
    Dev<float> dk(k.size()), dv(v.size());
    dk.put(k);
    dv.put(v);
    cache.append(0, dk.p, dv.p);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < s.n_kv; ++h) {
        auto& kx = host.kx[static_cast<size_t>(b * s.n_kv + h)];
        auto& vx = host.vx[static_cast<size_t>(b * s.n_kv + h)];
        kx.insert(kx.end(), k.begin() + (b * s.n_kv + h) * s.d, k.begin() + (b * s.n_kv + h + 1) * s.d);
        vx.insert(vx.end(), v.begin() + (b * s.n_kv + h) * s.d, v.begin() + (b * s.n_kv + h + 1) * s.d);
        const int T = s.lengths[static_cast<size_t>(b)] + 1;
        EXPECT_EQ(cache.packed(0, b, h, Side::kK), host.kc[static_cast<size_t>(h)].encode(kx.data(), T)) << s.name;
        EXPECT_EQ(cache.packed(0, b, h, Side::kV), host.vc[static_cast<size_t>(h)].encode(vx.data(), T)) << s.name;
      }
    const std::vector<float> q = t::gaussian_rows(B * s.n_q, s.d, 5, 1.5);
    check_attend(s, host, cache, q, "appended");
  }
}

// A whole decode step through the GPU encoder (append + attend) captured once in a CUDA graph and
// replayed for 40 steps with new rows and queries each time (written into the captured buffers
// between replays): after every replay the cache holds the CPU encoder's bytes of all the rows so
// far and the output equals the CPU reference. KIVI K crosses group boundaries (its open group
// re-encoded every step), minifloat and Block-GTQ keys, a sliding window, pre-RoPE keys.
TEST(CudaKvCache, GpuEncodedStepsInAGraph) {
  REQUIRE_GPU();
  const std::vector<CacheCase> cases = {
      {"kivi_k_g32_tq_v", 64, 8, 2, {32, 64}, [](int) { return t::kivi(Side::kK, 2, 32); },
       [](int h) { return t::tq_uniform(64, 3, 9 + h, Side::kV); }, false, 0, 160},
      {"kivi_k_g16_pre_rope_window", 128, 4, 1, {16, 48}, [](int) { HeadDecision x = t::kivi(Side::kK, 4, 16); x.post_rope = false; return x; },
       [](int) { return t::kivi(Side::kV, 2); }, true, 50, 128},
      {"fp8_k_nvfp4_v", 128, 16, 2, {1, 100}, [](int) { return minifloat(MinifloatFormat::kFp8E4M3, 1.f / 64, Side::kK); },
       [](int) { return minifloat(MinifloatFormat::kNvfp4, 0.003f, Side::kV); }, false, 0, 160},
      {"gtq_compact_k_lrh_v", 96, 8, 2, {5, 70}, [](int h) { return t::compact_norms(t::tq_blocks(96, {2, 3, 4}), 96, 8, 5 + h); },
       [](int h) { return t::with_mean(t::lrh(96, 24, 4, 3 + h, Side::kV)); }, false, 0, 128},
  };
  for (const CacheCase& s : cases) {
    Host host;
    PackedKvCache cache(make_spec(s, host));
    load_all(s, host, cache);
    const int B = static_cast<int>(s.lengths.size());
    const size_t kv = static_cast<size_t>(B) * s.n_kv * s.d, per = static_cast<size_t>(s.n_q) * s.d;
    Dev<float> dk(kv), dv(kv), dq(B * per), dout(B * per);
    cudaStream_t st;
    CUDA_OK(cudaStreamCreate(&st));
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cache.append(0, dk.p, dv.p, st);
    cache.attend(0, dq.p, dout.p, st);
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int step = 1; step <= 40; ++step) {
      const std::vector<float> k = t::gaussian_rows(B * s.n_kv, s.d, 1000 + step), v = t::gaussian_rows(B * s.n_kv, s.d, 2000 + step);
      const std::vector<float> q = t::gaussian_rows(B * s.n_q, s.d, 3000 + step, 1.5);
      dk.put(k);
      dv.put(v);
      dq.put(q);
      CUDA_OK(cudaGraphLaunch(exec, st));
      CUDA_OK(cudaStreamSynchronize(st));
      const std::vector<int32_t> lens = cache.lengths(0);
      const std::vector<float> out = dout.get(B * per);
      for (int b = 0; b < B; ++b) {
        const int T = s.lengths[static_cast<size_t>(b)] + step;
        ASSERT_EQ(lens[static_cast<size_t>(b)], T) << s.name;
        for (int h = 0; h < s.n_kv; ++h) {
          const size_t i = static_cast<size_t>(b * s.n_kv + h);
          host.kx[i].insert(host.kx[i].end(), k.begin() + i * s.d, k.begin() + (i + 1) * s.d);
          host.vx[i].insert(host.vx[i].end(), v.begin() + i * s.d, v.begin() + (i + 1) * s.d);
          EXPECT_EQ(cache.packed(0, b, h, Side::kK), host.kc[static_cast<size_t>(h)].encode(host.kx[i].data(), T))
              << s.name << " step " << step << " seq " << b << " head " << h;
          EXPECT_EQ(cache.packed(0, b, h, Side::kV), host.vc[static_cast<size_t>(h)].encode(host.vx[i].data(), T))
              << s.name << " step " << step << " seq " << b << " head " << h;
        }
        expect_close(s.name + " step " + std::to_string(step) + " seq " + std::to_string(b),
                     reference(s, host, b, q.data() + b * per), out.data() + b * per);
      }
    }
    EXPECT_FALSE(cache.overflowed());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
}
#endif

}  // namespace
}  // namespace kvq::cuda
