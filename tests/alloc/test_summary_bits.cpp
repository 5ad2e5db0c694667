// AllocSummary's bit counts against byte counts written out here from schemas/packed-layout.md:
// a block is [fp16 records][codes, LSB-first, no padding between them][pad to an even byte count];
// effective bpd = block bytes * 8 / (tokens per block * d).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kvq/alloc/common.hpp"
#include "kvq/alloc/uniform.hpp"

namespace kvq::alloc {
namespace {

HeadDecision tq(std::vector<std::pair<int, int>> dims_bits) {  // consecutive groups of (dims, bits)
  HeadDecision h;
  h.kind = CodingKind::kTqGroups;
  int next = 0;
  for (auto [m, b] : dims_bits) {
    TqGroup g;
    g.bits = b;
    g.dims.resize(size_t(m));
    std::iota(g.dims.begin(), g.dims.end(), next);
    next += m;
    h.groups.push_back(g);
  }
  return h;
}

HeadDecision lowrank(int rank, int bits) {  // no basis: the summary counts bytes, it does not code
  HeadDecision h;
  h.kind = CodingKind::kLowRankHadamard;
  h.rank = rank;
  h.bits = bits;
  return h;
}

HeadDecision kivi(Side side, int bits, int group_size) {
  HeadDecision h;
  h.kind = CodingKind::kKivi;
  h.side = side;
  h.bits = bits;
  h.group_size = group_size;
  return h;
}

AllocSummary summarize(const std::vector<HeadDecision>& heads, int d) {
  AllocSummary s;
  summarize_bits(heads, d, &s);
  return s;
}

struct Case {
  const char* name;
  HeadDecision head;
  int d;
  int block_bytes;       // counted by hand below
  int tokens_per_block;
  int64_t code_bits;     // per token
};

TEST(SummaryBits, EffectiveBpdIsThePackedLayoutForEveryKind) {
  const std::vector<Case> cases = {
      // TQ: 2 bytes of norm per group, then sum(m_g * b_g) bits.
      {"tq uniform d128 b3", tq({{128, 3}}), 128, 2 + 48, 1, 384},                  // 50 bytes
      {"tq uniform d8 b3", tq({{8, 3}}), 8, 2 + 3 + 1, 1, 24},                      // 5 -> 6 (pad)
      {"tq three groups", tq({{40, 3}, {40, 2}, {48, 4}}), 128, 6 + 49 + 1, 1, 392},  // 392 bits = 49 B
      {"tq worked example d8", tq({{4, 3}, {4, 2}}), 8, 4 + 3 + 1, 1, 20},          // schema's example
      // Low rank: one fp16 norm of the latent per token, then r*b bits.
      {"lowrank r32 b4", lowrank(32, 4), 128, 2 + 16, 1, 128},
      {"lowrank r18 b3 d96", lowrank(18, 3), 96, 2 + 7 + 1, 1, 54},  // 54 bits = 7 B, 9 -> 10
      {"lowrank r5 b3 d64", lowrank(5, 3), 64, 2 + 2, 1, 15},
      // KIVI K: group_size tokens per block, d scale/zero pairs (4 B each), then g*d*b bits.
      {"kivi K b2 g32", kivi(Side::kK, 2, 32), 128, 4 * 128 + 32 * 128 * 2 / 8, 32, 256},
      {"kivi K b3 g5 d8", kivi(Side::kK, 3, 5), 8, 4 * 8 + 15 + 1, 5, 24},  // 120 bits = 15 B, 47 -> 48
      // KIVI V: one token per block, ceil(d/g) scale/zero pairs, then d*b bits.
      {"kivi V b2 g32", kivi(Side::kV, 2, 32), 128, 4 * 4 + 32, 1, 256},
      {"kivi V b3 g32 d96", kivi(Side::kV, 3, 32), 96, 4 * 3 + 36, 1, 288},
      {"kivi V b2 g32 d8", kivi(Side::kV, 2, 32), 8, 4 * 1 + 2, 1, 16},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const AllocSummary s = summarize({c.head, c.head}, c.d);
    EXPECT_DOUBLE_EQ(s.effective_bpd, c.block_bytes * 8.0 / (c.tokens_per_block * c.d));
    EXPECT_EQ(s.code_bits_used, 2 * c.code_bits);
    EXPECT_DOUBLE_EQ(s.code_bits_per_dim, double(c.code_bits) / c.d);
    EXPECT_GT(s.effective_bpd, s.code_bits_per_dim) << "norms and scales are stored bits";
  }
}

TEST(SummaryBits, MixedHeadsAverageTheirLayouts) {
  // 50 bytes (3.125 bpd) and 18 bytes (1.125 bpd) per token at d = 128.
  const AllocSummary s = summarize({tq({{128, 3}}), lowrank(32, 4)}, 128);
  EXPECT_DOUBLE_EQ(s.effective_bpd, (50 + 18) * 8.0 / (2 * 128));
  EXPECT_DOUBLE_EQ(s.code_bits_per_dim, (384 + 128) / (2 * 128.0));
}

TEST(SummaryBits, LowRankNormIsCounted) {
  // The summary once charged low-rank tokens 0 bits besides their codes (1.0 here).
  EXPECT_DOUBLE_EQ(summarize({lowrank(32, 4)}, 128).effective_bpd, 1.125);
}

TEST(SummaryBits, DecisionsTheLayoutCannotStoreAreNaN) {
  EXPECT_TRUE(std::isnan(summarize({lowrank(0, 0)}, 64).effective_bpd));            // rank 0
  EXPECT_TRUE(std::isnan(summarize({tq({{64, 3}}), tq({{64, 12}})}, 64).effective_bpd));  // 12 bits
  EXPECT_TRUE(std::isnan(summarize({tq({{32, 3}})}, 64).effective_bpd));  // groups miss dims 32..63
  EXPECT_EQ(summarize({}, 64).effective_bpd, 0.0);
}

TEST(SummaryBits, AllocatorsReportTheLayout) {
  const Allocation a = allocate_uniform(Shape{2, 2, 128}, Side::kK, 3.0);
  EXPECT_DOUBLE_EQ(a.summary.effective_bpd, 3.125);  // schemas/packed-layout.md's table
}

}  // namespace
}  // namespace kvq::alloc
