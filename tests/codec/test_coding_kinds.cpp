// The coding-kind traits table (kvq/format/coding_kinds.hpp) and each kind's codec behind HeadCodec:
//  - the names the table writes to files are the manifest schema's enum, in enum order (the schema
//    is the independent record of the frozen names);
//  - a kind's code bits (the sum of its per-dimension widths, the allocators' cost model) equal
//    the code bits its packed layout stores per token, counted from the bytes: the code stream of
//    one token block minus the records, for every kind at awkward shapes;
//  - query_to_latent is the adjoint of decode: q . decode(token) = qc . latent(token) + q_off for
//    every kind, checked in double against the decoded vectors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvq/codec/codec.hpp"
#include "kvq/format/coding_kinds.hpp"
#include "kvq/format/decision_layout.hpp"
#include "test_util.hpp"

namespace kvq::codec {
namespace {

using test::gaussian_rows;

std::vector<HeadDecision> one_of_each(int d) {
  std::vector<HeadDecision> out;
  out.push_back(test::tq_uniform(d, 3));
  HeadDecision blocks = test::tq_blocks(d, {1, 2, 4});
  out.push_back(blocks);
  out.push_back(test::norm_corrected(blocks));
  out.push_back(test::compact_norms(blocks, d, 4));
  for (int r : {1, 5, d}) {
    HeadDecision lr;
    lr.kind = CodingKind::kLowRankHadamard;
    lr.rank = r;
    lr.bits = 3;
    lr.hadamard_seed = 11;
    lr.basis.assign(static_cast<size_t>(d) * r, 0.f);
    for (int j = 0; j < r; ++j) lr.basis[static_cast<size_t>((j * 7) % d) * r + j] = 1.f;  // distinct unit columns
    lr.mean.resize(static_cast<size_t>(d));
    for (int i = 0; i < d; ++i) lr.mean[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i % 5);
    out.push_back(lr);
  }
  for (Side s : {Side::kK, Side::kV}) {
    HeadDecision kv;
    kv.kind = CodingKind::kKivi;
    kv.side = s;
    kv.bits = 2;
    kv.group_size = 5;
    out.push_back(kv);
  }
  for (MinifloatFormat f : {MinifloatFormat::kFp8E4M3, MinifloatFormat::kNvfp4}) {
    HeadDecision mf;
    mf.kind = CodingKind::kMinifloat;
    mf.minifloat = f;
    mf.scale = 0.01f;
    out.push_back(mf);
  }
  if ((d & (d - 1)) == 0)  // vLLM's TurboQuant: power-of-two head dims only
    for (Side s : {Side::kK, Side::kV})
      for (int b : {3, 4, 8, 16}) {
        if (s == Side::kV && b == 8) continue;
        HeadDecision tq;
        tq.kind = CodingKind::kVllmTurboQuant;
        tq.side = s;
        tq.bits = b;
        out.push_back(tq);
      }
  return out;
}

TEST(CodingKinds, NamesAreTheManifestSchemasEnumInEnumOrder) {
  std::ifstream in(std::string(KVQ_SOURCE_DIR) + "/schemas/allocation-manifest.schema.json");
  ASSERT_TRUE(in) << "schemas/allocation-manifest.schema.json";
  const auto schema = nlohmann::json::parse(in);
  const auto& kinds = schema.at("$defs").at("head").at("properties").at("kind").at("enum");
  ASSERT_EQ(kinds.size(), kNumCodingKinds);
  for (size_t i = 0; i < kNumCodingKinds; ++i) {
    EXPECT_EQ(kinds[i].get<std::string>(), kCodingKinds[i].name);
    EXPECT_EQ(static_cast<size_t>(kCodingKinds[i].kind), i);
    EXPECT_EQ(find_coding_kind(std::string(kCodingKinds[i].name)), &kCodingKinds[i]);
  }
  EXPECT_EQ(find_coding_kind(std::string("tq_groups")), nullptr);
  EXPECT_EQ(find_coding_kind(static_cast<CodingKind>(kNumCodingKinds)), nullptr);
}

TEST(CodingKinds, CodeBitsAreTheCodeStreamOfTheLayout) {
  for (int d : {8, 40, 64, 96}) {
    for (const HeadDecision& dec : one_of_each(d)) {
      const HeadCodec codec(dec, d);
      const layout::PackedLayout& L = codec.layout();
      // Bytes of one block minus its records hold tokens_per_block tokens' codes, rounded up.
      const uint64_t stream_bits = uint64_t(L.block_bytes - L.meta_bytes) * 8;
      const uint64_t tpb = L.tokens_per_block;
      const int64_t cb = code_bits(dec, d);
      EXPECT_LE(uint64_t(cb) * tpb, stream_bits) << to_string(dec.kind) << " d " << d;
      EXPECT_GT(uint64_t(cb) * tpb + 16, stream_bits) << to_string(dec.kind) << " d " << d;  // < 2 bytes of padding
      EXPECT_EQ(cb, int64_t(L.code_bits_per_token)) << to_string(dec.kind) << " d " << d;
      // Codes unpacked from the bytes: code_dim of them per token, each below 2^width.
      const int n = 13;
      const std::vector<float> x = gaussian_rows(n, d, 3);
      const std::vector<uint8_t> packed = codec.encode(x.data(), n);
      std::vector<uint8_t> codes(static_cast<size_t>(n) * codec.code_dim());
      codec.unpack_codes(packed.data(), n, codes.data());
      const std::vector<int> w = dim_widths(dec, d);
      int wmax = 0;
      for (int v : w) wmax = std::max(wmax, v);
      for (uint8_t c : codes) EXPECT_LT(int(c), 1 << wmax);
    }
  }
}

TEST(CodingKinds, QueryToLatentIsTheAdjointOfDecode) {
  for (int d : {8, 40, 64, 96}) {
    for (const HeadDecision& dec : one_of_each(d)) {
      const HeadCodec codec(dec, d);
      const int n = 11, cd = codec.code_dim();
      const std::vector<float> x = gaussian_rows(n, d, 5, 2.0);
      const std::vector<uint8_t> packed = codec.encode(x.data(), n);
      std::vector<float> xh(static_cast<size_t>(n) * d), lat(static_cast<size_t>(n) * cd);
      codec.decode(packed.data(), n, xh.data());
      codec.decode_latent(packed.data(), n, lat.data());
      const std::vector<float> q = gaussian_rows(1, d, 9);
      std::vector<float> qc(static_cast<size_t>(cd));
      float q_off = 123.f;
      codec.query_to_latent(q.data(), qc.data(), &q_off);
      for (int t = 0; t < n; ++t) {
        double lhs = 0, rhs = q_off, scale = 0;
        for (int i = 0; i < d; ++i) {
          lhs += double(q[size_t(i)]) * xh[size_t(t) * d + i];
          scale += std::fabs(double(q[size_t(i)]) * xh[size_t(t) * d + i]);
        }
        for (int k = 0; k < cd; ++k) rhs += double(qc[size_t(k)]) * lat[size_t(t) * cd + k];
        EXPECT_NEAR(lhs, rhs, 1e-5 * (scale + 1.0)) << to_string(dec.kind) << " d " << d << " token " << t;
      }
    }
  }
}

}  // namespace
}  // namespace kvq::codec
