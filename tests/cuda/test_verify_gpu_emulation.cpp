// kvq-verify's GPU cache check (lib/pipeline/src/verify_gpu.hpp: check_cache_layer) on CPU threads:
// the same check GpuVerifier runs against kvq::cuda::PackedKvCache, here against a cache that runs
// the same kernels in the emulation (cuda_emulation.hpp): the GPU encoder per step
// (encode_kernels.cuh, KIVI K through kivi_k_append_kernel), the fused attention
// (attention_kernels.cuh). The host side of the cache (streams, lengths, the append order) is
// written again here, after kernels/kv_cache*.cu; the GPU run is kvq-verify's (test_verify_cli).
// The oracle is the check's own: the CPU encoder's bytes and codec::reference_decode_attention.
#include "cuda_emulation.hpp"
// clang-format off: the emulation must come before the kernels
#include "kvq/cuda/attention_kernels.cuh"
#include "kvq/cuda/decode_kernels.cuh"
#include "kvq/cuda/encode_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <memory>

#include "kvq/codec/codec.hpp"
#include "emulation_host_tables.hpp"
#include "test_util.hpp"
#include "verify_gpu.hpp"

namespace kvq::cuda::detail {
namespace {

namespace t = codec::test;
using codec::HeadCodec;
using pipeline_detail::GpuLayer;

// One layer's packed cache in host memory, its steps run by the emulated kernels.
class EmuCache final : public pipeline_detail::CacheUnderTest {
 public:
  // corrupt_at > 0: after that many appends one byte of sequence 0's first K block is flipped
  // (the negative control).
  EmuCache(const GpuLayer& g, int sm_count, int corrupt_at = 0)
      : g_(g), B_(g.windows), H_(g.n_kv_heads), d_(g.head_dim), cap_(g.tokens), corrupt_at_(corrupt_at) {
    for (int h = 0; h < H_; ++h) {
      kh_.push_back(tables_.head(*g.k[static_cast<size_t>(h)]));
      vh_.push_back(tables_.head(*g.v[static_cast<size_t>(h)]));
    }
    AttnShape sh;
    sh.n_q_heads = g.n_q_heads;
    sh.n_kv_heads = H_;
    sh.head_dim = d_;
    sh.batch = B_;
    sh.max_tokens = cap_;
    sh.window = g.window;
    sh.rope = g.rope;
    plan_ = plan_attention(sh, g.k, kh_, vh_, sm_count);
    for (int side = 0; side < 2; ++side)
      for (int h = 0; h < H_; ++h) {
        const HeadCodec& c = codec(side, h);
        seq_bytes_.push_back(c.packed_bytes(cap_));
        streams_.emplace_back(seq_bytes_.back() * B_, 0);
        rows_.emplace_back(side == 0 && c.layout().tokens_per_block > 1
                               ? std::vector<float>(static_cast<size_t>(B_) * c.layout().tokens_per_block * d_, 0.f)
                               : std::vector<float>());
      }
    len_.assign(static_cast<size_t>(B_), 0);
  }

  void append(const float* k, const float* v) override {
    for (int side = 0; side < 2; ++side)
      for (int h = 0; h < H_; ++h) {
        const size_t i = static_cast<size_t>(side * H_ + h);
        const HeadCodec& c = codec(side, h);
        const DevHead& dh = (side ? vh_ : kh_)[static_cast<size_t>(h)];
        std::vector<float> x(static_cast<size_t>(B_) * d_);  // this head's new rows [b][d]
        for (int b = 0; b < B_; ++b)
          std::copy_n((side ? v : k) + (static_cast<size_t>(b) * H_ + h) * d_, d_, x.data() + static_cast<size_t>(b) * d_);
        if (!rows_[i].empty()) {  // KIVI K: the open group re-encoded
          KiviKAppend job{&dh, x.data(), rows_[i].data(), streams_[i].data(), seq_bytes_[i]};
          kvq_emu::launch({static_cast<unsigned>(B_), 1, 1}, kThreads, 0,
                          [&] { kivi_k_append_kernel(&job, len_.data(), cap_); });
          continue;
        }
        std::vector<uint8_t> coded(c.packed_bytes(B_));
        kvq_emu::launch({static_cast<unsigned>(encode_units(c.layout(), B_)), 1, 1}, kThreads, 0,
                        [&] { encode_kernel(&dh, x.data(), B_, coded.data()); });
        const size_t bb = c.layout().block_bytes;
        for (int b = 0; b < B_; ++b)
          if (len_[static_cast<size_t>(b)] < cap_)
            std::copy_n(coded.data() + b * bb, bb,
                        streams_[i].data() + seq_bytes_[i] * b + bb * static_cast<size_t>(len_[static_cast<size_t>(b)]));
      }
    for (int32_t& l : len_) l = std::min(l + 1, cap_);
    if (++steps_ == corrupt_at_) streams_[0][codec(0, 0).layout().meta_bytes] ^= 0x10;
  }

  void attend(const float* q, float* out) override {
    std::vector<const uint8_t*> kp, vp;
    for (int b = 0; b < B_; ++b)
      for (int h = 0; h < H_; ++h) {
        kp.push_back(streams_[static_cast<size_t>(h)].data() + seq_bytes_[static_cast<size_t>(h)] * b);
        vp.push_back(streams_[static_cast<size_t>(H_ + h)].data() + seq_bytes_[static_cast<size_t>(H_ + h)] * b);
      }
    std::vector<float> ws_qc(plan_.ws_qc, NAN), ws_m(plan_.ws_ml, NAN), ws_l(plan_.ws_ml, NAN), ws_acc(plan_.ws_acc, NAN);
    const AttnParams P = make_attn_params(plan_, {kh_.data(), vh_.data(), kp.data(), vp.data(), q, len_.data(), nullptr,
                                                  0, plan_.inv_freq.data(), ws_qc.data(), ws_m.data(), ws_l.data(),
                                                  ws_acc.data()});
    const unsigned nq = static_cast<unsigned>(g_.n_q_heads), ub = static_cast<unsigned>(B_);
    if (!P.rope_enabled)
      kvq_emu::launch({nq, ub, 1}, kThreads, plan_.smem_query, [&] { attention_query_kernel(P); });
    kvq_emu::launch({static_cast<unsigned>(P.n_splits), static_cast<unsigned>(H_), ub}, kThreads, plan_.smem_partial,
                    [&] { attention_partial_kernel(P); });
    kvq_emu::launch({nq, ub, 1}, kThreads, plan_.smem_combine, [&] { attention_combine_kernel(P, out); });
  }

  std::vector<int32_t> lengths() override { return len_; }

  std::vector<uint8_t> packed(int seq, int kv_head, Side side) override {
    const size_t i = static_cast<size_t>((side == Side::kV ? H_ : 0) + kv_head);
    const uint8_t* s = streams_[i].data() + seq_bytes_[i] * seq;
    return {s, s + codec(side == Side::kV, kv_head).packed_bytes(len_[static_cast<size_t>(seq)])};
  }

 private:
  const HeadCodec& codec(int side, int h) const { return *(side ? g_.v : g_.k)[static_cast<size_t>(h)]; }

  GpuLayer g_;
  int B_, H_, d_, cap_, corrupt_at_, steps_ = 0;
  HostTables tables_;
  std::vector<DevHead> kh_, vh_;
  AttnPlan plan_;
  std::vector<size_t> seq_bytes_;               // K heads, then V heads
  std::vector<std::vector<uint8_t>> streams_;   // [side * H + h]: B sequences of seq_bytes
  std::vector<std::vector<float>> rows_;        // KIVI K heads: the open groups' rows
  std::vector<int32_t> len_;
};

HeadDecision pre_rope(HeadDecision x) {
  x.post_rope = false;
  return x;
}
HeadDecision minifloat(MinifloatFormat f, float scale, Side side) {
  HeadDecision x;
  x.side = side;
  x.kind = CodingKind::kMinifloat;
  x.minifloat = f;
  x.scale = scale;
  return x;
}

// A layer of random rows and queries (M windows of T tokens) with the given decisions.
struct Layer {
  std::vector<std::unique_ptr<HeadCodec>> kc, vc;
  std::vector<float> k, v, q;
  GpuLayer g;
  Layer(int d, int n_q, int n_kv, int M, int T, const std::function<HeadDecision(int)>& kd,
        const std::function<HeadDecision(int)>& vd, bool rope, int window) {
    for (int h = 0; h < n_kv; ++h) {
      kc.push_back(std::make_unique<HeadCodec>(kd(h), d));
      vc.push_back(std::make_unique<HeadCodec>(vd(h), d));
      g.k.push_back(kc.back().get());
      g.v.push_back(vc.back().get());
    }
    k = t::gaussian_rows(M * T * n_kv, d, 31);
    v = t::gaussian_rows(M * T * n_kv, d, 32);
    q = t::gaussian_rows(M * T * n_q, d, 33, 1.5);
    g.n_q_heads = n_q, g.n_kv_heads = n_kv, g.head_dim = d, g.windows = M, g.tokens = T, g.window = window;
    g.rope = codec::RopeSpec{rope, 10000.0, 0, RopePairing::kSplitHalf, {}, 1.0};
    g.k_rows = k.data(), g.v_rows = v.data(), g.q_rows = q.data();
  }
};

void expect_agrees(const GpuLayer& g, const std::string& name) {
  EmuCache cache(g, 4);
  GpuCheck out;
  out.ran = true;
  pipeline_detail::check_cache_layer(g, cache, out);
  EXPECT_EQ(out.cache_layers, 1) << name;
  EXPECT_EQ(out.cache_steps, int64_t(g.windows) * g.tokens) << name;
  EXPECT_EQ(out.cache_byte_mismatches, 0) << name;
  EXPECT_EQ(out.cache_code_mismatches, 0) << name;
  EXPECT_EQ(out.cache_length_errors, 0) << name;
  EXPECT_EQ(out.attention_problems,
            int64_t(g.windows) * static_cast<int64_t>(pipeline_detail::attention_steps(g.tokens).size()))
      << name;
  EXPECT_LE(out.attention_max_scaled_diff, GpuCheck::kAttentionTolerance) << name;
  EXPECT_TRUE(out.passed()) << name;
}

TEST(VerifyGpuEmulation, AttentionSteps) {
  EXPECT_EQ(pipeline_detail::attention_steps(1), std::vector<int>({1}));
  EXPECT_EQ(pipeline_detail::attention_steps(8), std::vector<int>({1, 2, 4, 8}));
  EXPECT_EQ(pipeline_detail::attention_steps(37), std::vector<int>({1, 2, 4, 8, 16, 32, 37}));
}

// Block-GTQ (post-RoPE keys, mixed widths, compact norms) with KIVI V; KIVI K (groups of 8: the
// open group re-encoded every step) with TQ V; KV-COBRA low rank pre-RoPE keys rotated by the
// kernel with NVFP4 V on a sliding-window layer; FP8 / NVFP4 keys per head.
TEST(VerifyGpuEmulation, CacheCheckAgreesOnEveryKind) {
  {
    Layer L(64, 8, 2, 2, 37, [](int h) { return t::compact_norms(t::tq_blocks(64, {2, 3, 4}), 64, 8, 5 + h); },
            [](int) { return t::kivi(Side::kV, 2); }, true, 0);
    expect_agrees(L.g, "block-gtq post-rope K, KIVI V");
  }
  {
    Layer L(64, 4, 2, 2, 21, [](int) { return t::kivi(Side::kK, 2, 8); },
            [](int h) { return t::norm_corrected(t::tq_uniform(64, 3, 9 + h, Side::kV)); }, true, 0);
    expect_agrees(L.g, "KIVI K group 8, TQ V");
  }
  {
    Layer L(64, 8, 2, 3, 30, [](int h) { return pre_rope(t::with_mean(t::lrh(64, 16, 4, 2 + h))); },
            [](int) { return minifloat(MinifloatFormat::kNvfp4, 0.003f, Side::kV); }, true, 9);
    expect_agrees(L.g, "low-rank pre-RoPE K, NVFP4 V, window 9");
  }
  {
    Layer L(96, 6, 2, 1, 17,
            [](int h) { return h ? minifloat(MinifloatFormat::kNvfp4, 0.003f, Side::kK)
                                 : minifloat(MinifloatFormat::kFp8E4M3, 1.f / 64, Side::kK); },
            [](int) { return minifloat(MinifloatFormat::kFp8E4M3, 1.f / 64, Side::kV); }, true, 0);
    expect_agrees(L.g, "FP8 / NVFP4 K, FP8 V");
  }
}

// Negative control: a cache that flips one code byte of one K block is caught (bytes, codes and
// the attention output of the steps after it), and the check fails.
TEST(VerifyGpuEmulation, CacheCheckCatchesACorruptByte) {
  Layer L(64, 4, 1, 1, 16, [](int) { return t::tq_uniform(64, 3); }, [](int) { return t::tq_uniform(64, 3, 9, Side::kV); },
          true, 0);
  EmuCache cache(L.g, 4, 3);
  GpuCheck out;
  out.ran = true;
  pipeline_detail::check_cache_layer(L.g, cache, out);
  EXPECT_GT(out.cache_byte_mismatches, 0);
  EXPECT_GT(out.cache_code_mismatches, 0);
  EXPECT_GT(out.attention_max_abs_diff, 0.0);
  EXPECT_FALSE(out.passed());
}

TEST(VerifyGpuEmulation, UnsupportedLayersAreNamed) {
  Layer gqa(64, 17, 1, 1, 4, [](int) { return t::tq_uniform(64, 3); }, [](int) { return t::tq_uniform(64, 3, 9, Side::kV); },
            true, 0);
  gqa.g.layer = 5;
  const std::string a = pipeline_detail::cache_unsupported(gqa.g, kMaxGqaGroup);
  EXPECT_NE(a.find("layer 5"), std::string::npos) << a;
  EXPECT_NE(a.find("17"), std::string::npos) << a;
  Layer mixed(64, 4, 2, 1, 4, [](int h) { HeadDecision x = t::tq_uniform(64, 3); x.post_rope = h == 0; return x; },
              [](int) { return t::tq_uniform(64, 3, 9, Side::kV); }, true, 0);
  EXPECT_NE(pipeline_detail::cache_unsupported(mixed.g, kMaxGqaGroup).find("pre- and post-RoPE"), std::string::npos);
  EXPECT_EQ(pipeline_detail::cache_unsupported(gqa.g, 32), "");
}

}  // namespace
}  // namespace kvq::cuda::detail
