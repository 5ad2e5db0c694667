// Compact group norms (HeadDecision::ratio_bits, allocation version 4): the 16-bit record and the
// decoded vectors against a double-precision reading of schemas/packed-layout.md written here
// (levels, nearest level, argmax ratio index, LSB-first codes, centroids, inverse rotation), the
// block size against uniform TQ-MSE's, the validator's refusals, and the fit against planted
// ratio vectors and its own reported error recomputed from the codec's bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/codec/codebook.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/codec/group_norms.hpp"
#include "kvq/codec/rotation.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/rng.hpp"
#include "test_util.hpp"

namespace kvq::codec {
namespace {

namespace t = test;

// Rows whose per-row scale spans 2^-2 .. 2^3 and whose coordinates have unequal variances.
std::vector<float> varied_rows(int n, int d, uint64_t seed) {
  std::vector<float> x = t::gaussian_rows(n, d, seed);
  Rng rng(seed ^ 0x5eed);
  for (int r = 0; r < n; ++r) {
    const double s = std::exp2(5.0 * rng.uniform() - 2.0);
    for (int i = 0; i < d; ++i) x[size_t(r) * d + i] *= float(s * (0.5 + 0.25 * (i % 7)));
  }
  return x;
}

// Hand-made compact tables: 2^k random non-negative unit rows.
HeadDecision with_tables(HeadDecision dec, int k, float lo, float step, uint64_t seed) {
  dec.ratio_bits = k;
  dec.norm_log2_lo = lo;
  dec.norm_log2_step = step;
  const size_t G = dec.groups.size();
  Rng rng(seed);
  dec.ratio_codebook.resize((size_t{1} << k) * G);
  for (size_t j = 0; j < (size_t{1} << k); ++j) {
    double n2 = 0;
    for (size_t g = 0; g < G; ++g) {
      const double v = std::fabs(rng.normal()) + 0.05;
      dec.ratio_codebook[j * G + g] = float(v);
      n2 += v * v;
    }
    for (size_t g = 0; g < G; ++g) dec.ratio_codebook[j * G + g] = float(dec.ratio_codebook[j * G + g] / std::sqrt(n2));
  }
  return dec;
}

uint32_t read_bits(const uint8_t* stream, uint64_t pos, int bits) {  // LSB-first, bit by bit
  uint32_t v = 0;
  for (int b = 0; b < bits; ++b) v |= uint32_t((stream[(pos + b) / 8] >> ((pos + b) % 8)) & 1u) << b;
  return v;
}

void check_against_reference(const HeadDecision& dec, int d, int n, uint64_t seed) {
  HeadCodec codec(dec, d);
  const std::vector<float> x = varied_rows(n, d, seed);
  const std::vector<uint8_t> packed = codec.encode(x.data(), n);
  std::vector<float> y(size_t(n) * d);
  codec.decode(packed.data(), n, y.data());
  const size_t G = dec.groups.size();
  const int k = dec.ratio_bits, nb = 16 - k;
  // Levels from the spec, in double, then rounded to float.
  std::vector<double> levels(size_t{1} << nb);
  levels[0] = 0;
  for (size_t q = 1; q < levels.size(); ++q)
    levels[q] = double(float(std::pow(2.0, double(dec.norm_log2_lo) + double(q - 1) * double(dec.norm_log2_step))));
  const size_t block = codec.layout().block_bytes;
  ASSERT_EQ(packed.size(), block * size_t(n));
  int code_mismatch = 0, codes_total = 0;
  for (int r = 0; r < n; ++r) {
    const float* xr = &x[size_t(r) * d];
    const uint8_t* blk = &packed[size_t(r) * block];
    const uint32_t w = uint32_t(blk[0]) | (uint32_t(blk[1]) << 8);
    const uint32_t q = w & ((1u << nb) - 1), j = w >> nb;
    std::vector<double> rho_g(G);
    double n2 = 0;
    for (size_t g = 0; g < G; ++g) {
      for (int c : dec.groups[g].dims) rho_g[g] += double(xr[c]) * xr[c];
      n2 += rho_g[g];
      rho_g[g] = std::sqrt(rho_g[g]);
    }
    const double rho = double(float(std::sqrt(n2)));
    size_t q_best = 0;
    for (size_t i = 1; i < levels.size(); ++i)
      if (std::fabs(levels[i] - rho) < std::fabs(levels[q_best] - rho)) q_best = i;
    ASSERT_EQ(q, q_best) << "row " << r << " rho " << rho;
    uint32_t j_best = 0;
    double best = -1;
    for (uint32_t c = 0; c < (1u << k); ++c) {
      double dot = 0;
      for (size_t g = 0; g < G; ++g) dot += rho_g[g] / std::sqrt(n2) * dec.ratio_codebook[c * G + g];
      if (dot > best + 1e-12) best = dot, j_best = c;
    }
    ASSERT_EQ(j, j_best) << "row " << r;
    // Each group: codes = nearest centroid of the scaled rotated coordinates; decode from them.
    uint64_t pos = 0;
    for (size_t g = 0; g < G; ++g) {
      const TqGroup& grp = dec.groups[g];
      const int m = int(grp.dims.size());
      const float rho_hat = float(levels[q]) * dec.ratio_codebook[j * G + g];
      const auto rot = grp.rotation == TqRotation::kIdentity ? identity_rotation(m) : haar_rotation(grp.rotation_seed, m);
      const ScaledCodebook cb = group_codebook(grp.codebook, grp.bits, m);
      const double scale = double(rho_hat);
      std::vector<double> c(static_cast<size_t>(m));
      double c2 = 0;
      for (int i = 0; i < m; ++i) {
        double u = 0;
        for (int p = 0; p < m; ++p) u += double(rot->matrix[size_t(i) * m + p]) * xr[grp.dims[size_t(p)]];
        u = scale > 0 ? u / scale : 0;
        size_t best_c = 0;
        for (size_t z = 1; z < cb.centroids.size(); ++z)
          if (std::fabs(cb.centroids[z] - u) < std::fabs(cb.centroids[best_c] - u)) best_c = z;
        const uint32_t code = read_bits(blk + 2, pos + uint64_t(i) * grp.bits, grp.bits);
        ++codes_total;
        if (code != best_c) ++code_mismatch;  // only at a cell boundary (float vs double u)
        c[size_t(i)] = cb.centroids[code];
        c2 += c[size_t(i)] * c[size_t(i)];
      }
      pos += uint64_t(m) * grp.bits;
      const double s = dec.norm_correction ? double(rho_hat) / std::sqrt(c2) : double(rho_hat);
      for (int p = 0; p < m; ++p) {
        double v = 0;
        for (int i = 0; i < m; ++i) v += double(rot->matrix[size_t(i) * m + p]) * c[size_t(i)];
        const float got = y[size_t(r) * d + grp.dims[size_t(p)]];
        ASSERT_NEAR(got, s * v, 1e-5 * (1 + std::sqrt(n2))) << "row " << r << " group " << g << " coord " << p;
      }
    }
  }
  EXPECT_LE(code_mismatch, codes_total / 1000) << code_mismatch << " of " << codes_total << " codes";
}

TEST(CompactGroupNorms, RecordCodesAndDecodeMatchTheSpec) {
  // lo / step so that the rows' norms (about 2..400) fall inside the levels and, at 8 level bits,
  // neighbouring levels are ~2.7 % apart.
  for (int k : {1, 3, 8}) {
    const float step = k == 8 ? 0.038f : 0.002f;
    for (bool nc : {false, true}) {
      HeadDecision dec = with_tables(t::tq_blocks(64, {2, 3, 4, 5}), k, -2.f, step, 17 + k);
      dec.norm_correction = nc;
      SCOPED_TRACE("k=" + std::to_string(k) + " nc=" + std::to_string(nc));
      check_against_reference(dec, 64, 120, 3 + k);
    }
  }
  // Unrotated groups and the exact codebook take the same record.
  HeadDecision dec = t::rotate_below(with_tables(t::tq_blocks(32, {1, 2, 3}), 6, -3.f, 0.02f, 9), 3);
  for (auto& g : dec.groups)
    if (g.rotation == TqRotation::kHaar) g.codebook = TqCodebook::kSphere;
  check_against_reference(dec, 32, 64, 4);
}

TEST(CompactGroupNorms, StoresExactlyWhatUniformStores) {
  // d * B code bits either way; compact adds one 16-bit record (uniform's one fp16 norm), fp16
  // norms add one per group. align2(2 + ceil(bits / 8)) bytes, from the spec.
  for (int d : {64, 128}) {
    for (int B : {2, 3, 4}) {
      const HeadDecision uni = t::tq_uniform(d, B);
      // Widths B-1, B, B+1 over blocks in turn: mean B when the block count is a multiple of 3;
      // otherwise compare against the decision's own code bits.
      HeadDecision gtq = t::tq_blocks(d, {B - 1, B, B + 1});
      uint64_t code_bits = 0;
      for (const auto& g : gtq.groups) code_bits += uint64_t(g.dims.size()) * g.bits;
      const HeadDecision cmp = t::compact_norms(gtq, d, 8);
      auto align2 = [](uint64_t b) { return (b + 1) / 2 * 2; };
      EXPECT_EQ(layout::layout_for(cmp, d).block_bytes, align2(2 + (code_bits + 7) / 8)) << d << " " << B;
      EXPECT_EQ(layout::layout_for(gtq, d).block_bytes, align2(2 * 3 + (code_bits + 7) / 8)) << d << " " << B;
      EXPECT_EQ(layout::layout_for(uni, d).block_bytes, align2(2 + (uint64_t(d) * B + 7) / 8));
      if (code_bits == uint64_t(d) * B)
        EXPECT_EQ(layout::effective_bpd(cmp, d), layout::effective_bpd(uni, d)) << d << " " << B;
    }
  }
}

TEST(CompactGroupNorms, ValidatorNamesTheField) {
  const HeadDecision good = with_tables(t::tq_blocks(16, {2, 3}), 4, -3.f, 0.01f, 1);
  EXPECT_NO_THROW(layout::layout_for(good, 16));
  auto refused = [&](HeadDecision dec, const std::string& field) {
    try {
      layout::layout_for(dec, 16);
      ADD_FAILURE() << "accepted, expected a refusal naming " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  HeadDecision d1 = good;
  d1.ratio_bits = 9;
  refused(d1, "ratio_bits");
  refused(with_tables(t::tq_uniform(16, 3), 4, -3.f, 0.01f, 1), "ratio_bits");  // one group
  HeadDecision d2 = good;
  d2.norm_log2_step = 0.f;
  refused(d2, "norm_log2_step");
  HeadDecision d3 = good;
  d3.norm_log2_step = NAN;
  refused(d3, "norm_log2_step");
  HeadDecision d4 = good;
  d4.norm_log2_step = 0.1f;  // 2^(-3 + 4094 * 0.1) overflows a float
  refused(d4, "norm_log2_lo");
  HeadDecision d5 = good;
  d5.ratio_codebook.pop_back();
  refused(d5, "ratio_codebook");
  HeadDecision d6 = good;
  d6.ratio_codebook[3] = -0.5f;
  refused(d6, "ratio_codebook");
  HeadDecision d7 = good;
  d7.ratio_codebook[0] = NAN;
  refused(d7, "ratio_codebook");
}

TEST(CompactGroupNorms, FitFindsPlantedRatiosAndReportsItsOwnError) {
  // Rows built from exactly 4 ratio vectors (k = 2): the fit must find each one, so the only
  // error left is the head norm's level rounding, at most a half step in log2.
  const int d = 32;
  HeadDecision base = t::tq_blocks(d, {2, 3, 4, 5});  // 4 groups of 8 coordinates
  const size_t G = base.groups.size();
  const double planted[4][4] = {{0.5, 0.5, 0.5, 0.5}, {0.9, 0.3, 0.3, 0.1}, {0.1, 0.2, 0.4, 0.89}, {0.7, 0.7, 0.1, 0.1}};
  const int n = 2000;
  std::vector<float> x(size_t(n) * d);
  Rng rng(77);
  for (int r = 0; r < n; ++r) {
    const double* p = planted[r % 4];
    double pn = 0;
    for (size_t g = 0; g < G; ++g) pn += p[g] * p[g];
    const double rho = std::exp2(6.0 * rng.uniform() - 1.0);
    for (size_t g = 0; g < G; ++g) {
      std::vector<double> u(base.groups[g].dims.size());
      double un = 0;
      for (double& v : u) un += (v = rng.normal()) * v;
      for (size_t i = 0; i < u.size(); ++i)
        x[size_t(r) * d + base.groups[g].dims[i]] = float(rho * p[g] / std::sqrt(pn) * u[i] / std::sqrt(un));
    }
  }
  HeadDecision dec = base;
  const CompactNormFit fit = fit_compact_group_norms(dec, d, x.data(), n, 2, 123);
  EXPECT_EQ(fit.rows, n);
  ASSERT_EQ(dec.ratio_codebook.size(), 4 * G);
  for (const auto& p : planted) {
    double pn = 0;
    for (size_t g = 0; g < G; ++g) pn += p[g] * p[g];
    double best = 0;
    for (size_t j = 0; j < 4; ++j) {
      double dot = 0;
      for (size_t g = 0; g < G; ++g) dot += p[g] / std::sqrt(pn) * dec.ratio_codebook[j * G + g];
      best = std::max(best, dot);
    }
    EXPECT_GT(best, 1 - 1e-6) << "a planted ratio vector has no codeword";
  }
  const double half_step = std::exp2(0.5 * dec.norm_log2_step) - 1;
  EXPECT_LE(fit.rel_rms, half_step * 1.01);
  // Same inputs, same tables.
  HeadDecision again = base;
  fit_compact_group_norms(again, d, x.data(), n, 2, 123);
  EXPECT_EQ(again.ratio_codebook, dec.ratio_codebook);
  EXPECT_EQ(again.norm_log2_lo, dec.norm_log2_lo);
  EXPECT_EQ(again.norm_log2_step, dec.norm_log2_step);
}

TEST(CompactGroupNorms, FitErrorIsWhatTheCodecStoresAndFallsWithBits) {
  const int d = 64, n = 3000;
  const std::vector<float> x = varied_rows(n, d, 91);
  double prev = INFINITY;
  for (int k : {1, 4, 8}) {
    HeadDecision dec = t::tq_blocks(d, {1, 2, 3, 4, 6});
    const CompactNormFit fit = fit_compact_group_norms(dec, d, x.data(), n, k, 5);
    // Every codeword a unit vector with entries >= 0.
    const size_t G = dec.groups.size();
    for (size_t j = 0; j < (size_t{1} << k); ++j) {
      double n2 = 0;
      for (size_t g = 0; g < G; ++g) {
        EXPECT_GE(dec.ratio_codebook[j * G + g], 0.f);
        n2 += double(dec.ratio_codebook[j * G + g]) * dec.ratio_codebook[j * G + g];
      }
      EXPECT_NEAR(n2, 1.0, 1e-5);
    }
    // The reported error, recomputed from the encoder's records and the decoder's reading of them.
    HeadCodec codec(dec, d);
    const std::vector<uint8_t> packed = codec.encode(x.data(), n);
    double e = 0, tot = 0;
    for (int r = 0; r < n; ++r) {
      const uint8_t* blk = &packed[size_t(r) * codec.layout().block_bytes];
      for (size_t g = 0; g < G; ++g) {
        double s2 = 0;
        for (int c : dec.groups[g].dims) s2 += double(x[size_t(r) * d + c]) * x[size_t(r) * d + c];
        const double got = layout::tq_group_norm(codec.layout(), blk, uint32_t(g), codec.norm_levels().data(),
                                                 codec.ratio_codebook().data());
        e += (std::sqrt(s2) - got) * (std::sqrt(s2) - got);
        tot += s2;
      }
    }
    EXPECT_NEAR(fit.rel_rms, std::sqrt(e / tot), 1e-3 * fit.rel_rms) << "k=" << k;
    EXPECT_LT(fit.rel_rms, prev) << "k=" << k;
    EXPECT_LT(fit.rel_rms_fp16, 3e-4);
    prev = fit.rel_rms;
  }
  EXPECT_LT(prev, 0.05);
}

}  // namespace
}  // namespace kvq::codec
