// The fused decode-attention kernels (kvq/cuda/attention_kernels.cuh) run on CPU threads by
// cuda_emulation.hpp against the CPU reference codec::reference_decode_attention, one problem per
// sequence, on every machine (CI has no GPU). Tolerance, per sequence:
//   |emu - cpu| <= 2e-4 * (1 + max |cpu out|)
// (float accumulation, float softmax and a different summation order against the reference's
// double; RoPE angles in double on both sides, sine and cosine in float after a double range
// reduction) — the tolerance of test_cuda_codec.cpp, whose GPU
// run of the same kernels remains the real check.
#include "cuda_emulation.hpp"
// clang-format off: the emulation must come before the kernels
#include "kvq/cuda/attention_kernels.cuh"
#include "kvq/cuda/decode_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <numeric>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "emulation_host_tables.hpp"
#include "test_util.hpp"

namespace kvq::cuda::detail {
namespace {

namespace t = codec::test;
using codec::HeadCodec;

struct Case {
  std::string name;
  int d, n_q, n_kv;
  std::vector<int> lengths;  // one sequence each (ragged batch)
  std::function<HeadDecision(int)> k, v;
  bool rope = false;
  bool interleaved = false;
  bool scaled_rope = false;  // model-given inverse frequencies and attention factor
  int window = 0;
  int sm_count = 132;        // the split plan's GPU size: small or large forces few or many splits
  int capacity = 0;          // the plan's max_tokens (a cache's capacity); 0: the longest sequence
  int pos0 = 3;              // position of token 0 (positions 5 apart)
};

int run_case(const Case& cs) {
  const int d = cs.d, B = static_cast<int>(cs.lengths.size());
  const int max_len = *std::max_element(cs.lengths.begin(), cs.lengths.end());
  const int cap = std::max(cs.capacity, max_len);
  std::vector<std::unique_ptr<HeadCodec>> kc, vc;
  HostTables tables;
  std::vector<DevHead> kh, vh;
  std::vector<const codec::HeadCodec*> kcp;
  for (int h = 0; h < cs.n_kv; ++h) {
    kc.push_back(std::make_unique<HeadCodec>(cs.k(h), d));
    vc.push_back(std::make_unique<HeadCodec>(cs.v(h), d));
    kh.push_back(tables.head(*kc.back()));
    vh.push_back(tables.head(*vc.back()));
    kcp.push_back(kc.back().get());
  }
  codec::RopeSpec rope{cs.rope, 10000.0, 0, cs.interleaved ? RopePairing::kInterleaved : RopePairing::kSplitHalf, {}, 1.0};
  if (cs.scaled_rope) {
    for (int i = 0; i < d / 2; ++i)  // any positive frequencies: the kernel must take them as given
      rope.inv_freq.push_back(std::pow(500000.0, -2.0 * i / d) / (i < d / 4 ? 1.0 : 8.0));
    rope.attention_factor = 1.1386;
  }
  // Per sequence: its packed K/V per KV head, queries and positions.
  std::vector<std::vector<uint8_t>> kp, vp;  // [b * n_kv + h]
  std::vector<const uint8_t*> kptr, vptr;
  const std::vector<float> q = t::gaussian_rows(B * cs.n_q, d, 5, 1.5);
  std::vector<int32_t> pos(static_cast<size_t>(B) * cap);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < cap; ++i) pos[static_cast<size_t>(b) * cap + i] = cs.pos0 + 5 * i + b;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < cs.n_kv; ++h) {
      const int L = cs.lengths[static_cast<size_t>(b)];
      const std::vector<float> k = t::gaussian_rows(L, d, 100 + 7 * b + h), v = t::gaussian_rows(L, d, 200 + 7 * b + h);
      kp.push_back(kc[static_cast<size_t>(h)]->encode(k.data(), L));
      vp.push_back(vc[static_cast<size_t>(h)]->encode(v.data(), L));
    }
  for (auto& x : kp) kptr.push_back(x.data());
  for (auto& x : vp) vptr.push_back(x.data());

  AttnShape sh;
  sh.n_q_heads = cs.n_q;
  sh.n_kv_heads = cs.n_kv;
  sh.head_dim = d;
  sh.batch = B;
  sh.max_tokens = cap;
  sh.window = cs.window;
  sh.rope = rope;
  const AttnPlan plan = plan_attention(sh, kcp, kh, vh, cs.sm_count);
  std::vector<float> ws_qc(plan.ws_qc, NAN), ws_m(plan.ws_ml, NAN), ws_l(plan.ws_ml, NAN), ws_acc(plan.ws_acc, NAN);
  std::vector<float> emu(static_cast<size_t>(B) * cs.n_q * d, NAN);
  const AttnParams P = make_attn_params(
      plan, {kh.data(), vh.data(), kptr.data(), vptr.data(), q.data(), cs.lengths.data(), pos.data(), cap,
             plan.inv_freq.data(), ws_qc.data(), ws_m.data(), ws_l.data(), ws_acc.data()});
  const unsigned ub = static_cast<unsigned>(B);
  if (!P.rope_enabled)
    kvq_emu::launch({static_cast<unsigned>(cs.n_q), ub, 1}, kThreads, plan.smem_query, [&] { attention_query_kernel(P); });
  kvq_emu::launch({static_cast<unsigned>(P.n_splits), static_cast<unsigned>(cs.n_kv), ub}, kThreads, plan.smem_partial,
                  [&] { attention_partial_kernel(P); });
  kvq_emu::launch({static_cast<unsigned>(cs.n_q), ub, 1}, kThreads, plan.smem_combine,
                  [&] { attention_combine_kernel(P, emu.data()); });

  for (int b = 0; b < B; ++b) {
    codec::AttentionProblem p;
    p.n_q_heads = cs.n_q, p.n_kv_heads = cs.n_kv, p.head_dim = d, p.n_tokens = cs.lengths[static_cast<size_t>(b)];
    p.window = cs.window;
    p.q = q.data() + static_cast<size_t>(b) * cs.n_q * d;
    p.positions = pos.data() + static_cast<size_t>(b) * cap;
    p.rope = rope;
    for (int h = 0; h < cs.n_kv; ++h) {
      p.k_codecs.push_back(kc[static_cast<size_t>(h)].get());
      p.v_codecs.push_back(vc[static_cast<size_t>(h)].get());
      p.k_packed.push_back(kptr[static_cast<size_t>(b * cs.n_kv + h)]);
      p.v_packed.push_back(vptr[static_cast<size_t>(b * cs.n_kv + h)]);
    }
    std::vector<float> cpu(static_cast<size_t>(cs.n_q) * d);
    codec::reference_decode_attention(p, cpu.data());
    float mx = 0;
    for (float v : cpu) mx = std::max(mx, std::fabs(v));
    const float* e = emu.data() + static_cast<size_t>(b) * cs.n_q * d;
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (!(std::fabs(e[i] - cpu[i]) <= 2e-4 * (1 + mx))) {
        ADD_FAILURE() << cs.name << " seq " << b << " (T=" << p.n_tokens << ") splits=" << P.n_splits << "x"
                      << P.tokens_per_split << " out[" << i << "] cpu " << cpu[i] << " emu " << e[i];
        return P.n_splits;
      }
    }
  }
  return P.n_splits;
}

HeadDecision pre_rope(HeadDecision x) {
  x.post_rope = false;
  return x;
}

// Uniform TQ K3V3 / K2V2, the papers' main setting, on every head size and GQA group; ragged
// lengths from 1 to 5000 tokens in one batch.
TEST(AttentionEmulation, UniformTqEveryHeadDimAndGroup) {
  const std::vector<Case> cases = {
      // A small GPU: two long splits per sequence, each warp many tiles (the running max moves).
      {"tq_k3v3_d128_gqa4_ragged_1_to_5000", 128, 4, 1, {1, 33, 700, 5000},
       [](int) { return t::tq_uniform(128, 3); }, [](int) { return t::tq_uniform(128, 3, 9, Side::kV); },
       false, false, false, 0, 2},
      {"tq_k2v2_d64_gqa8", 64, 16, 2, {97, 40}, [](int) { return t::tq_uniform(64, 2); },
       [](int h) { return t::tq_uniform(64, 2, 9 + h, Side::kV); }},
      {"tq_k3v3_d96_gqa16", 96, 16, 1, {100}, [](int) { return t::tq_uniform(96, 3); },
       [](int) { return t::tq_uniform(96, 3, 9, Side::kV); }},
      {"tq_k2v3_d256_mha", 256, 2, 2, {70, 129}, [](int) { return t::tq_uniform(256, 2); },
       [](int h) { return t::tq_uniform(256, 3, 4 + h, Side::kV); }},
  };
  for (const Case& c : cases) run_case(c);
}

// Block-GTQ: mixed-width groups on post-RoPE keys, fp16 and compact group norms, norm correction
// on, off and mixed per head.
TEST(AttentionEmulation, BlockGtqMixedWidthsCompactNormsNormCorrection) {
  const std::vector<Case> cases = {
      {"gtq_k_tq_v_d128", 128, 8, 2, {200, 31}, [](int) { return t::tq_blocks(128, {2, 3, 4}); },
       [](int h) { return t::tq_uniform(128, 3, 9 + h, Side::kV); }},
      {"gtq_compact_k_nc_v_d64", 64, 8, 2, {150, 1, 64},
       [](int h) { return t::compact_norms(t::tq_blocks(64, {2, 3, 4}), 64, 8, 5 + h); },
       [](int h) { return t::norm_corrected(t::tq_uniform(64, 3, 9 + h, Side::kV)); }},
      {"gtq_nc_compact_k_d96", 96, 4, 1, {97}, [](int) { return t::norm_corrected(t::compact_norms(t::tq_blocks(96, {1, 3, 5}), 96, 4)); },
       [](int) { return t::tq_blocks(96, {2, 4}); }},
      {"tq_nc_mixed_per_head", 64, 8, 4, {150}, [](int h) { HeadDecision x = t::tq_blocks(64, {2, 3, 4}); x.norm_correction = h % 2 == 0; return x; },
       [](int h) { HeadDecision x = t::tq_uniform(64, 2, 9 + h, Side::kV); x.norm_correction = h % 2 == 1; return x; }},
      {"gtq_rotate_below_nc", 64, 4, 1, {80}, [](int) { return t::rotate_below(t::norm_corrected(t::tq_blocks(64, {1, 4, 8, 2})), 3); },
       [](int) { return t::norm_corrected(t::tq_blocks(64, {1, 4, 8, 2})); }},
  };
  for (const Case& c : cases) run_case(c);
}

// KV-COBRA low rank r16 b4 with TQ V (the paper's setting), ranks differing per head, means.
TEST(AttentionEmulation, LowRankAndKivi) {
  const std::vector<Case> cases = {
      {"lrh_r16_b4_k_tq_v_d128", 128, 8, 2, {200, 3}, [](int h) { return t::with_mean(t::lrh(128, 16, 4, 2 + h)); },
       [](int h) { return t::tq_uniform(128, 3, 9 + h, Side::kV); }},
      {"lrh_both_ranks_differ_d64", 64, 4, 2, {70}, [](int h) { return t::with_mean(t::lrh(64, 24 - 8 * h, 4, 2)); },
       [](int h) { return t::with_mean(t::lrh(64, 40 - 20 * h, 3, 5 + h, Side::kV), -0.4f); }},
      {"kivi2_both_d128_partial_blocks", 128, 4, 1, {45, 1, 96}, [](int) { return t::kivi(Side::kK, 2); },
       [](int) { return t::kivi(Side::kV, 2); }},
      {"kivi_k_group128_d64", 64, 4, 1, {300}, [](int) { return t::kivi(Side::kK, 2, 128); },
       [](int) { return t::kivi(Side::kV, 4, 16); }},
  };
  for (const Case& c : cases) run_case(c);
}

HeadDecision minifloat(MinifloatFormat f, float scale, Side side) {
  HeadDecision x;
  x.side = side;
  x.kind = CodingKind::kMinifloat;
  x.minifloat = f;
  x.scale = scale;
  return x;
}

// FP8 E4M3 (per-head scale) and NVFP4 (16-value blocks, E4M3 block scales, a global scale) on
// either side, against TQ and each other; post- and pre-RoPE keys; d not a multiple of 16 (NVFP4's
// last block short); GQA 1..16; a window.
TEST(AttentionEmulation, Minifloat) {
  const auto fp8 = [](Side s) { return minifloat(MinifloatFormat::kFp8E4M3, 1.f / 64, s); };
  const auto nv = [](Side s) { return minifloat(MinifloatFormat::kNvfp4, 0.003f, s); };
  const std::vector<Case> cases = {
      {"fp8_both_d128_gqa4_ragged", 128, 8, 2, {1, 45, 300}, [&](int) { return fp8(Side::kK); },
       [&](int) { return fp8(Side::kV); }},
      {"nvfp4_both_d64_gqa16", 64, 16, 1, {97, 33}, [&](int) { return nv(Side::kK); }, [&](int) { return nv(Side::kV); }},
      {"fp8_k_tq_v_d96_mha", 96, 2, 2, {70}, [&](int) { return fp8(Side::kK); },
       [](int h) { return t::tq_uniform(96, 3, 9 + h, Side::kV); }},
      {"tq_k_nvfp4_v_d256", 256, 4, 1, {50, 129}, [](int) { return t::tq_blocks(256, {2, 3, 4}); },
       [&](int) { return nv(Side::kV); }},
      {"nvfp4_k_fp8_v_d8_mixed_per_head", 8, 4, 2, {40}, [&](int h) { return h ? nv(Side::kK) : fp8(Side::kK); },
       [&](int h) { return h ? fp8(Side::kV) : nv(Side::kV); }},
      {"nvfp4_k_d40_short_block", 40, 4, 1, {64}, [&](int) { return nv(Side::kK); }, [&](int) { return fp8(Side::kV); }},
      {"fp8_pre_rope_split_half_d64", 64, 4, 1, {70}, [&](int) { return pre_rope(fp8(Side::kK)); },
       [&](int) { return nv(Side::kV); }, true, false},
      {"nvfp4_pre_rope_interleaved_window_d128", 128, 8, 2, {90, 20}, [&](int) { return pre_rope(nv(Side::kK)); },
       [&](int) { return fp8(Side::kV); }, true, true, false, 37},
  };
  for (const Case& c : cases) run_case(c);
}

// Negative control: the comparison sees a minifloat scale the kernel got wrong (the K head's
// per-head FP8 scale doubled in the device view only).
TEST(AttentionEmulation, MinifloatNegativeControl) {
  HeadCodec k(minifloat(MinifloatFormat::kFp8E4M3, 1.f / 64, Side::kK), 64);
  HeadCodec v(minifloat(MinifloatFormat::kNvfp4, 0.003f, Side::kV), 64);
  HostTables tables;
  std::vector<DevHead> kh{tables.head(k)}, vh{tables.head(v)};
  const int T = 40, n_q = 4, d = 64;
  const std::vector<float> kx = t::gaussian_rows(T, d, 11), vx = t::gaussian_rows(T, d, 12);
  const std::vector<float> q = t::gaussian_rows(n_q, d, 13, 1.5);
  const std::vector<uint8_t> kp = k.encode(kx.data(), T), vp = v.encode(vx.data(), T);
  const uint8_t* kptr = kp.data();
  const uint8_t* vptr = vp.data();
  AttnShape sh;
  sh.n_q_heads = n_q, sh.n_kv_heads = 1, sh.head_dim = d, sh.max_tokens = T;
  std::vector<float> cpu(static_cast<size_t>(n_q) * d);
  codec::AttentionProblem p;
  p.n_q_heads = n_q, p.n_kv_heads = 1, p.head_dim = d, p.n_tokens = T, p.q = q.data();
  p.k_codecs = {&k}, p.v_codecs = {&v}, p.k_packed = {kptr}, p.v_packed = {vptr};
  codec::reference_decode_attention(p, cpu.data());
  double worst[2] = {0, 0};
  for (int wrong = 0; wrong < 2; ++wrong) {
    std::vector<DevHead> khw = kh;
    if (wrong) khw[0].mf_scale *= 2;
    const AttnPlan plan = plan_attention(sh, {&k}, khw, vh, 4);
    std::vector<float> ws_qc(plan.ws_qc), ws_m(plan.ws_ml), ws_l(plan.ws_ml), ws_acc(plan.ws_acc), out(cpu.size());
    const AttnParams P = make_attn_params(plan, {khw.data(), vh.data(), &kptr, &vptr, q.data(), nullptr, nullptr, 0,
                                                 nullptr, ws_qc.data(), ws_m.data(), ws_l.data(), ws_acc.data()});
    kvq_emu::launch({static_cast<unsigned>(n_q), 1, 1}, kThreads, plan.smem_query, [&] { attention_query_kernel(P); });
    kvq_emu::launch({static_cast<unsigned>(P.n_splits), 1, 1}, kThreads, plan.smem_partial, [&] { attention_partial_kernel(P); });
    kvq_emu::launch({static_cast<unsigned>(n_q), 1, 1}, kThreads, plan.smem_combine, [&] { attention_combine_kernel(P, out.data()); });
    for (size_t i = 0; i < cpu.size(); ++i) worst[wrong] = std::max(worst[wrong], double(std::fabs(out[i] - cpu[i])));
  }
  EXPECT_LT(worst[0], 2e-4);
  EXPECT_GT(worst[1], 1e-2) << "a doubled FP8 scale should not agree";
}

// Pre-RoPE keys (KV-COBRA, the TQ baselines): decoded to x and rotated at their positions, both
// pairings, model-given frequencies and attention factor.
TEST(AttentionEmulation, PreRopeKeys) {
  const std::vector<Case> cases = {
      {"lrh_pre_rope_split_half_d128", 128, 8, 2, {45, 7}, [](int h) { return pre_rope(t::with_mean(t::lrh(128, 16, 4, 4 + h))); },
       [](int) { return t::tq_uniform(128, 3, 9, Side::kV); }, true, false},
      {"tq_pre_rope_interleaved_d64", 64, 4, 1, {33}, [](int) { return pre_rope(t::tq_uniform(64, 3)); },
       [](int) { return t::kivi(Side::kV, 2); }, true, true},
      {"tq_nc_pre_rope_scaled_freqs_d96", 96, 4, 2, {40}, [](int) { return pre_rope(t::norm_corrected(t::tq_uniform(96, 2))); },
       [](int) { return t::norm_corrected(t::tq_uniform(96, 1, 9, Side::kV)); }, true, false, true},
      // Positions near 2^19: angles of 5e5 rad, reduced in double before the float sine/cosine.
      {"tq_pre_rope_positions_near_512k", 128, 4, 1, {64}, [](int) { return pre_rope(t::tq_uniform(128, 4)); },
       [](int) { return t::tq_uniform(128, 3, 9, Side::kV); }, true, false, false, 0, 132, 0, 524000},
      {"kivi_pre_rope_d256", 256, 2, 1, {40}, [](int) { return pre_rope(t::kivi(Side::kK, 3)); },
       [](int) { return t::tq_uniform(256, 2, 3, Side::kV); }, true, false},
  };
  for (const Case& c : cases) run_case(c);
}

// Sliding windows: the attended range starts mid-cache (not a tile multiple), per sequence.
TEST(AttentionEmulation, SlidingWindows) {
  const std::vector<Case> cases = {
      {"window_37_pre_rope", 64, 8, 2, {90, 20, 37}, [](int) { return pre_rope(t::tq_uniform(64, 3)); },
       [](int) { return t::kivi(Side::kV, 4); }, true, false, false, 37},
      {"window_1_latent", 64, 4, 2, {70, 1}, [](int) { return t::tq_blocks(64, {2, 3, 4}); },
       [](int h) { return t::with_mean(t::lrh(64, 20 - 8 * h, 4, 8 + h, Side::kV)); }, false, false, false, 1},
      {"window_300_many_splits", 128, 4, 1, {1000, 299}, [](int) { return t::tq_uniform(128, 2); },
       [](int) { return t::tq_uniform(128, 2, 9, Side::kV); }, false, false, false, 300, 1000},
      {"window_wider_than_cache", 64, 2, 1, {33}, [](int) { return t::kivi(Side::kK, 3); },
       [](int) { return t::kivi(Side::kV, 2); }, false, false, false, 500},
  };
  for (const Case& c : cases) run_case(c);
}

// The split count changes nothing but the summation order: one split, a few, and one per tile
// (the merge of many), with a cache capacity beyond every length (blocks past a sequence's
// tokens do nothing).
TEST(AttentionEmulation, ManySplitsAndTheMerge) {
  auto k = [](int) { return t::tq_uniform(64, 3); };
  auto v = [](int h) { return t::tq_uniform(64, 3, 9 + h, Side::kV); };
  EXPECT_EQ(run_case({"one_sm", 64, 4, 1, {600}, k, v, false, false, false, 0, 1}), kSplitOversubscribe);
  EXPECT_EQ(run_case({"one_split", 64, 4, 1, {8}, k, v, false, false, false, 0, 132}), 1);
  EXPECT_EQ(run_case({"one_split_per_tile", 64, 4, 1, {600, 5}, k, v, false, false, false, 0, 100000}), 19);
  EXPECT_GT(run_case({"capacity_beyond_lengths", 64, 4, 1, {100, 3}, k, v, false, false, false, 0, 132, 4000}), 50);
}

TEST(AttentionEmulation, SplitPlanCoversEveryTokenOnce) {
  for (int T : {1, 2, 31, 32, 33, 1000, 4097, 100000, 524288})
    for (int n_kv : {1, 2, 8, 40})
      for (int batch : {1, 16})
        for (int sms : {1, 16, 132}) {
          const SplitPlan s = plan_splits(T, n_kv, batch, sms);
          ASSERT_GE(s.n_splits, 1);
          EXPECT_EQ(s.tokens_per_split % kTokTile, 0);
          EXPECT_GE(static_cast<long long>(s.tokens_per_split) * s.n_splits, T);
          EXPECT_LT(static_cast<long long>(s.tokens_per_split) * (s.n_splits - 1), T) << "empty last split";
          // Fills the GPU kSplitOversubscribe times over whenever the tokens allow it.
          if (T >= kTokTile * kSplitOversubscribe * sms) {
            EXPECT_GE(static_cast<long long>(s.n_splits) * n_kv * batch, static_cast<long long>(sms) * kSplitOversubscribe / 2)
                << T << " " << n_kv << " " << batch << " " << sms;
          }
        }
}

TEST(AttentionEmulation, PlanRejectsShapesBeyondTheKernels) {
  HeadCodec k(t::tq_uniform(64, 3), 64), v(t::tq_uniform(64, 3, 9, Side::kV), 64);
  HostTables tables;
  const std::vector<DevHead> kh{tables.head(k)}, vh{tables.head(v)};
  AttnShape sh;
  sh.n_q_heads = 17, sh.n_kv_heads = 1, sh.head_dim = 64, sh.max_tokens = 10;
  EXPECT_THROW(plan_attention(sh, {&k}, kh, vh, 132), Error);  // GQA 17 > 16
  sh.n_q_heads = 4, sh.head_dim = 32;
  EXPECT_THROW(plan_attention(sh, {&k}, kh, vh, 132), Error);  // heads of another size
  sh.head_dim = 64, sh.n_kv_heads = 2;
  EXPECT_THROW(plan_attention(sh, {&k}, kh, vh, 132), Error);  // one head for two KV heads
}

}  // namespace
}  // namespace kvq::cuda::detail
