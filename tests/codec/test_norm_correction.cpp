// TQ-MSE norm correction and unrotated groups (allocation version 2) against an independent
// double-precision implementation of the reference decode written here: x^ = rho~ Pi^T (c / ||c||),
// and, with the correction off, x^ = rho~ Pi^T c; Pi = I for a group with TqRotation::kIdentity. Only the Haar rotation comes from kvq (haar_orthogonal, the
// matrix a recorded seed means); the Lloyd-Max codebook, the nearest-centroid choice, the
// renormalisation and the inverse rotation are computed below from the formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvq/codec/codec.hpp"
#include "kvq/codec/rotation.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/format/packed_layout.hpp"
#include "test_util.hpp"

namespace kvq::codec {
namespace {

namespace t = test;

// Lloyd-Max for N(0, 1) by plain Lloyd iteration with closed-form cell moments:
// P(a<X<b) = Phi(b) - Phi(a), E[X; a<X<b] = phi(a) - phi(b).
std::vector<double> lloyd_max_n01(int bits) {
  const int n = 1 << bits;
  auto phi = [](double x) { return std::isinf(x) ? 0.0 : std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); };
  auto cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  std::vector<double> c(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) c[static_cast<size_t>(i)] = -3.0 + 6.0 * (i + 0.5) / n;
  for (int it = 0; it < 100000; ++it) {
    double move = 0;
    std::vector<double> next(c.size());
    for (int i = 0; i < n; ++i) {
      const double a = i == 0 ? -INFINITY : 0.5 * (c[static_cast<size_t>(i) - 1] + c[static_cast<size_t>(i)]);
      const double b = i == n - 1 ? INFINITY : 0.5 * (c[static_cast<size_t>(i)] + c[static_cast<size_t>(i) + 1]);
      next[static_cast<size_t>(i)] = (phi(a) - phi(b)) / (cdf(b) - cdf(a));
      move = std::max(move, std::fabs(next[static_cast<size_t>(i)] - c[static_cast<size_t>(i)]));
    }
    c.swap(next);
    if (move < 1e-13) break;
  }
  return c;
}

TEST(NormCorrectionReference, OwnCodebookIsTheKnownLloydMax) {
  // REFERENCE-FACTS: positive centroids of N(0,1).
  const std::vector<std::vector<double>> known = {
      {0.797885}, {0.452780, 1.510418}, {0.245094, 0.756005, 1.343909, 2.151946},
      {0.128395, 0.388048, 0.656759, 0.942340, 1.256231, 1.618046, 2.069017, 2.732590}};
  for (int b = 1; b <= 4; ++b) {
    const std::vector<double> c = lloyd_max_n01(b);
    const size_t half = c.size() / 2;
    for (size_t i = 0; i < half; ++i) EXPECT_NEAR(c[half + i], known[static_cast<size_t>(b) - 1][i], 2e-6) << b;
  }
}

// One group's reference decode from the stored norm and the test's own quantization of u.
struct RefGroup {
  std::vector<double> x_hat;  // m values, the group's coordinates in dims order
  std::vector<int> codes;
  double min_margin = INFINITY;  // smallest |u_i - threshold| (codes may flip below float rounding)
};

RefGroup reference_group(const std::vector<double>& pi, int m, const std::vector<double>& cent_n01, double rho_stored,
                         const std::vector<double>& x, bool norm_correction) {
  const double s = 1.0 / std::sqrt(static_cast<double>(m));
  std::vector<double> cent(cent_n01.size());
  for (size_t i = 0; i < cent.size(); ++i) cent[i] = cent_n01[i] * s;  // N(0, 1/m)
  RefGroup r;
  std::vector<double> c(static_cast<size_t>(m));
  for (int i = 0; i < m; ++i) {
    double u = 0;
    for (int j = 0; j < m; ++j) u += pi[static_cast<size_t>(i) * m + j] * x[static_cast<size_t>(j)];
    u = rho_stored > 0 ? u / rho_stored : 0.0;
    int best = 0;
    for (int k = 1; k < static_cast<int>(cent.size()); ++k)
      if (std::fabs(u - cent[static_cast<size_t>(k)]) < std::fabs(u - cent[static_cast<size_t>(best)])) best = k;
    for (size_t k = 0; k + 1 < cent.size(); ++k)
      r.min_margin = std::min(r.min_margin, std::fabs(u - 0.5 * (cent[k] + cent[k + 1])));
    r.codes.push_back(best);
    c[static_cast<size_t>(i)] = cent[static_cast<size_t>(best)];
  }
  double norm = 0;
  for (double v : c) norm += v * v;
  norm = std::sqrt(norm);
  const double scale = norm_correction ? rho_stored / norm : rho_stored;
  r.x_hat.assign(static_cast<size_t>(m), 0.0);
  for (int j = 0; j < m; ++j)  // x^ = scale * Pi^T c
    for (int i = 0; i < m; ++i) r.x_hat[static_cast<size_t>(j)] += pi[static_cast<size_t>(i) * m + j] * c[static_cast<size_t>(i)] * scale;
  return r;
}

void check_against_reference(const HeadDecision& dec, int d, int n, uint64_t seed) {
  const std::vector<float> x = t::gaussian_rows(n, d, seed, 1.7);
  const HeadCodec codec(dec, d);
  const std::vector<uint8_t> packed = codec.encode(x.data(), n);
  std::vector<float> y(static_cast<size_t>(n) * d);
  codec.decode(packed.data(), n, y.data());
  std::vector<float> rt(y.size());
  codec.round_trip(x.data(), n, rt.data());
  EXPECT_EQ(rt, y) << "round_trip = encode + decode";
  std::vector<uint8_t> codes(static_cast<size_t>(n) * d);
  codec.unpack_codes(packed.data(), n, codes.data());

  int compared = 0;
  for (int tok = 0; tok < n; ++tok) {
    const uint8_t* block = packed.data() + static_cast<size_t>(tok) * codec.layout().block_bytes;
    std::vector<double> ref(static_cast<size_t>(d));
    double xnorm = 0;
    bool codes_agree = true;
    size_t off = 0;
    for (size_t g = 0; g < dec.groups.size(); ++g) {
      const TqGroup& G = dec.groups[g];
      const int m = static_cast<int>(G.dims.size());
      std::vector<double> xg(static_cast<size_t>(m));
      double n2 = 0;
      for (int j = 0; j < m; ++j) {
        xg[static_cast<size_t>(j)] = x[static_cast<size_t>(tok) * d + G.dims[static_cast<size_t>(j)]];
        n2 += xg[static_cast<size_t>(j)] * xg[static_cast<size_t>(j)];
      }
      xnorm += n2;
      // The stored norm is fp16: within half an fp16 ulp (2^-11 relative) of the true one.
      const double rho = layout::f16_to_f32(layout::load_u16le(block + 2 * g));
      ASSERT_NEAR(rho, std::sqrt(n2), std::sqrt(n2) * std::ldexp(1.0, -11) + 1e-7);
      std::vector<double> pi(static_cast<size_t>(m) * m, 0.0);
      if (G.rotation == TqRotation::kIdentity)
        for (int i = 0; i < m; ++i) pi[static_cast<size_t>(i) * m + i] = 1.0;
      else
        pi = haar_orthogonal(G.rotation_seed, m);
      const RefGroup r = reference_group(pi, m, lloyd_max_n01(G.bits), rho, xg, dec.norm_correction);
      for (int i = 0; i < m; ++i) {
        const int kvq_code = codes[static_cast<size_t>(tok) * d + off + static_cast<size_t>(i)];
        // float encoding may pick the other side of a threshold only within float rounding of it
        if (kvq_code != r.codes[static_cast<size_t>(i)]) {
          codes_agree = false;
          EXPECT_LT(r.min_margin, 1e-5) << "code differs away from a threshold, token " << tok;
        }
      }
      for (int j = 0; j < m; ++j) ref[static_cast<size_t>(G.dims[static_cast<size_t>(j)])] = r.x_hat[static_cast<size_t>(j)];
      off += static_cast<size_t>(m);
    }
    if (!codes_agree) continue;
    ++compared;
    // Float rotation tables and float accumulation against double: 1e-5 of the vector's norm.
    const double tol = 1e-5 * (1 + std::sqrt(xnorm));
    for (int i = 0; i < d; ++i)
      ASSERT_NEAR(y[static_cast<size_t>(tok) * d + i], ref[static_cast<size_t>(i)], tol)
          << kvq::decision_name(dec) << " d=" << d << " token " << tok << " dim " << i;
  }
  EXPECT_GE(compared, n * 9 / 10) << "too few tokens with identical codes to compare";
}

TEST(NormCorrectionReference, DecodeMatchesIndependentDoubleImplementation) {
  for (int d : {8, 64, 96, 128}) {
    for (int b = 1; b <= 4; ++b)
      for (bool nc : {false, true}) {
        HeadDecision dec = t::tq_uniform(d, b, 11 + b);
        dec.norm_correction = nc;
        check_against_reference(dec, d, 40, 3 + d + b);
      }
    for (bool nc : {false, true})  // Block-GTQ shaped: groups of 2 .. d/2 coordinates
      for (int rotate_below : {0, 3}) {  // --rotate-below 3: the 1- and 2-bit groups unrotated
        HeadDecision dec = t::tq_blocks(d, {1, 3, 2, 4});
        dec.norm_correction = nc;
        for (TqGroup& g : dec.groups)
          if (g.bits < rotate_below) g.rotation = TqRotation::kIdentity;
        check_against_reference(dec, d, 40, 99 + d);
      }
  }
}

// The corrected decode has exactly the stored group norms; the uncorrected one is shorter by
// ||c|| (Lloyd-Max shrinks: E||c||^2 = 1 - MSE, so clearly < 1 at 1 bit).
TEST(NormCorrectionReference, CorrectedGroupsKeepTheStoredNorm) {
  const int d = 64, n = 50;
  const std::vector<float> x = t::gaussian_rows(n, d, 5);
  for (int b : {1, 2, 3}) {
    const HeadDecision plain = t::tq_blocks(d, {b, b + 1});
    const HeadDecision nc = t::norm_corrected(plain);
    const HeadCodec cp(plain, d), cn(nc, d);
    const std::vector<uint8_t> packed = cp.encode(x.data(), n);
    ASSERT_EQ(cn.encode(x.data(), n), packed) << "codes do not depend on the setting";
    std::vector<float> yp(static_cast<size_t>(n) * d), yn(yp.size());
    cp.decode(packed.data(), n, yp.data());
    cn.decode(packed.data(), n, yn.data());
    double shrink = 0;
    int count = 0;
    for (int tok = 0; tok < n; ++tok)
      for (size_t g = 0; g < nc.groups.size(); ++g) {
        const double rho = layout::f16_to_f32(
            layout::load_u16le(packed.data() + static_cast<size_t>(tok) * cp.layout().block_bytes + 2 * g));
        double np = 0, nn = 0;
        for (int i : nc.groups[g].dims) {
          np += double(yp[static_cast<size_t>(tok) * d + i]) * yp[static_cast<size_t>(tok) * d + i];
          nn += double(yn[static_cast<size_t>(tok) * d + i]) * yn[static_cast<size_t>(tok) * d + i];
        }
        EXPECT_NEAR(std::sqrt(nn), rho, 2e-6 * rho) << "b=" << b << " token " << tok;
        // At 1 bit every |c_i| = sqrt(2/pi)/sqrt(m): ||c|| = sqrt(2/pi) = 0.797885 for every token.
        if (nc.groups[g].bits == 1) {
          EXPECT_NEAR(std::sqrt(np) / rho, std::sqrt(2 / M_PI), 1e-5) << "token " << tok;
        }
        shrink += std::sqrt(np) / rho;
        ++count;
      }
    EXPECT_LT(shrink / count, 1.0) << "Lloyd-Max centroids shrink: E||c||^2 = 1 - MSE";
  }
}

}  // namespace
}  // namespace kvq::codec
