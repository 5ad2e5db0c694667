// A table of bad decisions and inputs: each must throw kvq::Error naming the decision and field.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kvq/codec/codec.hpp"
#include "kvq/util/error.hpp"
#include "test_util.hpp"

namespace kvq::codec {
namespace {

struct BadCase {
  const char* name;
  std::function<void(HeadDecision&, int&)> mutate;
  HeadDecision base;
  const char* expect;
};

TEST(CodecErrors, BadDecisionsAreRejectedWithAMessage) {
  const int d = 16;
  std::vector<BadCase> cases = {
      {"tq no groups", [](HeadDecision& x, int&) { x.groups.clear(); }, test::tq_uniform(d, 3), "has no groups"},
      {"tq bits 0", [](HeadDecision& x, int&) { x.groups[0].bits = 0; }, test::tq_uniform(d, 3), "groups[0].bits: must be in 1..8, got 0"},
      {"tq bits 9", [](HeadDecision& x, int&) { x.groups[0].bits = 9; }, test::tq_uniform(d, 3), "got 9"},
      {"tq dim out of range", [](HeadDecision& x, int&) { x.groups[0].dims[3] = 16; }, test::tq_uniform(d, 3), "coordinate 16 outside [0, 16)"},
      {"tq duplicate dim", [](HeadDecision& x, int&) { x.groups[1].dims[0] = x.groups[0].dims[0]; }, test::tq_blocks(d, {3, 2}), "already in groups[0]"},
      {"tq missing dim", [](HeadDecision& x, int&) { x.groups[1].dims.pop_back(); }, test::tq_blocks(d, {3, 2}), "is in no group"},
      {"tq empty group", [](HeadDecision& x, int&) { x.groups.push_back(TqGroup{2, {}, 0}); }, test::tq_uniform(d, 3), "groups[1].dims: is empty"},
      {"tq 33 groups", [](HeadDecision& x, int& dd) {
         dd = 66;
         x.groups.clear();
         for (int i = 0; i < 33; ++i) x.groups.push_back(TqGroup{2, {2 * i, 2 * i + 1}, 0});
       }, test::tq_uniform(d, 3), "at most 32 groups"},
      {"lrh rank 0", [](HeadDecision& x, int&) { x.rank = 0; }, test::lrh(d, 4, 3), "rank: must be in 1..16, got 0"},
      {"lrh rank > d", [](HeadDecision& x, int&) { x.rank = 17; }, test::lrh(d, 4, 3), "got 17"},
      {"lrh basis size", [](HeadDecision& x, int&) { x.basis.pop_back(); }, test::lrh(d, 4, 3), "basis: has 63 values, expected d*rank = 64"},
      {"lrh mean size", [](HeadDecision& x, int&) { x.mean.resize(3); }, test::lrh(d, 4, 3), "mean: has 3 values"},
      {"lrh NaN basis", [](HeadDecision& x, int&) { x.basis[5] = NAN; }, test::lrh(d, 4, 3), "basis: non-finite value at 5"},
      {"lrh bits", [](HeadDecision& x, int&) { x.bits = 12; }, test::lrh(d, 4, 3), "bits: must be in 1..8, got 12"},
      {"kivi group 0", [](HeadDecision& x, int&) { x.group_size = 0; }, test::kivi(Side::kK, 2), "group_size: must be in 1..65536, got 0"},
      {"head_dim 0", [](HeadDecision&, int& dd) { dd = 0; }, test::kivi(Side::kV, 2), "head_dim: must be in 1..4096, got 0"},
      {"bad kind", [](HeadDecision& x, int&) { x.kind = static_cast<CodingKind>(7); }, test::kivi(Side::kV, 2), "unknown coding kind 7"},
  };
  for (BadCase& c : cases) {
    HeadDecision dec = c.base;
    dec.layer = 3;
    dec.kv_head = 1;
    int dd = d;
    c.mutate(dec, dd);
    try {
      HeadCodec codec(dec, dd);
      ADD_FAILURE() << c.name << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
      EXPECT_NE(msg.find("L3 H1"), std::string::npos) << c.name << ": " << msg;
    }
  }
}

TEST(CodecErrors, NonFiniteInputIsRejected) {
  const int d = 8;
  HeadCodec codec(test::tq_uniform(d, 3), d);
  std::vector<float> x(static_cast<size_t>(2) * d, 1.f);
  x[11] = INFINITY;
  try {
    codec.encode(x.data(), 2);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite input at token 1, dim 3"), std::string::npos) << e.what();
  }
}

// Norms above the fp16 range saturate at 65504 instead of becoming inf.
TEST(CodecErrors, HugeNormsSaturate) {
  const int d = 8;
  HeadCodec codec(test::tq_uniform(d, 4), d);
  std::vector<float> x(d, 1e5f), y(d);
  codec.round_trip(x.data(), 1, y.data());
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace kvq::codec
