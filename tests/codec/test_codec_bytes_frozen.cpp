// The CPU encoder's bytes on every coding kind, frozen: a fixed input coded with every kind (and
// the TQ variants: widths, rotation, codebook, compact norms; low rank at non-power-of-two ranks;
// KIVI K/V at ragged group sizes; FP8/NVFP4 at d not a multiple of 16) must give exactly the
// sha256 recorded when these hashes were first taken (before the codec was split into one file
// per kind). A change here is a change of the packed format or of the codes: never update a hash
// without a format version and a note saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvq/codec/codec.hpp"
#include "kvq/util/sha256.hpp"
#include "test_util.hpp"

namespace kvq::codec {
namespace {

// Input rows that reach every encoder path: Gaussian rows at per-row scales over 2^-6..2^6, one
// zero row, one row above the fp16 range (norms saturate at 65504), one row with a single
// non-zero coordinate. Built from a plain 64-bit LCG so the input does not depend on kvq's RNG.
std::vector<float> frozen_rows(int n, int d, uint64_t seed) {
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next = [&s] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  };
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (int t = 0; t < n; ++t) {
    const double scale = std::exp2(12.0 * next() - 6.0);
    for (int i = 0; i < d; ++i) {
      // Box-Muller, one value per pair of uniforms.
      const double u1 = next(), u2 = next();
      const double g = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
      x[static_cast<size_t>(t) * d + i] = static_cast<float>(scale * g * (1.0 + 0.25 * (i % 7)));
    }
  }
  if (n > 3) {
    for (int i = 0; i < d; ++i) {
      x[static_cast<size_t>(1) * d + i] = 0.f;
      x[static_cast<size_t>(2) * d + i] = 40000.f * static_cast<float>(1 + (i % 3));
      x[static_cast<size_t>(3) * d + i] = i == d / 3 ? -3.5f : 0.f;
    }
  }
  return x;
}

// A d x r orthonormal basis (Gram-Schmidt in double over seeded columns), row-major [d][r].
std::vector<float> basis(int d, int r, uint64_t seed) {
  std::vector<std::vector<double>> cols;
  for (int j = 0; j < r; ++j) {
    const std::vector<float> g = frozen_rows(1, d, seed + static_cast<uint64_t>(j));  // no special rows
    std::vector<double> v(g.begin(), g.end());
    for (const auto& c : cols) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += v[i] * c[i];
      for (int i = 0; i < d; ++i) v[i] -= dot * c[i];
    }
    double n = 0;
    for (double a : v) n += a * a;
    for (double& a : v) a /= std::sqrt(n);
    cols.push_back(v);
  }
  std::vector<float> b(static_cast<size_t>(d) * r);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < r; ++j) b[static_cast<size_t>(i) * r + j] = static_cast<float>(cols[j][i]);
  return b;
}

struct Case {
  std::string name;
  HeadDecision dec;
  int d;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int d : {8, 64, 96})
    for (int b = 1; b <= 8; ++b)
      out.push_back({"tq-uniform d" + std::to_string(d) + " b" + std::to_string(b), test::tq_uniform(d, b, 7 + b), d});
  const HeadDecision blocks = test::tq_blocks(64, {1, 2, 3, 4});
  out.push_back({"tq-blocks d64 1234", blocks, 64});
  out.push_back({"tq-blocks d64 1234 norm-corrected", test::norm_corrected(blocks), 64});
  out.push_back({"tq-blocks d64 1234 rotate-below-3", test::rotate_below(blocks, 3), 64});
  HeadDecision sphere = test::tq_blocks(96, {2, 5, 3});
  for (TqGroup& g : sphere.groups) g.codebook = TqCodebook::kSphere;
  out.push_back({"tq-blocks d96 253 sphere", sphere, 96});
  out.push_back({"tq-blocks d64 1234 compact-4", test::compact_norms(blocks, 64, 4), 64});
  out.push_back({"tq-blocks d96 253 compact-8", test::compact_norms(test::tq_blocks(96, {2, 5, 3}), 96, 8), 96});
  for (int d : {64, 96})
    for (int r : {1, 5, 16, 24, d})
      for (int b : {1, 3, 4, 8}) {
        HeadDecision dec;
        dec.kind = CodingKind::kLowRankHadamard;
        dec.side = Side::kV;
        dec.rank = r;
        dec.bits = b;
        dec.budget_bits = r * b;
        dec.hadamard_seed = 1000 + static_cast<uint64_t>(r);
        dec.basis = basis(d, r, 77 + static_cast<uint64_t>(r));
        dec.mean.resize(static_cast<size_t>(d));
        for (int i = 0; i < d; ++i) dec.mean[static_cast<size_t>(i)] = 0.125f * static_cast<float>(i % 9) - 0.5f;
        out.push_back({"lowrank d" + std::to_string(d) + " r" + std::to_string(r) + " b" + std::to_string(b), dec, d});
      }
  for (Side side : {Side::kK, Side::kV})
    for (int gs : {7, 32})
      for (int b : {1, 2, 4, 8}) {
        HeadDecision dec;
        dec.kind = CodingKind::kKivi;
        dec.side = side;
        dec.bits = b;
        dec.group_size = gs;
        out.push_back({std::string("kivi ") + (side == Side::kK ? "K" : "V") + " g" + std::to_string(gs) + " b" +
                           std::to_string(b),
                       dec, 64});
      }
  for (int d : {40, 64})
    for (MinifloatFormat f : {MinifloatFormat::kFp8E4M3, MinifloatFormat::kNvfp4}) {
      HeadDecision dec;
      dec.kind = CodingKind::kMinifloat;
      dec.minifloat = f;
      dec.scale = f == MinifloatFormat::kFp8E4M3 ? 0.0625f : 0.0078125f;
      out.push_back({std::string(f == MinifloatFormat::kFp8E4M3 ? "fp8" : "nvfp4") + " d" + std::to_string(d), dec, d});
    }
  // vLLM's TurboQuant (allocation version 7): every side and width at two head dims.
  for (int d : {64, 128})
    for (Side side : {Side::kK, Side::kV})
      for (int b : {3, 4, 8, 16}) {
        if (side == Side::kV && b == 8) continue;
        HeadDecision dec;
        dec.kind = CodingKind::kVllmTurboQuant;
        dec.side = side;
        dec.bits = b;
        out.push_back({std::string("vllm-tq ") + (side == Side::kK ? "K" : "V") + " d" + std::to_string(d) + " b" +
                           std::to_string(b),
                       dec, d});
      }
  return out;
}

// Recorded from the codec as it was before the per-kind split (commit d57c61b).
const std::map<std::string, std::string>& recorded() {
  static const std::map<std::string, std::string> m = {
#include "codec_bytes_frozen.inc"
  };
  return m;
}

TEST(CodecBytesFrozen, EveryKindEncodesToTheRecordedBytes) {
  const int n = 75;  // not a multiple of the encoder's 32-token tile nor of a KIVI group
  int checked = 0;
  std::string table;
  for (const Case& c : cases()) {
    const std::vector<float> x = frozen_rows(n, c.d, 2024);
    const HeadCodec codec(c.dec, c.d);
    const std::vector<uint8_t> bytes = codec.encode(x.data(), n);
    const std::string h = sha256_hex(bytes.data(), bytes.size());
    table += "    {\"" + c.name + "\", \"" + h + "\"},\n";
    const auto it = recorded().find(c.name);
    if (it == recorded().end()) {
      ADD_FAILURE() << "no recorded hash for case '" << c.name << "'";
      continue;
    }
    EXPECT_EQ(h, it->second) << c.name << ": the encoder's bytes changed";
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(recorded().size())) << "a recorded case is no longer run";
  if (HasFailure()) std::printf("hashes now (codec_bytes_frozen.inc form):\n%s", table.c_str());
}

}  // namespace
}  // namespace kvq::codec
