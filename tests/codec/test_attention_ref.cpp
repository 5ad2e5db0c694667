// CPU reference decode attention (the CUDA kernel's oracle): GQA mapping, RoPE, softmax.
#include <gtest/gtest.h>

#include <cmath>

#include "kvq/codec/attention.hpp"
#include "kvq/util/error.hpp"
#include "test_util.hpp"

namespace kvq::codec {
namespace {

TEST(Rope, PreservesNormAndRelativePosition) {
  const int d = 16;
  for (bool inter : {false, true}) {
    RopeSpec rope{true, 10000.0, 0, inter ? RopePairing::kInterleaved : RopePairing::kSplitHalf, {}, 1.0};
    std::vector<float> q = test::gaussian_rows(1, d, 1), k = test::gaussian_rows(1, d, 2);
    auto dot_at = [&](int pq, int pk) {
      std::vector<float> a = q, b = k;
      reference_apply_rope(a.data(), d, pq, rope);
      reference_apply_rope(b.data(), d, pk, rope);
      double s = 0;
      for (int i = 0; i < d; ++i) s += double(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)];
      return s;
    };
    EXPECT_NEAR(dot_at(10, 3), dot_at(107, 100), 1e-4);
    std::vector<float> a = q;
    reference_apply_rope(a.data(), d, 0, rope);
    EXPECT_EQ(a, q);
    reference_apply_rope(a.data(), d, 12345, rope);
    double n0 = 0, n1 = 0;
    for (int i = 0; i < d; ++i) n0 += q[static_cast<size_t>(i)] * q[static_cast<size_t>(i)], n1 += a[static_cast<size_t>(i)] * a[static_cast<size_t>(i)];
    EXPECT_NEAR(n0, n1, 1e-4);
  }
  // Pairing: interleaved rotates (0,1); split-half rotates (0, d/2). Partial rotary leaves the rest.
  std::vector<float> e(d, 0.f);
  e[0] = 1.f;
  std::vector<float> a = e;
  reference_apply_rope(a.data(), d, 1, RopeSpec{true, 10000.0, 0, RopePairing::kInterleaved, {}, 1.0});
  EXPECT_NEAR(a[1], std::sin(1.0), 1e-6);
  a = e;
  reference_apply_rope(a.data(), d, 1, RopeSpec{true, 10000.0, 0, RopePairing::kSplitHalf, {}, 1.0});
  EXPECT_NEAR(a[d / 2], std::sin(1.0), 1e-6);
  std::vector<float> tail(d, 1.f);
  reference_apply_rope(tail.data(), d, 7, RopeSpec{true, 10000.0, 8, RopePairing::kSplitHalf, {}, 1.0});
  for (int i = 8; i < d; ++i) EXPECT_EQ(tail[static_cast<size_t>(i)], 1.f);
}

// Brute force from decoded K/V (with RoPE on pre-RoPE keys) equals the reference; GQA maps query
// head h to KV head h / group.
TEST(ReferenceAttention, MatchesBruteForceWithGqaAndRope) {
  const int d = 32, T = 21, n_kv = 2, n_q = 6;
  std::vector<std::unique_ptr<HeadCodec>> kc, vc;
  std::vector<std::vector<uint8_t>> kp, vp;
  std::vector<std::vector<float>> kdec, vdec;
  AttentionProblem p;
  p.n_q_heads = n_q, p.n_kv_heads = n_kv, p.head_dim = d, p.n_tokens = T;
  const std::vector<float> q = test::gaussian_rows(n_q, d, 50);
  p.q = q.data();
  std::vector<int32_t> pos(T);
  for (int t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = 100 + 3 * t;
  p.positions = pos.data();
  p.rope = RopeSpec{true, 10000.0, 0, RopePairing::kSplitHalf, {}, 1.0};
  for (int h = 0; h < n_kv; ++h) {
    HeadDecision kd = h == 0 ? test::lrh(d, 12, 4) : test::tq_uniform(d, 4);
    kd.post_rope = h == 1;  // head 0 cached pre-RoPE: RoPE applied after decode
    kc.push_back(std::make_unique<HeadCodec>(kd, d));
    vc.push_back(std::make_unique<HeadCodec>(test::kivi(Side::kV, 4), d));
    const std::vector<float> k = test::gaussian_rows(T, d, 60 + h), v = test::gaussian_rows(T, d, 70 + h);
    kp.push_back(kc.back()->encode(k.data(), T));
    vp.push_back(vc.back()->encode(v.data(), T));
    std::vector<float> kd_out(k.size()), vd_out(v.size());
    kc.back()->decode(kp.back().data(), T, kd_out.data());
    vc.back()->decode(vp.back().data(), T, vd_out.data());
    if (h == 0)
      for (int t = 0; t < T; ++t) reference_apply_rope(&kd_out[static_cast<size_t>(t) * d], d, pos[static_cast<size_t>(t)], p.rope);
    kdec.push_back(kd_out);
    vdec.push_back(vd_out);
  }
  for (int h = 0; h < n_kv; ++h) {
    p.k_codecs.push_back(kc[static_cast<size_t>(h)].get());
    p.v_codecs.push_back(vc[static_cast<size_t>(h)].get());
    p.k_packed.push_back(kp[static_cast<size_t>(h)].data());
    p.v_packed.push_back(vp[static_cast<size_t>(h)].data());
  }
  std::vector<float> out(static_cast<size_t>(n_q) * d);
  // Sliding window W: only the last W cached tokens (the query is the newest, T-1).
  for (const int W : {0, 8, 1, 100}) {
  SCOPED_TRACE("window " + std::to_string(W));
  p.window = W;
  const int first = W > 0 && W < T ? T - W : 0;
  reference_decode_attention(p, out.data());
  for (int qh = 0; qh < n_q; ++qh) {
    const int h = qh / (n_q / n_kv);
    std::vector<double> s(T, 0.0);
    double mx = -1e300;
    for (int t = first; t < T; ++t) {
      double acc = 0;
      for (int i = 0; i < d; ++i) acc += double(q[static_cast<size_t>(qh) * d + i]) * kdec[static_cast<size_t>(h)][static_cast<size_t>(t) * d + i];
      s[static_cast<size_t>(t)] = acc / std::sqrt(double(d));
      mx = std::max(mx, s[static_cast<size_t>(t)]);
    }
    double l = 0;
    for (int t = first; t < T; ++t) l += (s[static_cast<size_t>(t)] = std::exp(s[static_cast<size_t>(t)] - mx));
    for (int i = 0; i < d; ++i) {
      double o = 0;
      for (int t = first; t < T; ++t) o += s[static_cast<size_t>(t)] * vdec[static_cast<size_t>(h)][static_cast<size_t>(t) * d + i];
      EXPECT_NEAR(out[static_cast<size_t>(qh) * d + i], o / l, 1e-5) << "qh=" << qh << " i=" << i;
    }
  }
  }
  p.window = 0;
  AttentionProblem bad = p;
  bad.window = -1;
  EXPECT_THROW(reference_decode_attention(bad, out.data()), Error);
  bad = p;
  bad.n_q_heads = 5;
  EXPECT_THROW(reference_decode_attention(bad, out.data()), Error);
  bad = p;
  bad.positions = nullptr;
  EXPECT_THROW(reference_decode_attention(bad, out.data()), Error);
}

}  // namespace
}  // namespace kvq::codec
