#include "kvq/codec/layout.hpp"

#include <cmath>
#include <vector>

#include "kvq/util/error.hpp"

namespace kvq::codec {
namespace {

[[noreturn]] void bad(const HeadDecision& dec, const std::string& field, const std::string& what) {
  throw Error("", "decision " + decision_name(dec) + ": " + field, what);
}

void check_bits(const HeadDecision& dec, const std::string& field, int bits) {
  if (bits < static_cast<int>(layout::kMinBits) || bits > static_cast<int>(layout::kMaxBits))
    bad(dec, field, "must be in 1..8, got " + std::to_string(bits));
}

}  // namespace

std::string decision_name(const HeadDecision& dec) {
  return "L" + std::to_string(dec.layer) + " H" + std::to_string(dec.kv_head) +
         (dec.side == Side::kK ? " K" : " V");
}

layout::PackedLayout layout_for(const HeadDecision& dec, int head_dim) {
  if (head_dim < 1 || head_dim > static_cast<int>(layout::kMaxHeadDim))
    bad(dec, "head_dim", "must be in 1..4096, got " + std::to_string(head_dim));
  if (dec.side != Side::kK && dec.side != Side::kV)
    bad(dec, "side", "unknown value " + std::to_string(static_cast<uint32_t>(dec.side)));
  const uint32_t side = static_cast<uint32_t>(dec.side);
  const uint32_t d = static_cast<uint32_t>(head_dim);

  switch (dec.kind) {
    case CodingKind::kTqGroups: {
      if (dec.groups.empty()) bad(dec, "groups", "TQ decision has no groups");
      if (dec.groups.size() > layout::kMaxGroups)
        bad(dec, "groups", "at most 32 groups, got " + std::to_string(dec.groups.size()));
      std::vector<int> seen(static_cast<size_t>(head_dim), -1);
      std::vector<uint16_t> dims;
      std::vector<uint8_t> bits;
      for (size_t g = 0; g < dec.groups.size(); ++g) {
        const TqGroup& grp = dec.groups[g];
        const std::string f = "groups[" + std::to_string(g) + "]";
        check_bits(dec, f + ".bits", grp.bits);
        if (grp.dims.empty()) bad(dec, f + ".dims", "is empty");
        for (int c : grp.dims) {
          if (c < 0 || c >= head_dim)
            bad(dec, f + ".dims", "coordinate " + std::to_string(c) + " outside [0, " +
                                      std::to_string(head_dim) + ")");
          if (seen[static_cast<size_t>(c)] >= 0)
            bad(dec, f + ".dims", "coordinate " + std::to_string(c) + " already in groups[" +
                                      std::to_string(seen[static_cast<size_t>(c)]) + "]");
          seen[static_cast<size_t>(c)] = static_cast<int>(g);
        }
        dims.push_back(static_cast<uint16_t>(grp.dims.size()));
        bits.push_back(static_cast<uint8_t>(grp.bits));
      }
      for (int c = 0; c < head_dim; ++c)
        if (seen[static_cast<size_t>(c)] < 0)
          bad(dec, "groups", "coordinate " + std::to_string(c) + " is in no group");
      return layout::make_tq_layout(side, d, dims.data(), bits.data(),
                                    static_cast<uint32_t>(dims.size()));
    }
    case CodingKind::kLowRankHadamard: {
      if (dec.rank < 1 || dec.rank > head_dim)
        bad(dec, "rank", "must be in 1.." + std::to_string(head_dim) + ", got " +
                             std::to_string(dec.rank));
      check_bits(dec, "bits", dec.bits);
      const size_t want = static_cast<size_t>(head_dim) * static_cast<size_t>(dec.rank);
      if (dec.basis.size() != want)
        bad(dec, "basis", "has " + std::to_string(dec.basis.size()) + " values, expected d*rank = " +
                              std::to_string(want));
      if (dec.mean.size() != static_cast<size_t>(head_dim))
        bad(dec, "mean", "has " + std::to_string(dec.mean.size()) + " values, expected d = " +
                             std::to_string(head_dim));
      for (size_t i = 0; i < dec.basis.size(); ++i)
        if (!std::isfinite(dec.basis[i])) bad(dec, "basis", "non-finite value at " + std::to_string(i));
      for (size_t i = 0; i < dec.mean.size(); ++i)
        if (!std::isfinite(dec.mean[i])) bad(dec, "mean", "non-finite value at " + std::to_string(i));
      return layout::make_lrh_layout(side, d, static_cast<uint32_t>(dec.rank),
                                     static_cast<uint32_t>(dec.bits));
    }
    case CodingKind::kKivi: {
      check_bits(dec, "bits", dec.bits);
      if (dec.group_size < 1 || dec.group_size > 65536)
        bad(dec, "group_size", "must be in 1..65536, got " + std::to_string(dec.group_size));
      return layout::make_kivi_layout(side, d, static_cast<uint32_t>(dec.bits),
                                      static_cast<uint32_t>(dec.group_size));
    }
  }
  bad(dec, "kind", "unknown coding kind " + std::to_string(static_cast<uint32_t>(dec.kind)));
}

double effective_bpd(const HeadDecision& dec, int head_dim) {
  return layout::effective_bpd(layout_for(dec, head_dim));
}

}  // namespace kvq::codec
