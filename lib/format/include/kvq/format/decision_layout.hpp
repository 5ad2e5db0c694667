#pragma once
// From a HeadDecision to its packed layout (packed_layout.hpp): the one function that says how many
// bytes a decision stores, used by the codec (lib/codec, which encodes into it) and by the
// allocators' summary (lib/alloc, AllocSummary::effective_bpd). Host-only (std::string, kvq::Error).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/format/decision.hpp"
#include "kvq/format/packed_layout.hpp"
#include "kvq/util/error.hpp"

namespace kvq {

// "L3 H1 K": names a decision in messages.
inline std::string decision_name(const HeadDecision& dec) {
  return "L" + std::to_string(dec.layer) + " H" + std::to_string(dec.kv_head) + (dec.side == Side::kK ? " K" : " V");
}

// "fp8" / "nvfp4": the names kvq-allocate's --formats and the reports use.
inline const char* to_string(MinifloatFormat f) {
  switch (f) {
    case MinifloatFormat::kFp8E4M3: return "fp8";
    case MinifloatFormat::kNvfp4: return "nvfp4";
  }
  return "unknown";
}

namespace layout {

constexpr uint32_t kNvfp4BlockValues = 16;  // = kvq::codec::kNvfp4Block

namespace detail {

[[noreturn]] inline void bad_decision(const HeadDecision& dec, const std::string& field, const std::string& what) {
  throw Error("", "decision " + decision_name(dec) + ": " + field, what);
}

inline void check_bits(const HeadDecision& dec, const std::string& field, int bits) {
  if (bits < static_cast<int>(kMinBits) || bits > static_cast<int>(kMaxBits))
    bad_decision(dec, field, "must be in 1..8, got " + std::to_string(bits));
}

}  // namespace detail

// kMinifloat (schemas/packed-layout.md, kind 3); one token per block, codes LSB-first.
//  FP8 E4M3: no records, d 8-bit E4M3 codes; the static per-head scale lives in the decision.
//  NVFP4:    ceil(d/16) one-byte E4M3 block scales as the records, then d 4-bit E2M1 codes; the
//            fp32 global scale lives in the decision. group_size = 16 (channels per block scale).
// Built here rather than in packed_layout.hpp because no kernel codes this kind yet.
inline PackedLayout make_minifloat_layout(uint32_t side, uint32_t head_dim, MinifloatFormat fmt) {
  PackedLayout L = empty_layout();
  L.kind = kKindMinifloat;
  L.side = side;
  L.head_dim = head_dim;
  L.code_dim = head_dim;
  L.tokens_per_block = 1;
  if (fmt == MinifloatFormat::kFp8E4M3) {
    L.bits = 8;
  } else {
    L.bits = 4;
    L.group_size = kNvfp4BlockValues;
    L.n_records = (head_dim + kNvfp4BlockValues - 1) / kNvfp4BlockValues;
    L.meta_bytes = L.n_records;  // one E4M3 byte per block scale
  }
  L.code_bits_per_token = head_dim * L.bits;
  finish_block(L);
  return L;
}

// The layout of the decision's bytes, checking everything they depend on but not the low-rank
// basis and mean (which fix what the codes mean, not how many there are). Throws kvq::Error naming
// the decision (layer, KV head, side) and the field: TQ groups that are not a partition of [0, d)
// or whose rotation is not haar/identity or codebook not gaussian/sphere (sphere: 2..64 dims),
// widths outside 1..8, more than 32 groups, rank outside [1, d], KIVI group_size outside
// 1..65536, d outside [1, 4096], a minifloat format that is not FP8/NVFP4 or
// a minifloat scale that is not finite and > 0.
inline PackedLayout layout_ignoring_payload(const HeadDecision& dec, int head_dim) {
  using detail::bad_decision;
  using detail::check_bits;
  if (head_dim < 1 || head_dim > static_cast<int>(kMaxHeadDim))
    bad_decision(dec, "head_dim", "must be in 1..4096, got " + std::to_string(head_dim));
  if (dec.side != Side::kK && dec.side != Side::kV)
    bad_decision(dec, "side", "unknown value " + std::to_string(static_cast<uint32_t>(dec.side)));
  const uint32_t side = static_cast<uint32_t>(dec.side);
  const uint32_t d = static_cast<uint32_t>(head_dim);

  switch (dec.kind) {
    case CodingKind::kTqGroups: {
      if (dec.groups.empty()) bad_decision(dec, "groups", "TQ decision has no groups");
      if (dec.groups.size() > kMaxGroups)
        bad_decision(dec, "groups", "at most 32 groups, got " + std::to_string(dec.groups.size()));
      // Fixed-size scratch and field names built only on the error path: the allocators' summary
      // calls this for every head of a model (80 layers x 8 heads x 2 sides on a 70B).
      int16_t seen[kMaxHeadDim];
      std::fill(seen, seen + head_dim, int16_t(-1));
      uint16_t dims[kMaxGroups];
      uint8_t bits[kMaxGroups];
      for (size_t g = 0; g < dec.groups.size(); ++g) {
        const TqGroup& grp = dec.groups[g];
        auto f = [g] { return "groups[" + std::to_string(g) + "]"; };
        if (grp.bits < static_cast<int>(kMinBits) || grp.bits > static_cast<int>(kMaxBits))
          check_bits(dec, f() + ".bits", grp.bits);
        if (grp.dims.empty()) bad_decision(dec, f() + ".dims", "is empty");
        if (grp.rotation != TqRotation::kHaar && grp.rotation != TqRotation::kIdentity)
          bad_decision(dec, f() + ".rotation", "unknown value " + std::to_string(static_cast<uint32_t>(grp.rotation)));
        if (grp.codebook != TqCodebook::kGaussian && grp.codebook != TqCodebook::kSphere)
          bad_decision(dec, f() + ".codebook", "unknown value " + std::to_string(static_cast<uint32_t>(grp.codebook)));
        if (grp.codebook == TqCodebook::kSphere &&
            (grp.dims.size() < 2 || grp.dims.size() > static_cast<size_t>(kTqSphereMaxM)))
          bad_decision(dec, f() + ".codebook",
                       "exact (sphere) codebook needs 2.." + std::to_string(kTqSphereMaxM) + " coordinates, the group has " +
                           std::to_string(grp.dims.size()));
        for (int c : grp.dims) {
          if (c < 0 || c >= head_dim)
            bad_decision(dec, f() + ".dims",
                         "coordinate " + std::to_string(c) + " outside [0, " + std::to_string(head_dim) + ")");
          if (seen[c] >= 0)
            bad_decision(dec, f() + ".dims",
                         "coordinate " + std::to_string(c) + " already in groups[" + std::to_string(seen[c]) + "]");
          seen[c] = static_cast<int16_t>(g);
        }
        dims[g] = static_cast<uint16_t>(grp.dims.size());
        bits[g] = static_cast<uint8_t>(grp.bits);
      }
      for (int c = 0; c < head_dim; ++c)
        if (seen[c] < 0) bad_decision(dec, "groups", "coordinate " + std::to_string(c) + " is in no group");
      if (dec.ratio_bits != 0) {
        if (dec.ratio_bits < 1 || dec.ratio_bits > static_cast<int>(kMaxRatioBits))
          bad_decision(dec, "ratio_bits", "must be in 0..8, got " + std::to_string(dec.ratio_bits));
        if (dec.groups.size() < 2)
          bad_decision(dec, "ratio_bits", "compact group norms need >= 2 groups, the head has 1");
        if (!std::isfinite(dec.norm_log2_lo) || !std::isfinite(dec.norm_log2_step) || !(dec.norm_log2_step > 0.f))
          bad_decision(dec, "norm_log2_step", "compact norm levels need a finite lo and a step > 0, got lo " +
                                                  std::to_string(dec.norm_log2_lo) + ", step " +
                                                  std::to_string(dec.norm_log2_step));
        // The top level must stay a finite float: 2^(lo + (2^(16-k) - 2) step) < 2^128.
        const double top = double(dec.norm_log2_lo) +
                           double((1u << (kCompactRecordBits - dec.ratio_bits)) - 2u) * double(dec.norm_log2_step);
        if (!(top < 127.0) || !(dec.norm_log2_lo > -149.0))
          bad_decision(dec, "norm_log2_lo", "compact norm levels span 2^" + std::to_string(dec.norm_log2_lo) +
                                                " .. 2^" + std::to_string(top) + ", outside a float's range");
      }
      return make_tq_layout(side, d, dims, bits, static_cast<uint32_t>(dec.groups.size()),
                            static_cast<uint32_t>(dec.ratio_bits));
    }
    case CodingKind::kLowRankHadamard:
      if (dec.rank < 1 || dec.rank > head_dim)
        bad_decision(dec, "rank", "must be in 1.." + std::to_string(head_dim) + ", got " + std::to_string(dec.rank));
      check_bits(dec, "bits", dec.bits);
      return make_lrh_layout(side, d, static_cast<uint32_t>(dec.rank), static_cast<uint32_t>(dec.bits));
    case CodingKind::kKivi:
      check_bits(dec, "bits", dec.bits);
      if (dec.group_size < 1 || dec.group_size > 65536)
        bad_decision(dec, "group_size", "must be in 1..65536, got " + std::to_string(dec.group_size));
      return make_kivi_layout(side, d, static_cast<uint32_t>(dec.bits), static_cast<uint32_t>(dec.group_size));
    case CodingKind::kMinifloat:
      if (dec.minifloat != MinifloatFormat::kFp8E4M3 && dec.minifloat != MinifloatFormat::kNvfp4)
        bad_decision(dec, "minifloat", "unknown format " + std::to_string(static_cast<uint32_t>(dec.minifloat)));
      if (!(std::isfinite(dec.scale) && dec.scale > 0.f))
        bad_decision(dec, "scale", std::string("must be finite and > 0 for ") + to_string(dec.minifloat) + ", got " +
                                       std::to_string(dec.scale));
      return make_minifloat_layout(side, d, dec.minifloat);
  }
  bad_decision(dec, "kind", "unknown coding kind " + std::to_string(static_cast<uint32_t>(dec.kind)));
}

// What the codec codes with: layout_ignoring_payload's checks, then a low-rank basis of d*rank
// and a mean of d finite values.
inline PackedLayout layout_for(const HeadDecision& dec, int head_dim) {
  const PackedLayout L = layout_ignoring_payload(dec, head_dim);
  if (dec.kind == CodingKind::kLowRankHadamard) {
    const size_t want = static_cast<size_t>(head_dim) * static_cast<size_t>(dec.rank);
    if (dec.basis.size() != want)
      detail::bad_decision(dec, "basis", "has " + std::to_string(dec.basis.size()) +
                                             " values, expected d*rank = " + std::to_string(want));
    if (dec.mean.size() != static_cast<size_t>(head_dim))
      detail::bad_decision(dec, "mean", "has " + std::to_string(dec.mean.size()) + " values, expected d = " +
                                            std::to_string(head_dim));
    for (size_t i = 0; i < dec.basis.size(); ++i)
      if (!std::isfinite(dec.basis[i])) detail::bad_decision(dec, "basis", "non-finite value at " + std::to_string(i));
    for (size_t i = 0; i < dec.mean.size(); ++i)
      if (!std::isfinite(dec.mean[i])) detail::bad_decision(dec, "mean", "non-finite value at " + std::to_string(i));
  }
  if (dec.kind == CodingKind::kTqGroups && dec.ratio_bits > 0) {
    const size_t want = (size_t{1} << dec.ratio_bits) * dec.groups.size();
    if (dec.ratio_codebook.size() != want)
      detail::bad_decision(dec, "ratio_codebook", "has " + std::to_string(dec.ratio_codebook.size()) +
                                                      " values, expected 2^ratio_bits * groups = " + std::to_string(want));
    for (size_t i = 0; i < dec.ratio_codebook.size(); ++i)
      if (!(std::isfinite(dec.ratio_codebook[i]) && dec.ratio_codebook[i] >= 0.f))
        detail::bad_decision(dec, "ratio_codebook", "value at " + std::to_string(i) + " is not finite and >= 0");
  }
  return L;
}

// The head-norm levels of a compact TQ decision (HeadDecision::ratio_bits > 0): 2^(16 - k) floats,
// level 0 = 0, level q >= 1 = float(2^(lo + (q - 1) step)) computed in double; increasing. Every
// coder (CPU encoder and decoder, the CUDA tables) uses this one table. Empty when ratio_bits == 0.
inline std::vector<float> tq_compact_levels(const HeadDecision& dec) {
  std::vector<float> lv;
  if (dec.ratio_bits <= 0) return lv;
  lv.resize(size_t{1} << (kCompactRecordBits - static_cast<uint32_t>(dec.ratio_bits)));
  lv[0] = 0.f;
  for (size_t q = 1; q < lv.size(); ++q)
    lv[q] = static_cast<float>(std::exp2(double(dec.norm_log2_lo) + double(q - 1) * double(dec.norm_log2_step)));
  return lv;
}

// Effective bits per dimension of the decision's packed layout (every stored bit per token per
// dim, see schemas/packed-layout.md); same validation as layout_for.
inline double effective_bpd(const HeadDecision& dec, int head_dim) {
  return effective_bpd(layout_for(dec, head_dim));
}

}  // namespace layout
}  // namespace kvq
