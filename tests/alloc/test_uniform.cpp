// Uniform baseline, method names, seeds.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "kvq/alloc/uniform.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc {
namespace {

TEST(Uniform, OneWholeVectorGroupPerHead) {
  Shape s{3, 2, 8};
  Allocation a = allocate_uniform(s, Side::kV, 3.0);
  ASSERT_EQ(a.heads.size(), 6u);
  std::set<uint64_t> seeds;
  for (int i = 0; i < 6; ++i) {
    const auto& h = a.heads[i];
    EXPECT_EQ(h.layer, i / 2);
    EXPECT_EQ(h.kv_head, i % 2);
    EXPECT_EQ(h.side, Side::kV);
    EXPECT_EQ(h.kind, CodingKind::kTqGroups);
    ASSERT_EQ(h.groups.size(), 1u);
    EXPECT_EQ(h.groups[0].bits, 3);
    EXPECT_EQ(h.groups[0].dims, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
    seeds.insert(h.groups[0].rotation_seed);
  }
  EXPECT_EQ(seeds.size(), 6u);
  EXPECT_EQ(a.summary.method, Method::kUniform);
  EXPECT_DOUBLE_EQ(a.summary.code_bits_per_dim, 3.0);
  // Packed layout: 2 B fp16 norm + 3 B of codes, padded to 6 B per token (schemas/packed-layout.md).
  EXPECT_DOUBLE_EQ(a.summary.effective_bpd, 6 * 8.0 / 8);
  EXPECT_EQ(a.summary.budget_total, 6 * 24);
  EXPECT_FALSE(a.summary.has_prediction);
  UniformOptions post;
  post.post_rope = true;
  EXPECT_TRUE(allocate_uniform(s, Side::kK, 2.0, post).heads[0].post_rope);
  EXPECT_FALSE(allocate_uniform(s, Side::kV, 2.0, post).heads[0].post_rope);
}

TEST(Uniform, BadWidthsThrow) {
  Shape s{1, 1, 8};
  for (double b : {0.0, 2.5, 9.0, -1.0}) {
    try {
      allocate_uniform(s, Side::kK, b);
      ADD_FAILURE() << b;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bits_per_dim"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(allocate_uniform(Shape{0, 1, 8}, Side::kK, 2.0), Error);
}

TEST(Baselines, WholeBitsPerSideAndTheFieldOfAFractionalOne) {
  const Shape shape{2, 3, 16};
  auto u = baseline_heads("uniform", shape, 3, 2, true, "a.kvqalloc.h5");
  ASSERT_EQ(u.size(), 12u);  // K heads (layer-major), then V heads
  for (size_t i = 0; i < u.size(); ++i) {
    const HeadDecision& h = u[i];
    EXPECT_EQ(h.side, i < 6 ? Side::kK : Side::kV);
    EXPECT_EQ(h.layer, int(i % 6) / 3);
    EXPECT_EQ(h.kv_head, int(i % 3));
    ASSERT_EQ(h.kind, CodingKind::kTqGroups);
    ASSERT_EQ(h.groups.size(), 1u);
    EXPECT_EQ(h.groups[0].bits, i < 6 ? 3 : 2);
    EXPECT_EQ(h.groups[0].dims.size(), 16u);
    EXPECT_EQ(h.groups[0].rotation_seed, derive_seed(42, h.layer, h.kv_head, h.side, uint64_t(h.groups[0].bits)));
  }
  // The TQ baseline decodes as the compared allocation does: norm correction on or off.
  for (const HeadDecision& h : baseline_heads("uniform", shape, 3, 2, false, "a.kvqalloc.h5"))
    EXPECT_FALSE(h.norm_correction);
  for (const HeadDecision& h : u) EXPECT_TRUE(h.norm_correction);
  auto k = baseline_heads("kivi", shape, 2, 4, true, "a.kvqalloc.h5");
  ASSERT_EQ(k.size(), 12u);
  for (size_t i = 0; i < k.size(); ++i) {
    EXPECT_EQ(k[i].kind, CodingKind::kKivi);
    EXPECT_EQ(k[i].bits, i < 6 ? 2 : 4);
    EXPECT_EQ(k[i].group_size, 32);
  }
  for (auto [kb, vb, field] : {std::make_tuple(1.5, 2.0, "budget.k_bpd_nominal"),
                               std::make_tuple(2.0, 9.0, "budget.v_bpd_nominal"),
                               std::make_tuple(0.0, 2.0, "budget.k_bpd_nominal")}) {
    try {
      baseline_heads("uniform", shape, kb, vb, true, "a.kvqalloc.h5");
      ADD_FAILURE() << kb << " " << vb;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("a.kvqalloc.h5"), std::string::npos) << m;
      EXPECT_NE(m.find(field), std::string::npos) << m;
    }
  }
  EXPECT_THROW(baseline_heads("gptq", shape, 2, 2, true, "a.kvqalloc.h5"), Error);
}

TEST(Methods, NamesRoundTripAndUnknownListsValid) {
  for (Method m : {Method::kUniform, Method::kBlockGtq, Method::kCobraMse, Method::kCobraKl,
                   Method::kCobraDp, Method::kCobraMeasured, Method::kKivi})
    EXPECT_EQ(method_from_string(to_string(m)), m);
  EXPECT_STREQ(to_string(Method::kBlockGtq), "block-gtq");
  try {
    method_from_string("gtq");
    ADD_FAILURE();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("method"), std::string::npos);
    EXPECT_NE(m.find("'gtq'"), std::string::npos);
    EXPECT_NE(m.find("uniform, block-gtq, cobra-mse"), std::string::npos) << m;
  }
}

TEST(Seeds, DeterministicAndFieldSensitive) {
  EXPECT_EQ(derive_seed(42, 1, 2, Side::kK, 3), derive_seed(42, 1, 2, Side::kK, 3));
  std::set<uint64_t> s = {derive_seed(42, 1, 2, Side::kK, 3), derive_seed(42, 2, 1, Side::kK, 3),
                          derive_seed(42, 1, 2, Side::kV, 3), derive_seed(42, 1, 2, Side::kK, 4),
                          derive_seed(43, 1, 2, Side::kK, 3)};
  EXPECT_EQ(s.size(), 5u);
}

}  // namespace
}  // namespace kvq::alloc
