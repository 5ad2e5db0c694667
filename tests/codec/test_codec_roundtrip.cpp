// Encoder + CPU reference decoder: error laws per width, independence from tiling, agreement with
// a naive decoder, effective bpd from the bytes, determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kvq/codec/codebook.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/codec/hadamard.hpp"
#include "kvq/codec/layout.hpp"
#include "../../lib/codec/src/small_gemm.hpp"
#include "test_util.hpp"

namespace kvq::codec {
namespace {

using test::gaussian_rows;

const int kDims[] = {8, 64, 96, 128, 256};

double mean_relative_error(const std::vector<float>& x, const std::vector<float>& y, int d) {
  const size_t n = x.size() / static_cast<size_t>(d);
  double s = 0;
  for (size_t t = 0; t < n; ++t) {
    double e = 0, nx = 0;
    for (int i = 0; i < d; ++i) {
      const double a = x[t * d + i], b = y[t * d + i];
      e += (a - b) * (a - b);
      nx += a * a;
    }
    s += e / nx;
  }
  return s / static_cast<double>(n);
}

// TQ-MSE law: E||x - x_hat||^2 / ||x||^2 = per-coordinate MSE of the rotated unit vector, which
// tends to the N(0,1) Lloyd-Max MSE as m grows (unit-vector coordinates have lighter tails; at
// small m the gap is larger). Statistical: 400..4000 vectors, tolerance by m.
TEST(TqRoundTrip, ErrorFollowsLloydMaxTablePerWidth) {
  for (int d : kDims) {
    const int n = std::max(400, 32768 / d);
    const std::vector<float> x = gaussian_rows(n, d, 100 + d, 3.0);
    for (int b = 1; b <= 8; ++b) {
      HeadCodec codec(test::tq_uniform(d, b), d);
      std::vector<float> y(x.size());
      codec.round_trip(x.data(), n, y.data());
      const double ratio = mean_relative_error(x, y, d) / lloyd_max_gaussian(b).mse;
      // measured: d >= 64 in [0.956, 1.006]; d = 8 in [0.82, 0.90]
      const double lo = d >= 64 ? 0.93 : 0.75, hi = d >= 64 ? 1.05 : 1.0;
      EXPECT_GT(ratio, lo) << "d=" << d << " b=" << b;
      EXPECT_LT(ratio, hi) << "d=" << d << " b=" << b;
    }
  }
}

TEST(TqRoundTrip, BlockGroupsEachFollowTheirWidth) {
  const int d = 128, n = 1500;
  const HeadDecision dec = test::tq_blocks(d, {1, 2, 3, 4, 5, 6, 7, 8});
  HeadCodec codec(dec, d);
  const std::vector<float> x = gaussian_rows(n, d, 9);
  std::vector<float> y(x.size());
  codec.round_trip(x.data(), n, y.data());
  for (const TqGroup& g : dec.groups) {
    double e = 0, nx = 0;
    for (int t = 0; t < n; ++t) {
      for (int c : g.dims) {
        const double a = x[static_cast<size_t>(t) * d + c], b = y[static_cast<size_t>(t) * d + c];
        e += (a - b) * (a - b);
        nx += a * a;
      }
    }
    // m = 16 per group: unit-vector coordinates are far from Gaussian tails; generous band.
    const double ratio = e / nx / lloyd_max_gaussian(g.bits).mse;
    EXPECT_GT(ratio, 0.5) << "bits=" << g.bits;
    EXPECT_LT(ratio, 1.1) << "bits=" << g.bits;
  }
}

// The reference decoder against a direct double-precision rho * Pi^T c per token.
TEST(TqRoundTrip, DecoderMatchesNaiveFormula) {
  for (int d : kDims) {
    const HeadDecision dec = test::tq_blocks(d, {3, 2});
    HeadCodec codec(dec, d);
    const int n = 37;
    const std::vector<float> x = gaussian_rows(n, d, 1);
    const std::vector<uint8_t> packed = codec.encode(x.data(), n);
    std::vector<float> y(x.size());
    codec.decode(packed.data(), n, y.data());
    std::vector<uint8_t> codes(static_cast<size_t>(n) * d);
    codec.unpack_codes(packed.data(), n, codes.data());
    for (int t = 0; t < n; ++t) {
      const uint8_t* block = packed.data() + static_cast<size_t>(t) * codec.layout().block_bytes;
      for (size_t g = 0; g < codec.tq_groups().size(); ++g) {
        const auto& G = codec.tq_groups()[g];
        const int m = static_cast<int>(G.dims.size());
        const double rho = layout::f16_to_f32(layout::load_u16le(block + 2 * g));
        for (int i = 0; i < m; ++i) {
          double acc = 0;
          for (int j = 0; j < m; ++j)
            acc += double(G.rotation->matrix[static_cast<size_t>(j) * m + i]) *
                   G.centroids[codes[static_cast<size_t>(t) * d + G.latent_offset + j]];
          EXPECT_NEAR(y[static_cast<size_t>(t) * d + G.dims[static_cast<size_t>(i)]], rho * acc, 1e-5 * (1 + rho))
              << "d=" << d << " t=" << t;
        }
      }
    }
  }
}

// Low rank at full rank with an orthonormal basis: only the uniform quantizer's error remains,
// close to the N(0,1) optimum-step MSE after the Hadamard equalises the coordinates.
TEST(LowRankRoundTrip, FullRankErrorFollowsUniformQuantizer) {
  for (int d : {64, 96, 128}) {
    const int n = 600;
    const std::vector<float> x = gaussian_rows(n, d, 4);
    for (int b = 2; b <= 8; ++b) {
      HeadCodec codec(test::lrh(d, d, b), d);
      std::vector<float> y(x.size());
      codec.round_trip(x.data(), n, y.data());
      const double ratio = mean_relative_error(x, y, d) / optimal_uniform_gaussian(b).mse;
      EXPECT_GT(ratio, 0.85) << "d=" << d << " b=" << b;
      EXPECT_LT(ratio, 1.15) << "d=" << d << " b=" << b;
    }
  }
}

// Truncation + quantization: data with a decaying spectrum in the basis' own coordinates; error
// = sum_{i>r} lambda_i + q_b sum_{i<=r} lambda_i (Bennett form with the exact uniform MSE).
TEST(LowRankRoundTrip, DistortionModelWithTruncation) {
  const int d = 128, n = 3000;
  const uint64_t seed = 21;
  // x = U_full diag(sqrt(lambda)) g; test::lrh's basis is the first r columns of U_full.
  const std::vector<float> full = test::random_basis(d, d, seed + 1000);
  std::vector<double> lambda(d);
  for (int i = 0; i < d; ++i) lambda[static_cast<size_t>(i)] = std::exp(-i / 20.0);
  Rng rng(5);
  std::vector<float> x(static_cast<size_t>(n) * d, 0.f);
  std::vector<double> c(static_cast<size_t>(d));
  for (int t = 0; t < n; ++t) {
    for (int k = 0; k < d; ++k) c[static_cast<size_t>(k)] = std::sqrt(lambda[static_cast<size_t>(k)]) * rng.normal();
    for (int i = 0; i < d; ++i) {
      double s = 0;
      for (int k = 0; k < d; ++k) s += c[static_cast<size_t>(k)] * full[static_cast<size_t>(i) * d + k];
      x[static_cast<size_t>(t) * d + i] = static_cast<float>(s);
    }
  }
  for (int r : {16, 18, 33, 64, 96}) {
    for (int b : {2, 3, 4}) {
      const HeadDecision dec = test::lrh(d, r, b, seed);
      HeadCodec codec(dec, d);
      std::vector<float> y(x.size());
      codec.round_trip(x.data(), n, y.data());
      double err = 0;
      for (size_t i = 0; i < x.size(); ++i) err += double(x[i] - y[i]) * (x[i] - y[i]);
      err /= n;
      double tail = 0, head = 0;
      for (int i = 0; i < d; ++i) (i < r ? head : tail) += lambda[static_cast<size_t>(i)];
      const double model = tail + optimal_uniform_gaussian(b).mse * head;
      EXPECT_NEAR(err / model, 1.0, 0.08) << "r=" << r << " b=" << b;
    }
  }
}

TEST(LowRankRoundTrip, MeanIsAddedBack) {
  const int d = 64;
  HeadDecision dec = test::lrh(d, 8, 4);
  for (int i = 0; i < d; ++i) dec.mean[static_cast<size_t>(i)] = 10.f + i;
  HeadCodec codec(dec, d);
  std::vector<float> x(static_cast<size_t>(2) * d);
  for (int i = 0; i < d; ++i) x[static_cast<size_t>(i)] = x[static_cast<size_t>(d + i)] = dec.mean[static_cast<size_t>(i)];
  std::vector<float> y(x.size());
  codec.round_trip(x.data(), 2, y.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(y[i], x[i]);
}

// KIVI: every value within half a step of the stored fp16 scale (+ fp16 rounding of the zero).
TEST(KiviRoundTrip, WithinHalfStep) {
  for (int d : kDims) {
    for (Side side : {Side::kK, Side::kV}) {
      for (int b = 1; b <= 8; ++b) {
        const int n = 70;  // K: two full blocks of 32 and a partial one
        const std::vector<float> x = gaussian_rows(n, d, 3 + b);
        HeadCodec codec(test::kivi(side, b), d);
        const std::vector<uint8_t> packed = codec.encode(x.data(), n);
        std::vector<float> y(x.size());
        codec.decode(packed.data(), n, y.data());
        for (int t = 0; t < n; ++t)
          for (int c = 0; c < d; ++c) {
            const uint8_t* rec = side == Side::kK
                                     ? packed.data() + static_cast<size_t>(t / 32) * codec.layout().block_bytes + 4 * c
                                     : packed.data() + static_cast<size_t>(t) * codec.layout().block_bytes + 4 * (c / 32);
            const float scale = layout::f16_to_f32(layout::load_u16le(rec));
            const float zero = layout::f16_to_f32(layout::load_u16le(rec + 2));
            const size_t i = static_cast<size_t>(t) * d + c;
            EXPECT_LE(std::fabs(x[i] - y[i]), 0.5f * scale + std::fabs(zero) * 1e-3f + 1e-3f * scale + 1e-6f)
                << "d=" << d << " b=" << b << " t=" << t << " c=" << c;
          }
      }
    }
  }
}

HeadDecision decision_for(int kind, int d, int b) {
  switch (kind) {
    case 0: return test::tq_uniform(d, b);
    case 1: return test::tq_blocks(d, {b, std::max(1, b - 1)});
    case 2: return test::lrh(d, std::max(1, d / 2 - 2), b);
    case 3: return test::kivi(Side::kK, b);
    default: return test::kivi(Side::kV, b);
  }
}

// The effective bpd a layout reports equals the bytes the encoder actually writes.
TEST(Codec, EffectiveBpdFromActualBytes) {
  for (int kind = 0; kind < 5; ++kind)
    for (int d : kDims)
      for (int b = 1; b <= 8; ++b) {
        HeadCodec codec(decision_for(kind, d, b), d);
        const int n = 64;  // whole KIVI K blocks
        const std::vector<float> x = gaussian_rows(n, d, 2);
        const std::vector<uint8_t> packed = codec.encode(x.data(), n);
        EXPECT_DOUBLE_EQ(packed.size() * 8.0 / (n * d), codec.effective_bpd())
            << "kind=" << kind << " d=" << d << " b=" << b;
        EXPECT_DOUBLE_EQ(effective_bpd(decision_for(kind, d, b), d), codec.effective_bpd());
      }
  // TQ uniform at d=128, 3 bits: 48 code bytes + 2 norm bytes per token.
  EXPECT_DOUBLE_EQ(HeadCodec(test::tq_uniform(128, 3), 128).effective_bpd(), 3.125);
}

// Decoding is per token: any split of the token range gives the same floats, and codes/latents
// agree with each other.
TEST(Codec, DecodeIndependentOfBatching) {
  for (int kind = 0; kind < 5; ++kind)
    for (int d : {8, 96}) {
      HeadCodec codec(decision_for(kind, d, 3), d);
      const int n = 75;
      const std::vector<float> x = gaussian_rows(n, d, 6);
      const std::vector<uint8_t> packed = codec.encode(x.data(), n);
      std::vector<float> all(x.size()), one(x.size());
      codec.decode(packed.data(), n, all.data());
      const int tpb = static_cast<int>(codec.layout().tokens_per_block);
      for (int t = 0; t < n; t += tpb) {
        const int nt = std::min(tpb, n - t);
        codec.decode(packed.data() + static_cast<size_t>(t / tpb) * codec.layout().block_bytes, nt,
                     one.data() + static_cast<size_t>(t) * d);
      }
      EXPECT_EQ(all, one) << "kind=" << kind << " d=" << d;
      // Encoding is deterministic.
      EXPECT_EQ(codec.encode(x.data(), n), packed);
    }
}

TEST(Codec, ZeroVectorsDecodeToZero) {
  for (int kind = 0; kind < 5; ++kind) {
    const int d = 64;
    HeadCodec codec(decision_for(kind, d, 4), d);
    std::vector<float> x(static_cast<size_t>(3) * d, 0.f), y(x.size(), 1.f);
    codec.round_trip(x.data(), 3, y.data());
    for (float v : y) EXPECT_EQ(v, 0.f) << "kind=" << kind;
  }
}

TEST(Codec, QuantizeDequantizeConvenience) {
  const int d = 64, n = 10;
  const std::vector<float> x = gaussian_rows(n, d, 12);
  const HeadDecision dec = test::tq_uniform(d, 4);
  const std::vector<float> y = quantize_dequantize(dec, d, x.data(), n);
  std::vector<float> y2(x.size());
  HeadCodec(dec, d).round_trip(x.data(), n, y2.data());
  EXPECT_EQ(y, y2);
}

TEST(SmallGemm, MatchesNaiveOnAwkwardShapes) {
  Rng rng(3);
  for (int m : {1, 5, 6, 8, 13, 32})
    for (int k : {1, 3, 8, 33, 128})
      for (int n : {1, 7, 8, 16, 17, 33, 96, 128})
        for (bool acc : {false, true}) {
          std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n), c(static_cast<size_t>(m) * n);
          for (float& v : a) v = static_cast<float>(rng.normal());
          for (float& v : b) v = static_cast<float>(rng.normal());
          for (float& v : c) v = static_cast<float>(rng.normal());
          std::vector<float> want = c;
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
              double s = acc ? c[static_cast<size_t>(i) * n + j] : 0.0;
              for (int p = 0; p < k; ++p) s += double(a[static_cast<size_t>(i) * k + p]) * b[static_cast<size_t>(p) * n + j];
              want[static_cast<size_t>(i) * n + j] = static_cast<float>(s);
            }
          detail::small_gemm(a.data(), k, b.data(), n, c.data(), n, m, k, n, acc);
          for (size_t i = 0; i < c.size(); ++i)
            ASSERT_NEAR(c[i], want[i], 1e-4 * (1 + std::fabs(want[i])))
                << "m=" << m << " k=" << k << " n=" << n << " acc=" << acc;
        }
}

// The encoder's GEMM rounds every product and every partial sum (no FMA), in order p = 0..k-1:
// bit-identical to this scalar loop on any CPU, whichever vector variant runs.
TEST(SmallGemm, ExactVariantIsBitIdenticalToSequentialScalar) {
  Rng rng(4);
  for (int m : {1, 7, 8, 32})
    for (int k : {1, 5, 64, 128})
      for (int n : {3, 16, 33, 96, 128}) {
        std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n), c(static_cast<size_t>(m) * n);
        for (float& v : a) v = static_cast<float>(rng.normal());
        for (float& v : b) v = static_cast<float>(rng.normal());
        std::vector<float> want(c.size());
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j) {
            float s = 0.f;
            for (int p = 0; p < k; ++p) {
              volatile float prod = a[static_cast<size_t>(i) * k + p] * b[static_cast<size_t>(p) * n + j];
              s = s + prod;
            }
            want[static_cast<size_t>(i) * n + j] = s;
          }
        detail::small_gemm_exact(a.data(), k, b.data(), n, c.data(), n, m, k, n, false);
        ASSERT_EQ(c, want) << "m=" << m << " k=" << k << " n=" << n;
      }
}

}  // namespace
}  // namespace kvq::codec
