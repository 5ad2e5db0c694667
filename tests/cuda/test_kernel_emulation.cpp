// The CUDA kernels' own code (kvq/cuda/*_kernels.cuh) run on CPU threads by cuda_emulation.hpp,
// against the CPU reference, on every machine (CI has no GPU). Same tolerances as
// test_cuda_codec.cpp; the GPU run of that file remains the real check.
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

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "test_util.hpp"

namespace kvq::cuda::detail {
namespace {

namespace t = codec::test;
using codec::HeadCodec;

// Host "uploads": the emulated kernels read host memory.
struct HostTables {
  std::deque<std::vector<float>> f;
  std::deque<std::vector<int32_t>> i;
  std::deque<std::vector<uint8_t>> u;
  const float* up(const std::vector<float>& v) { return f.emplace_back(v).data(); }
  const int32_t* up(const std::vector<int32_t>& v) { return i.emplace_back(v).data(); }
  const uint8_t* up(const std::vector<uint8_t>& v) { return u.emplace_back(v).data(); }
  DevHead head(const HeadCodec& c) {
    return make_dev_head(c, [this](const auto& v) { return up(v); });
  }
};

TEST(KernelEmulation, DecodersMatchCpuReference) {
  for (int d : {8, 64, 96, 256}) {
    const std::vector<std::pair<const char*, HeadDecision>> decs = {
        {"tq3", t::tq_uniform(d, 3)},
        {"gtq", t::tq_blocks(d, {1, 4, 8, 2})},
        {"lrh", t::with_mean(t::lrh(d, std::max(1, d * 3 / 4 - 1), 5))},
        {"kiviK", t::kivi(Side::kK, 3)},
        {"kiviV", t::kivi(Side::kV, 7)},
        {"tq1nc", t::norm_corrected(t::tq_uniform(d, 1))},
        {"tq3nc", t::norm_corrected(t::tq_uniform(d, 3))},
        {"gtqnc", t::norm_corrected(t::tq_blocks(d, {1, 4, 8, 2}))},
        {"gtqnc_rot3", t::rotate_below(t::norm_corrected(t::tq_blocks(d, {1, 4, 8, 2})), 3)},
        // Compact group norms (one 16-bit record: head norm level + ratio index), both decoders.
        {"gtq_compact8", t::compact_norms(t::tq_blocks(d, {1, 4, 8, 2}), d, 8)},
        {"gtqnc_compact3", t::norm_corrected(t::compact_norms(t::tq_blocks(d, {1, 4, 8, 2}), d, 3))},
    };
    for (const auto& [name, dec] : decs) {
      HeadCodec c(dec, d);
      HostTables tables;
      const DevHead h = tables.head(c);
      const int n = 37;
      const std::vector<float> x = t::gaussian_rows(n, d, 11 + d, 2.0);
      const std::vector<uint8_t> packed = c.encode(x.data(), n);
      const size_t cd = static_cast<size_t>(c.code_dim());

      std::vector<uint8_t> codes_cpu(n * cd), codes_emu(n * cd);
      std::vector<float> lat_cpu(n * cd), lat_emu(n * cd);
      c.unpack_codes(packed.data(), n, codes_cpu.data());
      c.decode_latent(packed.data(), n, lat_cpu.data());
      kvq_emu::launch({3, 1, 1}, kThreads, 0, [&] {
        latent_kernel(&h, packed.data(), n, lat_emu.data(), codes_emu.data());
      });
      EXPECT_EQ(codes_cpu, codes_emu) << name << " d=" << d;
      // Norm correction: ||c||^2 in float here, in double on the CPU (see test_cuda_codec.cpp).
      const double lat_tol = dec.norm_correction ? 1e-5 : 1e-6;
      for (size_t i = 0; i < lat_cpu.size(); ++i)
        ASSERT_NEAR(lat_emu[i], lat_cpu[i], lat_tol * (1 + std::fabs(lat_cpu[i]))) << name << " d=" << d << " i=" << i;
      // The decode_kernel path (decode_latent_tile: one warp per token and group) gives the same
      // latents as latent_value's per-element path.
      if (dec.norm_correction) {
        std::vector<float> tile(static_cast<size_t>(kDecodeTile) * cd, NAN);
        const int nt = std::min(n, kDecodeTile);
        kvq_emu::launch({1, 1, 1}, kThreads, 0,
                        [&] { decode_latent_tile(h, packed.data(), 0, nt, tile.data(), static_cast<int>(cd)); });
        for (size_t i = 0; i < static_cast<size_t>(nt) * cd; ++i)
          ASSERT_NEAR(tile[i], lat_cpu[i], lat_tol * (1 + std::fabs(lat_cpu[i]))) << name << " tile d=" << d << " i=" << i;
        // Codes do not depend on the setting: the same input encodes to the same bytes.
        HeadDecision plain = dec;
        plain.norm_correction = false;
        EXPECT_EQ(HeadCodec(plain, d).encode(x.data(), n), packed) << name << " d=" << d;
      }

      std::vector<float> y_cpu(static_cast<size_t>(n) * d), y_emu(y_cpu.size(), NAN);
      c.decode(packed.data(), n, y_cpu.data());
      kvq_emu::launch({static_cast<unsigned>((n + kDecodeTile - 1) / kDecodeTile), 1, 1}, kThreads,
                      sizeof(float) * kDecodeTile * cd,
                      [&] { decode_kernel(&h, packed.data(), n, y_emu.data()); });
      for (int tok = 0; tok < n; ++tok) {
        double nrm = 0;
        for (int i = 0; i < d; ++i) nrm += double(y_cpu[static_cast<size_t>(tok) * d + i]) * y_cpu[static_cast<size_t>(tok) * d + i];
        for (int i = 0; i < d; ++i) {
          const size_t k = static_cast<size_t>(tok) * d + i;
          ASSERT_NEAR(y_emu[k], y_cpu[k], 2e-5 * (1 + std::sqrt(nrm))) << name << " d=" << d << " t=" << tok << " i=" << i;
        }
      }
    }
  }
}

struct Case {
  const char* name;
  int d, n_q, n_kv, T, sm_count;
  std::function<HeadDecision(int)> k, v;
  bool rope, interleaved;
  bool scaled_rope = false;  // model-given inverse frequencies and attention factor (llama3/yarn files)
  int window = 0;            // sliding-window layer: the last `window` tokens only
};

void run_case(const Case& cs) {
  const int d = cs.d;
  std::vector<std::unique_ptr<HeadCodec>> kc, vc;
  std::vector<std::vector<uint8_t>> kp, vp;
  codec::AttentionProblem p;
  p.n_q_heads = cs.n_q, p.n_kv_heads = cs.n_kv, p.head_dim = d, p.n_tokens = cs.T;
  p.window = cs.window;
  const std::vector<float> q = t::gaussian_rows(cs.n_q, d, 5, 1.5);
  p.q = q.data();
  std::vector<int32_t> pos(static_cast<size_t>(cs.T));
  for (int i = 0; i < cs.T; ++i) pos[static_cast<size_t>(i)] = 3 + 5 * i;
  p.positions = pos.data();
  p.rope = codec::RopeSpec{cs.rope, 10000.0, 0, cs.interleaved ? RopePairing::kInterleaved : RopePairing::kSplitHalf, {}, 1.0};
  if (cs.scaled_rope) {
    for (int i = 0; i < d / 2; ++i)  // any positive frequencies: the kernel must take them as given
      p.rope.inv_freq.push_back(std::pow(500000.0, -2.0 * i / d) / (i < d / 4 ? 1.0 : 8.0));
    p.rope.attention_factor = 1.1386;
  }
  HostTables tables;
  std::vector<DevHead> kh, vh;
  for (int h = 0; h < cs.n_kv; ++h) {
    kc.push_back(std::make_unique<HeadCodec>(cs.k(h), d));
    vc.push_back(std::make_unique<HeadCodec>(cs.v(h), d));
    const std::vector<float> k = t::gaussian_rows(cs.T, d, 100 + h), v = t::gaussian_rows(cs.T, d, 200 + h);
    kp.push_back(kc.back()->encode(k.data(), cs.T));
    vp.push_back(vc.back()->encode(v.data(), cs.T));
    kh.push_back(tables.head(*kc.back()));
    vh.push_back(tables.head(*vc.back()));
  }
  std::vector<const uint8_t*> kptr, vptr;
  for (int h = 0; h < cs.n_kv; ++h) {
    p.k_codecs.push_back(kc[static_cast<size_t>(h)].get());
    p.v_codecs.push_back(vc[static_cast<size_t>(h)].get());
    p.k_packed.push_back(kp[static_cast<size_t>(h)].data());
    p.v_packed.push_back(vp[static_cast<size_t>(h)].data());
  }
  std::vector<float> cpu(static_cast<size_t>(cs.n_q) * d), emu(cpu.size(), NAN);
  codec::reference_decode_attention(p, cpu.data());

  const AttnPlan plan = plan_attention(p, kh, vh, cs.sm_count);
  const size_t S = static_cast<size_t>(plan.split.n_splits), nq = static_cast<size_t>(cs.n_q);
  std::vector<float> ws_m(nq * S, NAN), ws_l(nq * S, NAN), ws_acc(nq * S * static_cast<size_t>(plan.max_cdv), NAN);
  const AttnParams P = make_attn_params(
      p, plan,
      {kh.data(), vh.data(), p.k_packed.data(), p.v_packed.data(), q.data(), pos.data(),
       plan.inv_freq.data(), ws_m.data(), ws_l.data(), ws_acc.data()});
  kvq_emu::launch({static_cast<unsigned>(cs.n_kv), static_cast<unsigned>(S), 1}, kThreads, plan.smem_partial,
                  [&] { attention_partial_kernel(P); });
  kvq_emu::launch({static_cast<unsigned>(cs.n_q), 1, 1}, kThreads, plan.smem_combine,
                  [&] { attention_combine_kernel(P, emu.data()); });
  float mx = 0;
  for (float v : cpu) mx = std::max(mx, std::fabs(v));
  for (size_t i = 0; i < cpu.size(); ++i)
    ASSERT_NEAR(emu[i], cpu[i], 2e-4 * (1 + mx)) << cs.name << " splits=" << S << " i=" << i;
}

TEST(KernelEmulation, FusedAttentionMatchesCpuReference) {
  const std::vector<Case> cases = {
      {"tq_k_kivi_v_gqa4", 64, 8, 2, 150, 4, [](int) { return t::tq_uniform(64, 3); },
       [](int) { return t::kivi(Side::kV, 4); }, false, false},
      {"gtq_k_lrh_v_ranks_differ", 32, 4, 2, 70, 8, [](int) { return t::tq_blocks(32, {2, 3, 4}); },
       [](int h) { return t::with_mean(t::lrh(32, 20 - 8 * h, 4, 8 + h, Side::kV)); }, false, false},
      {"lrh_k_with_mean_latent_scores", 64, 4, 1, 40, 2, [](int) { return t::with_mean(t::lrh(64, 24, 4, 2)); },
       [](int) { return t::with_mean(t::lrh(64, 40, 3, 5, Side::kV), -0.4f); }, false, false},
      {"lrh_pre_rope_split_half", 64, 6, 3, 90, 6,
       [](int h) { HeadDecision x = t::with_mean(t::lrh(64, 18 + 14 * h, 3, 4 + h)); x.post_rope = false; return x; },
       [](int) { return t::tq_uniform(64, 4, 9, Side::kV); }, true, false},
      {"tq_pre_rope_interleaved", 16, 2, 1, 33, 1,
       [](int) { HeadDecision x = t::tq_uniform(16, 4); x.post_rope = false; return x; },
       [](int) { return t::kivi(Side::kV, 2); }, true, true},
      {"tq_pre_rope_scaled_freqs_and_factor", 32, 4, 2, 77, 3,
       [](int) { HeadDecision x = t::tq_uniform(32, 3); x.post_rope = false; return x; },
       [](int) { return t::tq_uniform(32, 3, 9, Side::kV); }, true, false, true},
      {"kivi_both_T1", 8, 2, 1, 1, 4, [](int) { return t::kivi(Side::kK, 2); },
       [](int) { return t::kivi(Side::kV, 2); }, false, false},
      {"kivi_k_partial_block", 96, 2, 1, 45, 2, [](int) { return t::kivi(Side::kK, 3); },
       [](int) { return t::tq_blocks(96, {5, 1}); }, false, false},
      // Sliding windows: splits start mid-cache (t_first not a tile multiple), RoPE positions absolute.
      {"window_37_of_150_pre_rope", 64, 8, 2, 150, 4,
       [](int) { HeadDecision x = t::tq_uniform(64, 3); x.post_rope = false; return x; },
       [](int) { return t::kivi(Side::kV, 4); }, true, false, false, 37},
      {"window_1_of_70_latent", 32, 4, 2, 70, 8, [](int) { return t::tq_blocks(32, {2, 3, 4}); },
       [](int h) { return t::with_mean(t::lrh(32, 20 - 8 * h, 4, 8 + h, Side::kV)); }, false, false, false, 1},
      {"tq_nc_k_tq_nc_v_latent", 64, 8, 2, 150, 4, [](int) { return t::norm_corrected(t::tq_blocks(64, {2, 3, 4})); },
       [](int h) { return t::norm_corrected(t::tq_uniform(64, 3, 9 + h, Side::kV)); }, false, false},
      {"tq_nc_pre_rope", 32, 4, 2, 77, 3,
       [](int) { HeadDecision x = t::norm_corrected(t::tq_uniform(32, 2)); x.post_rope = false; return x; },
       [](int) { return t::norm_corrected(t::tq_uniform(32, 1, 9, Side::kV)); }, true, false},
      // Per-head norm correction (kvq-allocate --norm-correction auto): one KV head on, the next
      // off, on each side the other way round; the DevHead of each head carries its own flag.
      {"tq_nc_mixed_per_head_latent", 64, 8, 4, 150, 4,
       [](int h) { HeadDecision x = t::tq_blocks(64, {2, 3, 4}); x.norm_correction = h % 2 == 0; return x; },
       [](int h) { HeadDecision x = t::tq_uniform(64, 2, 9 + h, Side::kV); x.norm_correction = h % 2 == 1; return x; },
       false, false},
      {"tq_nc_mixed_per_head_pre_rope", 32, 4, 2, 77, 3,
       [](int h) { HeadDecision x = t::tq_uniform(32, 1); x.post_rope = false; x.norm_correction = h == 1; return x; },
       [](int h) { HeadDecision x = t::tq_uniform(32, 3, 9, Side::kV); x.norm_correction = h == 0; return x; }, true,
       false},
      // Compact group norms on K (per KV head its own tables and norm-correction flag).
      {"tq_compact_k_latent", 64, 8, 2, 150, 4,
       [](int h) {
         HeadDecision x = t::compact_norms(t::tq_blocks(64, {2, 3, 4}), 64, 8, 5 + h);
         x.norm_correction = h % 2 == 0;
         return x;
       },
       [](int h) { return t::norm_corrected(t::tq_uniform(64, 3, 9 + h, Side::kV)); }, false, false},
      {"tq_compact_post_rope", 32, 4, 2, 77, 3,
       [](int h) { return t::norm_corrected(t::compact_norms(t::tq_blocks(32, {1, 3}), 32, 5, 8 + h)); },
       [](int) { return t::tq_uniform(32, 2, 9, Side::kV); }, true, true},
      {"window_wider_than_cache", 16, 2, 1, 33, 1, [](int) { return t::kivi(Side::kK, 3); },
       [](int) { return t::kivi(Side::kV, 2); }, false, false, false, 500},
  };
  for (const Case& c : cases) run_case(c);
}

TEST(KernelEmulation, SplitPlanCoversEveryTokenOnce) {
  for (int T : {1, 2, 63, 64, 65, 1000, 4097, 100000})
    for (int n_kv : {1, 2, 8, 40})
      for (int sms : {1, 16, 132}) {
        const SplitPlan s = plan_splits(T, n_kv, sms);
        ASSERT_GE(s.n_splits, 1);
        EXPECT_GE(s.tokens_per_split * s.n_splits, T);
        EXPECT_LT(s.tokens_per_split * (s.n_splits - 1), T) << "empty last split";
      }
}

}  // namespace
}  // namespace kvq::cuda::detail
