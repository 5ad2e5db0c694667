// layer-precision: the exact solver against brute force over every per-layer assignment, the budget
// met exactly at its boundaries, and the input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "kvq/alloc/layer_precision.hpp"
#include "kvq/util/error.hpp"

namespace {

using kvq::MinifloatFormat;
using kvq::alloc::LayerPrecisionInput;

// Bits per token of one head, written out from schemas/packed-layout.md kind 3 (not from the code):
// FP8 d bytes; NVFP4 ceil(d/16) scale bytes + d/2 code bytes; both rounded up to 2 bytes.
int64_t head_bits(MinifloatFormat f, int d) {
  const int64_t bytes = f == MinifloatFormat::kFp8E4M3 ? d : (d + 15) / 16 + (4 * d + 7) / 8;
  return (bytes + 1) / 2 * 2 * 8;
}

LayerPrecisionInput random_input(std::mt19937_64& rng, int L, int H, int d,
                                 std::vector<MinifloatFormat> formats = {MinifloatFormat::kFp8E4M3,
                                                                         MinifloatFormat::kNvfp4}) {
  LayerPrecisionInput in;
  in.shape = {L, H, d};
  in.formats = formats;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const size_t F = formats.size();
  for (int i = 0; i < L * H; ++i) {
    const double base = std::exp(4 * u(rng));  // layers differ by orders of magnitude, as real ones do
    for (size_t f = 0; f < F; ++f) {
      // NVFP4 usually worse, but not always (the solver must not assume it).
      const double w = formats[f] == MinifloatFormat::kNvfp4 ? 8 + 40 * u(rng) : 0.5 + u(rng);
      in.k_mse.push_back(base * w * 1e-3);
      in.v_mse.push_back(base * (formats[f] == MinifloatFormat::kNvfp4 ? 20 * u(rng) : u(rng)) * 1e-3);
    }
    in.k_amax.push_back(float(1 + 10 * u(rng)));
    in.v_amax.push_back(float(0.5 + u(rng)));
  }
  return in;
}

struct Brute {
  double best = std::numeric_limits<double>::infinity();
  int64_t bits = 0;
};

// Every assignment of a format to each layer (F^L), distortion summed in layer order.
Brute brute_force(const LayerPrecisionInput& in, double bpd) {
  const int L = in.shape.n_layers, H = in.shape.n_kv_heads, d = in.shape.head_dim;
  const int F = int(in.formats.size());
  const double limit = bpd * L * 2 * H * d;
  int64_t combos = 1;
  for (int l = 0; l < L; ++l) combos *= F;
  Brute b;
  for (int64_t m = 0; m < combos; ++m) {
    int64_t code = m, bits = 0;
    double dist = 0;
    for (int l = 0; l < L; ++l, code /= F) {
      const int f = int(code % F);
      bits += head_bits(in.formats[size_t(f)], d) * 2 * H;
      double layer = 0;
      for (int h = 0; h < H; ++h) {
        const size_t i = size_t(l * H + h) * size_t(F) + size_t(f);
        layer += in.k_mse[i] + in.v_mse[i];
      }
      dist += layer;
    }
    if (double(bits) <= limit && dist < b.best) b = {dist, bits};
  }
  return b;
}

double mean_bpd(const kvq::alloc::Allocation& a, int d) {
  double s = 0;
  for (const auto& h : a.heads) s += double(head_bits(h.minifloat, d)) / d;
  return s / double(a.heads.size());
}

TEST(LayerPrecision, EqualsBruteForceOnRandomInstances) {
  std::mt19937_64 rng(20260);
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 1 + int(rng() % 10), H = 1 + int(rng() % 3);
    const int d = trial % 3 == 0 ? 64 : trial % 3 == 1 ? 128 : 40;  // 40: NVFP4 pays a partial block
    const auto in = random_input(rng, L, H, d);
    const double lo = double(head_bits(MinifloatFormat::kNvfp4, d)) / d, hi = 8.0;
    const double bpd = lo + (hi - lo) * std::uniform_real_distribution<double>(0, 1.1)(rng);
    const Brute b = brute_force(in, bpd);
    ASSERT_TRUE(std::isfinite(b.best));
    const auto a = kvq::alloc::allocate_layer_precision(in, bpd);
    SCOPED_TRACE("trial " + std::to_string(trial) + " L " + std::to_string(L) + " H " + std::to_string(H) +
                 " d " + std::to_string(d) + " bpd " + std::to_string(bpd));
    EXPECT_NEAR(a.summary.predicted_distortion, b.best, 1e-12 * b.best);
    ASSERT_EQ(a.heads.size(), size_t(2 * L * H));
    EXPECT_LE(mean_bpd(a, d), bpd + 1e-12);
    EXPECT_LE(a.summary.budget_assigned, int64_t(std::floor(bpd * L * 2 * H * d)));
    // One format per layer for all its K and V heads; the reported total is the heads' sum.
    double sum = 0;
    for (const auto& h : a.heads) {
      EXPECT_EQ(h.kind, kvq::CodingKind::kMinifloat);
      EXPECT_EQ(h.post_rope, h.side == kvq::Side::kK);
      EXPECT_EQ(h.minifloat, a.heads[size_t(h.layer * H)].minifloat);
      sum += h.predicted_distortion;
    }
    EXPECT_NEAR(sum, b.best, 1e-9 * b.best);
  }
}

TEST(LayerPrecision, SingleFormatAndFormatOrder) {
  std::mt19937_64 rng(7);
  // Only fp8 allowed: everything fp8 at bpd >= 8.
  auto in = random_input(rng, 4, 2, 64, {MinifloatFormat::kFp8E4M3});
  auto a = kvq::alloc::allocate_layer_precision(in, 8.0);
  for (const auto& h : a.heads) EXPECT_EQ(h.minifloat, MinifloatFormat::kFp8E4M3);
  EXPECT_DOUBLE_EQ(a.summary.effective_bpd, 8.0);
  // Formats in the other order give the same optimum.
  in = random_input(rng, 6, 2, 128);
  auto rev = in;
  rev.formats = {MinifloatFormat::kNvfp4, MinifloatFormat::kFp8E4M3};
  rev.k_mse.clear();
  rev.v_mse.clear();
  for (size_t i = 0; i < in.k_mse.size(); i += 2) {
    rev.k_mse.insert(rev.k_mse.end(), {in.k_mse[i + 1], in.k_mse[i]});
    rev.v_mse.insert(rev.v_mse.end(), {in.v_mse[i + 1], in.v_mse[i]});
  }
  EXPECT_NEAR(kvq::alloc::allocate_layer_precision(in, 6.0).summary.predicted_distortion,
              kvq::alloc::allocate_layer_precision(rev, 6.0).summary.predicted_distortion, 1e-12);
}

TEST(LayerPrecision, BudgetBoundaries) {
  std::mt19937_64 rng(11);
  for (int d : {64, 128}) {
    const auto in = random_input(rng, 5, 2, d);
    // Exactly all-NVFP4 = 4.5 bits per dim at d a multiple of 16.
    auto a = kvq::alloc::allocate_layer_precision(in, 4.5);
    for (const auto& h : a.heads) EXPECT_EQ(h.minifloat, MinifloatFormat::kNvfp4);
    EXPECT_DOUBLE_EQ(a.summary.effective_bpd, 4.5);
    // Exactly all-FP8 = 8 (every layer has FP8 below NVFP4 in these instances).
    a = kvq::alloc::allocate_layer_precision(in, 8.0);
    for (const auto& h : a.heads) EXPECT_EQ(h.minifloat, MinifloatFormat::kFp8E4M3);
    EXPECT_DOUBLE_EQ(a.summary.effective_bpd, 8.0);
    // One layer's upgrade costs (8 - 4.5) / 5 = 0.7 bits per dim on the mean: 4.5 + 0.7 buys one,
    // a hair less buys none.
    a = kvq::alloc::allocate_layer_precision(in, 5.2);
    int fp8 = 0;
    for (const auto& h : a.heads) fp8 += h.minifloat == MinifloatFormat::kFp8E4M3;
    EXPECT_EQ(fp8, 2 * 2);
    a = kvq::alloc::allocate_layer_precision(in, 5.2 - 1e-9);
    fp8 = 0;
    for (const auto& h : a.heads) fp8 += h.minifloat == MinifloatFormat::kFp8E4M3;
    EXPECT_EQ(fp8, 0);
  }
}

void expect_error(const LayerPrecisionInput& in, double bpd, const std::string& needle) {
  try {
    kvq::alloc::allocate_layer_precision(in, bpd);
    ADD_FAILURE() << "no error, wanted '" << needle << "'";
  } catch (const kvq::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(LayerPrecision, ImpossibleBudgetsAndBadInputs) {
  std::mt19937_64 rng(3);
  const auto in = random_input(rng, 3, 2, 64);
  expect_error(in, 4.49, "below the cheapest layer-precision choice: all nvfp4 = 4.5");
  auto fp8_only = random_input(rng, 3, 2, 64, {MinifloatFormat::kFp8E4M3});
  expect_error(fp8_only, 7.99, "all fp8 = 8");
  auto bad = in;
  bad.k_amax[4] = 0.f;  // a head that never fired
  expect_error(bad, 6, "k_amax[2][0]: amax 0: the head never fired");
  bad = in;
  bad.v_amax[1] = std::numeric_limits<float>::quiet_NaN();
  expect_error(bad, 8, "v_amax[0][1]");
  bad = in;
  bad.formats = {MinifloatFormat::kNvfp4, MinifloatFormat::kNvfp4};
  expect_error(bad, 6, "'nvfp4' given twice");
  bad = in;
  bad.k_mse[0] = std::numeric_limits<double>::infinity();
  expect_error(bad, 6, "layer 0 head 0: not a finite value");
}

TEST(LayerPrecision, ScalesFromAmax) {
  EXPECT_FLOAT_EQ(kvq::alloc::minifloat_scale(MinifloatFormat::kFp8E4M3, 448.0, 1.0, "f"), 1.0f);
  EXPECT_FLOAT_EQ(kvq::alloc::minifloat_scale(MinifloatFormat::kFp8E4M3, 224.0, 2.0, "f"), 1.0f);
  EXPECT_FLOAT_EQ(kvq::alloc::minifloat_scale(MinifloatFormat::kNvfp4, 2688.0, 1.0, "f"), 1.0f);
  EXPECT_THROW(kvq::alloc::minifloat_scale(MinifloatFormat::kNvfp4, 1.0, 0.0, "f"), kvq::Error);
  EXPECT_THROW(kvq::alloc::minifloat_scale(MinifloatFormat::kFp8E4M3, 1e-300, 1.0, "f"), kvq::Error);
}

// Per-side combinations: brute force over every assignment of a K format and a V format to each
// layer ((F*F)^L), keeping those whose (K, V) pair is in the allowed list and whose bits fit.
Brute brute_force_sides(const LayerPrecisionInput& in, const std::vector<kvq::alloc::KvFormatPair>& allowed,
                        double bpd) {
  const int L = in.shape.n_layers, H = in.shape.n_kv_heads, d = in.shape.head_dim;
  const int F = int(in.formats.size());
  const double limit = bpd * L * 2 * H * d;
  int64_t n = 1;
  for (int l = 0; l < 2 * L; ++l) n *= F;
  Brute b;
  for (int64_t m = 0; m < n; ++m) {
    int64_t code = m, bits = 0;
    double dist = 0;
    bool ok = true;
    for (int l = 0; l < L && ok; ++l) {
      const int fk = int(code % F);
      code /= F;
      const int fv = int(code % F);
      code /= F;
      const kvq::alloc::KvFormatPair p{in.formats[size_t(fk)], in.formats[size_t(fv)]};
      ok = std::find(allowed.begin(), allowed.end(), p) != allowed.end();
      bits += (head_bits(p.k, d) + head_bits(p.v, d)) * H;
      for (int h = 0; h < H; ++h)
        dist += in.k_mse[size_t(l * H + h) * size_t(F) + size_t(fk)] + in.v_mse[size_t(l * H + h) * size_t(F) + size_t(fv)];
    }
    if (ok && double(bits) <= limit && dist < b.best) b = {dist, bits};
  }
  return b;
}

TEST(LayerPrecision, PerSideCombinationsEqualBruteForce) {
  const MinifloatFormat fp8 = MinifloatFormat::kFp8E4M3, nv = MinifloatFormat::kNvfp4;
  const std::vector<std::vector<kvq::alloc::KvFormatPair>> lists = {
      {{fp8, fp8}, {nv, nv}, {fp8, nv}}, {{fp8, nv}, {nv, nv}}, {{fp8, fp8}, {fp8, nv}}, {{nv, nv}, {fp8, nv}, {fp8, fp8}},
      {{fp8, fp8}, {nv, nv}, {fp8, nv}, {nv, fp8}}};
  std::mt19937_64 rng(20261);
  int mixed_layers = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int L = 1 + int(rng() % 6), H = 1 + int(rng() % 3);
    const int d = trial % 2 ? 64 : 40;
    auto in = random_input(rng, L, H, d);
    in.combos = lists[size_t(trial) % lists.size()];
    const double lo = double(head_bits(nv, d)) / d, hi = 8.0;
    const double bpd = lo + (hi - lo) * std::uniform_real_distribution<double>(0, 1.1)(rng);
    const Brute b = brute_force_sides(in, in.combos, bpd);
    SCOPED_TRACE("trial " + std::to_string(trial) + " L " + std::to_string(L) + " H " + std::to_string(H) + " bpd " +
                 std::to_string(bpd));
    if (!std::isfinite(b.best)) {  // even the cheapest allowed pair does not fit
      EXPECT_THROW(kvq::alloc::allocate_layer_precision(in, bpd), kvq::Error);
      continue;
    }
    const auto a = kvq::alloc::allocate_layer_precision(in, bpd);
    EXPECT_NEAR(a.summary.predicted_distortion, b.best, 1e-12 * b.best);
    EXPECT_LE(mean_bpd(a, d), bpd + 1e-12);
    EXPECT_LE(a.summary.budget_assigned, int64_t(std::floor(bpd * L * 2 * H * d)));
    // Every layer's K heads share a format, its V heads share one, and the pair is allowed.
    std::string names;
    for (int l = 0; l < L; ++l) {
      const MinifloatFormat k = a.heads[size_t(l * H)].minifloat, v = a.heads[size_t(L * H + l * H)].minifloat;
      for (int h = 0; h < H; ++h) {
        EXPECT_EQ(a.heads[size_t(l * H + h)].minifloat, k);
        EXPECT_EQ(a.heads[size_t(L * H + l * H + h)].minifloat, v);
      }
      const kvq::alloc::KvFormatPair p{k, v};
      EXPECT_NE(std::find(in.combos.begin(), in.combos.end(), p), in.combos.end());
      mixed_layers += k != v;
      // Names written out here: the allocation's layer_formats.
      names += std::string(l ? "," : "") + (k == v ? (k == fp8 ? "fp8" : "nvfp4") : k == fp8 ? "fp8_k_nvfp4_v" : "nvfp4_k_fp8_v");
    }
    std::string got;
    for (const auto& [k, v] : a.summary.params)
      if (k == "layer_formats") got = v;
    EXPECT_EQ(got, names);
  }
  EXPECT_GT(mixed_layers, 0);  // the per-side choice is exercised, not only (f, f)
}

TEST(LayerPrecision, CombinationErrors) {
  std::mt19937_64 rng(7);
  const MinifloatFormat fp8 = MinifloatFormat::kFp8E4M3, nv = MinifloatFormat::kNvfp4;
  auto in = random_input(rng, 3, 2, 64, {fp8});
  in.combos = {{fp8, nv}};  // NVFP4 was not measured
  try {
    kvq::alloc::allocate_layer_precision(in, 8);
    ADD_FAILURE() << "accepted a combination using an unmeasured format";
  } catch (const kvq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("formats: combination uses 'nvfp4', which was not measured"), std::string::npos)
        << e.what();
  }
  in = random_input(rng, 3, 2, 64);
  in.combos = {{fp8, nv}, {fp8, nv}};
  EXPECT_THROW(kvq::alloc::allocate_layer_precision(in, 8), kvq::Error);
  // Below the cheapest allowed pair: FP8 K + NVFP4 V = (8 + 4.5) / 2 = 6.25 bits per dim at d = 64.
  in.combos = {{fp8, nv}, {fp8, fp8}};
  try {
    kvq::alloc::allocate_layer_precision(in, 6.2);
    ADD_FAILURE() << "accepted a budget below the cheapest pair";
  } catch (const kvq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("all fp8_k_nvfp4_v = 6.25 effective bits per dim"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(kvq::alloc::allocate_layer_precision(in, 6.25));
}

}  // namespace
