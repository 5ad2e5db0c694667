// Golden files of today's format versions (data/golden/, made by scripts/make-golden) must stay
// readable by every later kvq; their content is checked against facts known independently.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "kvq/format/decision_layout.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/util/sha256.hpp"

using namespace kvq;

namespace {
std::string golden(const std::string& f) { return std::string(KVQ_SOURCE_DIR) + "/data/golden/" + f; }
}  // namespace

TEST(Golden, FilesAreUnchanged) {
  std::ifstream sums(golden("SHA256SUMS"));
  std::string sha, name;
  int n = 0;
  while (sums >> sha >> name) {
    EXPECT_EQ(sha256_file(golden(name)), sha) << name << " was modified: golden files are never rewritten";
    ++n;
  }
  EXPECT_EQ(n, 8);
}

TEST(Golden, CalibrationV1) {
  CalibFile c = read_calib(golden("calib-v1.kvqcal.h5"));
  // sha256 of data/kvq-demo-llama/config.json, as its README lists it.
  EXPECT_EQ(c.prov.model_config_sha256, "eff52c13762503e9e654721d548750393ebc81652c4555b5ae85b0e846ebdcfa");
  EXPECT_EQ(c.prov.pairing, RopePairing::kSplitHalf);
  EXPECT_EQ(c.prov.head_dim, 64);
  EXPECT_EQ(c.prov.n_layers, 4);
  EXPECT_EQ(c.prov.n_kv_heads, 2);
  EXPECT_EQ(c.prov.gqa_map, (std::vector<int>{0, 0, 1, 1}));
  // scripts/make-golden: 4 windows of 32 tokens, 1 held out, 8 reservoir rows.
  for (int l = 0; l < 4; ++l)
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(c.moments.k.count_of(c.shape(), l, h), 4 * 32);
      EXPECT_EQ(c.moments.q.count_of(c.shape(), l, h), 2 * 4 * 32);
    }
  EXPECT_EQ(c.holdout.windows, 1);
  EXPECT_EQ(c.holdout.ids[0], 1) << "windows start with BOS";
  EXPECT_EQ(c.reservoir.size(), 8);
  EXPECT_TRUE(c.complete());
  // Version 1 predates recorded RoPE: it reads as the demo model's unscaled RoPE (theta 10000,
  // d_r 64), and keeps saying which version it is.
  EXPECT_EQ(c.format_version, 1);
  EXPECT_EQ(c.prov.rope_type, "default");
  EXPECT_EQ(c.prov.rope_attention_factor, 1.0);
  ASSERT_EQ(c.prov.rope_inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_DOUBLE_EQ(c.prov.rope_inv_freq[size_t(i)], std::pow(10000.0, -i / 32.0));
}

TEST(Golden, CalibrationV2RecordsTheRope) {
  CalibFile c = read_calib(golden("calib-v2.kvqcal.h5"));
  EXPECT_EQ(c.format_version, 2);
  EXPECT_EQ(c.prov.model_config_sha256, "eff52c13762503e9e654721d548750393ebc81652c4555b5ae85b0e846ebdcfa");
  // The demo model has no rope_scaling: theta 10000 over its 64 rotary dims.
  EXPECT_EQ(c.prov.rope_type, "default");
  EXPECT_EQ(c.prov.rope_attention_factor, 1.0);
  ASSERT_EQ(c.prov.rope_inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_DOUBLE_EQ(c.prov.rope_inv_freq[size_t(i)], std::pow(10000.0, -i / 32.0));
  // The same run as calib-v1: the statistics did not change with the format.
  CalibFile v1 = read_calib(golden("calib-v1.kvqcal.h5"));
  EXPECT_EQ(c.moments.k.gram, v1.moments.k.gram);
  EXPECT_EQ(c.moments.q.sum, v1.moments.q.sum);
  EXPECT_EQ(c.holdout.ids, v1.holdout.ids);
}

TEST(Golden, CalibrationV3RecordsActivationMaxima) {
  CalibFile c = read_calib(golden("calib-v3.kvqcal.h5"));
  EXPECT_EQ(c.format_version, 3);
  CalibFile v2 = read_calib(golden("calib-v2.kvqcal.h5"));
  EXPECT_FALSE(v2.moments.has_amax()) << "version 2 predates the maxima";
  // The same run as calib-v2, made on another machine: the fp32 forward's GEMM rounding differs
  // between CPUs (seen: 1e-6 relative), the sums did not change otherwise.
  auto near = [](const std::vector<double>& a, const std::vector<double>& b) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i])), scale = std::max(scale, std::fabs(b[i]));
    return a.size() == b.size() && worst <= 1e-5 * scale;
  };
  EXPECT_TRUE(near(c.moments.k.gram, v2.moments.k.gram));
  EXPECT_TRUE(near(c.moments.q.sum, v2.moments.q.sum));
  EXPECT_EQ(c.moments.k.count, v2.moments.k.count);
  ASSERT_TRUE(c.moments.has_amax());
  ASSERT_EQ(c.moments.k_amax.size(), 4u * 2);
  ASSERT_EQ(c.moments.v_amax.size(), 4u * 2);
  ASSERT_EQ(c.moments.q_amax.size(), 4u * 4);
  // Every reservoir row is a calibration token: its post-RoPE |k| (split-half pairs, theta 10000,
  // d 64, rotated here from the stored pre-RoPE row), |v| and |q| lie under the maxima, and the
  // maxima are the largest values of 128 tokens, not of the 8 kept.
  const int d = 64, L = 4, H = 2, NH = 4;
  for (int64_t r = 0; r < c.reservoir.size(); ++r) {
    const double pos = double(c.reservoir.source[size_t(2 * r + 1)]);
    auto post_rope_max = [&](const float* x) {
      double m = 0;
      for (int i = 0; i < d / 2; ++i) {
        const double th = pos * std::pow(10000.0, -2.0 * i / d), a = x[i], b = x[i + d / 2];
        m = std::max({m, std::fabs(a * std::cos(th) - b * std::sin(th)), std::fabs(a * std::sin(th) + b * std::cos(th))});
      }
      return m;
    };
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < H; ++h) {
        const size_t row = ((size_t(r) * L + size_t(l)) * H + size_t(h)) * d, i = size_t(l) * H + size_t(h);
        EXPECT_LE(post_rope_max(c.reservoir.k.data() + row), c.moments.k_amax[i] * (1 + 1e-6)) << "l" << l << " h" << h;
        for (int j = 0; j < d; ++j) EXPECT_LE(std::fabs(c.reservoir.v[row + size_t(j)]), c.moments.v_amax[i]);
      }
      for (int h = 0; h < NH; ++h) {
        const size_t row = ((size_t(r) * L + size_t(l)) * NH + size_t(h)) * d;
        EXPECT_LE(post_rope_max(c.reservoir.q.data() + row), c.moments.q_amax[size_t(l) * NH + size_t(h)] * (1 + 1e-6));
      }
    }
  }
  for (float a : c.moments.k_amax) EXPECT_GT(a, 0.f);
}

TEST(Golden, AllocationsV1) {
  CalibFile c = read_calib(golden("calib-v1.kvqcal.h5"), false);
  AllocFile bg = read_alloc(golden("block-gtq-v1.kvqalloc.h5"));
  check_alloc_matches(bg, "block-gtq-v1", c, "calib-v1");
  EXPECT_EQ(bg.method, "block-gtq");
  for (const auto& h : bg.heads) {
    if (h.side != Side::kK) continue;
    int sum = 0, dims = 0;
    for (int b : h.block_bits) sum += b;
    for (const auto& g : h.groups) dims += int(g.dims.size());
    EXPECT_EQ(sum, 32 * 3) << "floor(n_b * 3) block-bits";
    EXPECT_EQ(dims, 64);
  }
  AllocFile dp = read_alloc(golden("cobra-dp-v1.kvqalloc.h5"));
  long used = 0;
  for (const auto& h : dp.heads)
    if (h.side == Side::kK) {
      used += h.budget_bits;
      EXPECT_LE(h.rank * h.bits, h.budget_bits);
      EXPECT_EQ(h.basis.size(), size_t(64 * h.rank));
    }
  EXPECT_EQ(used, 4 * 2 * 64 * 2) << "exact C2 spends the budget exactly";
  // Version 1 predates norm correction and unrotated groups: it decodes as it always did.
  for (const AllocFile* a : {&bg, &dp})
    for (const auto& h : a->heads) {
      EXPECT_FALSE(h.norm_correction);
      for (const auto& g : h.groups) EXPECT_EQ(g.rotation, TqRotation::kHaar);
    }
}

// Allocation v2 (scripts/make-golden: block-gtq at 3 bpd, --rotate-below 3): norm correction on
// every TQ head, groups below 3 bits unrotated, the rest Haar; same budget facts as v1.
TEST(Golden, AllocationV2) {
  CalibFile c = read_calib(golden("calib-v3.kvqcal.h5"), false);
  AllocFile a = read_alloc(golden("block-gtq-v2.kvqalloc.h5"));
  check_alloc_matches(a, "block-gtq-v2", c, "calib-v3");
  EXPECT_EQ(alloc_version_for(a), 2);
  EXPECT_EQ(a.method, "block-gtq");
  int identity = 0, haar = 0;
  for (const auto& h : a.heads) {
    ASSERT_EQ(h.kind, CodingKind::kTqGroups);
    EXPECT_TRUE(h.norm_correction);
    for (const auto& g : h.groups) {
      EXPECT_EQ(g.rotation, g.bits < 3 ? TqRotation::kIdentity : TqRotation::kHaar) << g.bits;
      (g.rotation == TqRotation::kIdentity ? identity : haar)++;
    }
    if (h.side != Side::kK) continue;
    int sum = 0;
    for (int b : h.block_bits) sum += b;
    EXPECT_EQ(sum, 32 * 3) << "floor(n_b * 3) block-bits";
  }
  EXPECT_GT(identity, 0);
  EXPECT_GT(haar, 0);
  // Written again, the file says the same (a v2 reader and writer agree).
  EXPECT_EQ(alloc_manifest(a)["norm_correction"], true);
}

// Allocation v3 (block-gtq at 3 bpd, --rotate-below 3 --codebook exact, norm correction on; made
// with the kvq-allocate of allocation version 3, same calibration as v2): every group of 2..64
// coordinates records the exact (unit-sphere) codebook, which only version 3 holds.
TEST(Golden, AllocationV3ExactCodebook) {
  CalibFile c = read_calib(golden("calib-v3.kvqcal.h5"), false);
  AllocFile a = read_alloc(golden("block-gtq-exact-v3.kvqalloc.h5"));
  check_alloc_matches(a, "block-gtq-exact-v3", c, "calib-v3");
  EXPECT_EQ(alloc_version_for(a), 3);
  EXPECT_EQ(a.method, "block-gtq");
  EXPECT_EQ(a.params.value("codebook", std::string()), "exact");
  int exact = 0, identity = 0;
  for (const auto& h : a.heads) {
    ASSERT_EQ(h.kind, CodingKind::kTqGroups);
    EXPECT_TRUE(h.norm_correction);
    int dims = 0;
    for (const auto& g : h.groups) {
      dims += int(g.dims.size());
      EXPECT_EQ(g.rotation, g.bits < 3 ? TqRotation::kIdentity : TqRotation::kHaar) << g.bits;
      const bool fits = g.dims.size() >= 2 && g.dims.size() <= 64;
      EXPECT_EQ(g.codebook, fits ? TqCodebook::kSphere : TqCodebook::kGaussian) << g.dims.size();
      exact += g.codebook == TqCodebook::kSphere;
      identity += g.rotation == TqRotation::kIdentity;
    }
    EXPECT_EQ(dims, 64);
    if (h.side != Side::kK) continue;
    int sum = 0;
    for (int b : h.block_bits) sum += b;
    EXPECT_EQ(sum, 32 * 3) << "floor(n_b * 3) block-bits";
  }
  EXPECT_GT(exact, 0);
  EXPECT_GT(identity, 0);
  // Written again: the manifest names the codebook on exactly the exact groups and says version 3.
  const auto m = alloc_manifest(a);
  EXPECT_EQ(m["version"], 3);
  size_t i = 0;
  for (const auto& h : a.heads) {
    for (size_t g = 0; g < h.groups.size(); ++g)
      EXPECT_EQ(m["heads"][i]["groups"][g].value("codebook", std::string("gaussian")),
                h.groups[g].codebook == TqCodebook::kSphere ? "exact" : "gaussian");
    ++i;
  }
  // The older goldens name no codebook: version 1 and 2 stay what they were.
  for (const char* f : {"block-gtq-v1.kvqalloc.h5", "block-gtq-v2.kvqalloc.h5", "cobra-dp-v1.kvqalloc.h5"})
    for (const auto& h : read_alloc(golden(f)).heads)
      for (const auto& g : h.groups) EXPECT_EQ(g.codebook, TqCodebook::kGaussian) << f;
}

// Allocation v4 (block-gtq at 3 bpd, --norm-correction on --group-norms compact --ratio-bits 4;
// made with the kvq-allocate of allocation version 4, same calibration as v2): every K head has
// one 16-bit norm record per token, so its bytes per token equal uniform TQ-MSE's at 3 bits
// (align2(2 + 64 * 3 / 8) = 26: 3.25 bpd).
TEST(Golden, AllocationV4CompactGroupNorms) {
  CalibFile c = read_calib(golden("calib-v3.kvqcal.h5"), false);
  AllocFile a = read_alloc(golden("block-gtq-compact-v4.kvqalloc.h5"));
  check_alloc_matches(a, "block-gtq-compact-v4", c, "calib-v3");
  EXPECT_EQ(alloc_version_for(a), 4);
  EXPECT_EQ(a.params.value("group_norms", std::string()), "compact");
  EXPECT_EQ(a.k_bpd_effective, 3.25);
  int compact = 0;
  for (const auto& h : a.heads) {
    ASSERT_EQ(h.kind, CodingKind::kTqGroups);
    if (h.groups.size() < 2) {
      EXPECT_EQ(h.ratio_bits, 0);
      continue;
    }
    ++compact;
    EXPECT_EQ(h.ratio_bits, 4);
    ASSERT_EQ(h.ratio_codebook.size(), 16 * h.groups.size());
    for (size_t j = 0; j < 16; ++j) {
      double n2 = 0;
      for (size_t g = 0; g < h.groups.size(); ++g) n2 += double(h.ratio_codebook[j * h.groups.size() + g]) * h.ratio_codebook[j * h.groups.size() + g];
      EXPECT_NEAR(n2, 1.0, 1e-5);
    }
    EXPECT_EQ(layout::layout_for(h, 64).block_bytes, 26u);
  }
  EXPECT_GT(compact, 0);
  // Written again: the manifest carries the same tables and says version 4.
  const auto m = alloc_manifest(a);
  EXPECT_EQ(m["version"], 4);
  // The older goldens have no compact head.
  for (const char* f : {"block-gtq-v1.kvqalloc.h5", "block-gtq-v2.kvqalloc.h5", "block-gtq-exact-v3.kvqalloc.h5"})
    for (const auto& h : read_alloc(golden(f)).heads) EXPECT_EQ(h.ratio_bits, 0) << f;
}

