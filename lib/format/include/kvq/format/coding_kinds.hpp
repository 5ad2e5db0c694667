#pragma once
// One row per CodingKind: everything the host code needs to know about a kind apart from how its
// codec codes (lib/codec/src/kind_<name>.cpp) — its number and name on disk, the allocation
// version that introduced it, the decision fields it uses, its packed layout with the decision's
// checks, the code bits of each head coordinate. Read by the allocation file's reader and writer
// (lib/io), the reports (lib/report), the allocators' cost model (lib/alloc) and the codec; no
// switch on the kind elsewhere. Host-only (std::string, kvq::Error); the kernels see the layout.
//
// Adding a kind: a CodingKind value (decision.hpp, with any new decision field), its functions
// below and one row of kCodingKinds; then its codec (lib/codec/README.md).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvq/format/decision.hpp"
#include "kvq/format/packed_layout.hpp"
#include "kvq/util/error.hpp"

namespace kvq {

// "L3 H1 K": names a decision in messages.
inline std::string decision_name(const HeadDecision& dec) {
  return "L" + std::to_string(dec.layer) + " H" + std::to_string(dec.kv_head) + (dec.side == Side::kK ? " K" : " V");
}

// "fp8" / "nvfp4": the names kvq-allocate's --formats, the allocation file and the reports use.
inline const char* to_string(MinifloatFormat f) {
  switch (f) {
    case MinifloatFormat::kFp8E4M3: return "fp8";
    case MinifloatFormat::kNvfp4: return "nvfp4";
  }
  return "unknown";
}
static_assert(static_cast<uint32_t>(MinifloatFormat::kFp8E4M3) == layout::kMinifloatFp8E4M3 &&
                  static_cast<uint32_t>(MinifloatFormat::kNvfp4) == layout::kMinifloatNvfp4,
              "MinifloatFormat and the packed layout's format numbers are one set");

// The HeadDecision fields a kind's decisions carry, as a set: the allocation file writes and reads
// exactly these per head (manifest heads[] keys in brackets; schemas/allocation-manifest.schema.json).
enum DecisionField : uint32_t {
  kFieldGroups = 1u << 0,         // groups[] [groups], norm_correction [norm_correction, per head in v3]
  kFieldBlockBits = 1u << 1,      // block_bits [block_bits], reporting only
  kFieldGroupNorms = 1u << 2,     // ratio_bits, norm_log2_lo/step, ratio_codebook [group_norms]
  kFieldRank = 1u << 3,           // rank [rank]
  kFieldBits = 1u << 4,           // bits [bits]
  kFieldBudgetBits = 1u << 5,     // budget_bits [budget_bits], the solver's per-token budget
  kFieldHadamardSeed = 1u << 6,   // hadamard_seed [hadamard_seed]
  kFieldBasisMean = 1u << 7,      // basis, mean [basis, mean: names of /tensors datasets]
  kFieldScale = 1u << 8,          // scale [scale]: the static scale the codec codes with, finite > 0
  kFieldScaleRecorded = 1u << 9,  // scale [scale]: recorded, not used by the codec (any float)
  kFieldGroupSize = 1u << 10,     // group_size [group_size]
  kFieldMinifloat = 1u << 11,     // minifloat [format]
};

struct CodingKindTraits {
  CodingKind kind;
  const char* name;           // manifest heads[].kind and the reports; written to files: never rename
  int64_t first_alloc_version;  // the allocation version that introduced it (older files refuse it)
  uint32_t fields;            // DecisionField set
  // The packed layout, checking every field the bytes depend on (d and side already checked).
  layout::PackedLayout (*layout)(const HeadDecision& dec, int head_dim);
  // The checks of the payload that fixes what the codes mean, not how many there are (may be null).
  void (*check_payload)(const HeadDecision& dec, int head_dim);
  // Code bits of each head coordinate into w[0..head_dim) (zeroed by the caller): the reports'
  // per-dimension widths; their sum is the decision's code bits (the allocators' cost model).
  // A low-rank kind gives its rank's bits to the first `rank` entries.
  void (*dim_widths)(const HeadDecision& dec, int head_dim, int* w);
};

namespace layout {
namespace detail {

[[noreturn]] inline void bad_decision(const HeadDecision& dec, const std::string& field, const std::string& what) {
  throw Error("", "decision " + decision_name(dec) + ": " + field, what);
}

inline void check_bits(const HeadDecision& dec, const std::string& field, int bits) {
  if (bits < static_cast<int>(kMinBits) || bits > static_cast<int>(kMaxBits))
    bad_decision(dec, field, "must be in 1..8, got " + std::to_string(bits));
}

}  // namespace detail
}  // namespace layout

namespace kinds {

using layout::PackedLayout;
using layout::detail::bad_decision;
using layout::detail::check_bits;

// ---- tq-groups: TQ-MSE per coordinate group (uniform, Block-GTQ) ----

inline PackedLayout tq_groups_layout(const HeadDecision& dec, int head_dim) {
  using namespace layout;
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
    if (dec.groups.size() < 2) bad_decision(dec, "ratio_bits", "compact group norms need >= 2 groups, the head has 1");
    if (!std::isfinite(dec.norm_log2_lo) || !std::isfinite(dec.norm_log2_step) || !(dec.norm_log2_step > 0.f))
      bad_decision(dec, "norm_log2_step", "compact norm levels need a finite lo and a step > 0, got lo " +
                                              std::to_string(dec.norm_log2_lo) + ", step " +
                                              std::to_string(dec.norm_log2_step));
    // The top level must stay a finite float: 2^(lo + (2^(16-k) - 2) step) < 2^128.
    const double top = double(dec.norm_log2_lo) +
                       double((1u << (kCompactRecordBits - dec.ratio_bits)) - 2u) * double(dec.norm_log2_step);
    if (!(top < 127.0) || !(dec.norm_log2_lo > -149.0))
      bad_decision(dec, "norm_log2_lo", "compact norm levels span 2^" + std::to_string(dec.norm_log2_lo) + " .. 2^" +
                                            std::to_string(top) + ", outside a float's range");
  }
  return make_tq_layout(static_cast<uint32_t>(dec.side), static_cast<uint32_t>(head_dim), dims, bits,
                        static_cast<uint32_t>(dec.groups.size()), static_cast<uint32_t>(dec.ratio_bits));
}

inline void tq_groups_payload(const HeadDecision& dec, int) {
  if (dec.ratio_bits <= 0) return;
  const size_t want = (size_t{1} << dec.ratio_bits) * dec.groups.size();
  if (dec.ratio_codebook.size() != want)
    bad_decision(dec, "ratio_codebook", "has " + std::to_string(dec.ratio_codebook.size()) +
                                            " values, expected 2^ratio_bits * groups = " + std::to_string(want));
  for (size_t i = 0; i < dec.ratio_codebook.size(); ++i)
    if (!(std::isfinite(dec.ratio_codebook[i]) && dec.ratio_codebook[i] >= 0.f))
      bad_decision(dec, "ratio_codebook", "value at " + std::to_string(i) + " is not finite and >= 0");
}

inline void tq_groups_widths(const HeadDecision& dec, int head_dim, int* w) {
  for (const TqGroup& g : dec.groups)
    for (int i : g.dims)
      if (i >= 0 && i < head_dim) w[i] = g.bits;
}

// ---- lowrank-hadamard: y = U_r^T (x - mu), seeded-sign WHT, uniform scalar (KV-COBRA) ----

inline PackedLayout lowrank_hadamard_layout(const HeadDecision& dec, int head_dim) {
  if (dec.rank < 1 || dec.rank > head_dim)
    bad_decision(dec, "rank", "must be in 1.." + std::to_string(head_dim) + ", got " + std::to_string(dec.rank));
  check_bits(dec, "bits", dec.bits);
  return layout::make_lrh_layout(static_cast<uint32_t>(dec.side), static_cast<uint32_t>(head_dim),
                                 static_cast<uint32_t>(dec.rank), static_cast<uint32_t>(dec.bits));
}

inline void lowrank_hadamard_payload(const HeadDecision& dec, int head_dim) {
  const size_t want = static_cast<size_t>(head_dim) * static_cast<size_t>(dec.rank);
  if (dec.basis.size() != want)
    bad_decision(dec, "basis",
                 "has " + std::to_string(dec.basis.size()) + " values, expected d*rank = " + std::to_string(want));
  if (dec.mean.size() != static_cast<size_t>(head_dim))
    bad_decision(dec, "mean",
                 "has " + std::to_string(dec.mean.size()) + " values, expected d = " + std::to_string(head_dim));
  for (size_t i = 0; i < dec.basis.size(); ++i)
    if (!std::isfinite(dec.basis[i])) bad_decision(dec, "basis", "non-finite value at " + std::to_string(i));
  for (size_t i = 0; i < dec.mean.size(); ++i)
    if (!std::isfinite(dec.mean[i])) bad_decision(dec, "mean", "non-finite value at " + std::to_string(i));
}

inline void lowrank_hadamard_widths(const HeadDecision& dec, int head_dim, int* w) {
  for (int i = 0; i < std::min(dec.rank, head_dim); ++i) w[i] = dec.bits;
}

// ---- kivi: asymmetric min/max, K per channel over tokens, V per token over channels ----

inline PackedLayout kivi_layout(const HeadDecision& dec, int head_dim) {
  check_bits(dec, "bits", dec.bits);
  if (dec.group_size < 1 || dec.group_size > 65536)
    bad_decision(dec, "group_size", "must be in 1..65536, got " + std::to_string(dec.group_size));
  return layout::make_kivi_layout(static_cast<uint32_t>(dec.side), static_cast<uint32_t>(head_dim),
                                  static_cast<uint32_t>(dec.bits), static_cast<uint32_t>(dec.group_size));
}

inline void kivi_widths(const HeadDecision& dec, int head_dim, int* w) { std::fill(w, w + head_dim, dec.bits); }

// ---- minifloat: FP8 E4M3 / NVFP4 with a static per-head scale (serving engines' formats) ----

inline PackedLayout minifloat_layout(const HeadDecision& dec, int head_dim) {
  if (dec.minifloat != MinifloatFormat::kFp8E4M3 && dec.minifloat != MinifloatFormat::kNvfp4)
    bad_decision(dec, "minifloat", "unknown format " + std::to_string(static_cast<uint32_t>(dec.minifloat)));
  if (!(std::isfinite(dec.scale) && dec.scale > 0.f))
    bad_decision(dec, "scale", std::string("must be finite and > 0 for ") + to_string(dec.minifloat) + ", got " +
                                   std::to_string(dec.scale));
  return layout::make_minifloat_layout(static_cast<uint32_t>(dec.side), static_cast<uint32_t>(head_dim),
                                       static_cast<uint32_t>(dec.minifloat));
}

// Code bits only: NVFP4's block scales are records, like KIVI's scales.
inline void minifloat_widths(const HeadDecision& dec, int head_dim, int* w) {
  std::fill(w, w + head_dim, dec.minifloat == MinifloatFormat::kFp8E4M3 ? 8 : 4);
}

// ---- vllm-turboquant: vLLM's TurboQuant cache, one side of the engine's slot ----

// Why vLLM's TurboQuant cannot code head dim d (empty when it can); kvq::vllm_tq::unsupported_head_dim
// (lib/codec) is this.
inline std::string vllm_tq_unsupported_head_dim(int head_dim) {
  if (head_dim < 8) return "head dim " + std::to_string(head_dim) + " is under 8 (vLLM packs 3-bit codes 8 to a word)";
  if (head_dim > 256) return "head dim " + std::to_string(head_dim) + " is over 256";
  if ((head_dim & (head_dim - 1)) != 0)
    return "head dim " + std::to_string(head_dim) +
           " is not a power of two (vLLM's Hadamard rotation needs one, vLLM #41413)";
  return "";
}

inline PackedLayout vllm_tq_layout(const HeadDecision& dec, int head_dim) {
  const bool k = dec.side == Side::kK;
  const int b = dec.bits;
  if (!(b == 3 || b == 4 || b == 16 || (k && b == 8)))
    bad_decision(dec, "bits",
                 std::string("vLLM's TurboQuant codes ") + (k ? "keys with 3, 4 or 8 (FP8) bits" : "values with 3 or 4 bits") +
                     ", or keeps the layer (16), got " + std::to_string(b));
  if (b != static_cast<int>(layout::kVllmTqKeptBits))
    if (const std::string why = vllm_tq_unsupported_head_dim(head_dim); !why.empty()) bad_decision(dec, "head_dim", why);
  return layout::make_vllm_tq_layout(static_cast<uint32_t>(dec.side), static_cast<uint32_t>(head_dim),
                                     static_cast<uint32_t>(b));
}

inline void vllm_tq_widths(const HeadDecision& dec, int head_dim, int* w) { std::fill(w, w + head_dim, dec.bits); }

}  // namespace kinds

// Index = the CodingKind's value (its number on disk and in the packed layout).
inline constexpr CodingKindTraits kCodingKinds[] = {
    {CodingKind::kTqGroups, "tq-groups", 1, kFieldGroups | kFieldBlockBits | kFieldGroupNorms,
     kinds::tq_groups_layout, kinds::tq_groups_payload, kinds::tq_groups_widths},
    {CodingKind::kLowRankHadamard, "lowrank-hadamard", 1,
     kFieldRank | kFieldBits | kFieldBudgetBits | kFieldHadamardSeed | kFieldBasisMean | kFieldScaleRecorded,
     kinds::lowrank_hadamard_layout, kinds::lowrank_hadamard_payload, kinds::lowrank_hadamard_widths},
    {CodingKind::kKivi, "kivi", 1, kFieldBits | kFieldGroupSize, kinds::kivi_layout, nullptr, kinds::kivi_widths},
    {CodingKind::kMinifloat, "minifloat", 2, kFieldMinifloat | kFieldScale, kinds::minifloat_layout, nullptr,
     kinds::minifloat_widths},
    {CodingKind::kVllmTurboQuant, "vllm-turboquant", 7, kFieldBits, kinds::vllm_tq_layout, nullptr,
     kinds::vllm_tq_widths},
};
inline constexpr size_t kNumCodingKinds = sizeof(kCodingKinds) / sizeof(kCodingKinds[0]);

constexpr bool coding_kinds_in_enum_order() {
  for (size_t i = 0; i < kNumCodingKinds; ++i)
    if (static_cast<size_t>(kCodingKinds[i].kind) != i) return false;
  return true;
}
static_assert(coding_kinds_in_enum_order(), "kCodingKinds must list every CodingKind in enum order");
static_assert(kNumCodingKinds == layout::kNumKinds, "one kCodingKinds row per packed-layout kind");

// The row of kind k, or nullptr for a value outside the enum (a corrupt or future decision).
constexpr const CodingKindTraits* find_coding_kind(CodingKind k) {
  const auto i = static_cast<size_t>(k);
  return i < kNumCodingKinds ? &kCodingKinds[i] : nullptr;
}

// The row of a valid kind (an internal invariant: decisions reach here validated).
inline const CodingKindTraits& coding_kind(CodingKind k) {
  const CodingKindTraits* t = find_coding_kind(k);
  KVQ_ASSERT(t != nullptr);
  return *t;
}

inline const char* to_string(CodingKind k) {
  const CodingKindTraits* t = find_coding_kind(k);
  return t ? t->name : "?";
}

// The row named `name`, or nullptr.
inline const CodingKindTraits* find_coding_kind(const std::string& name) {
  for (const CodingKindTraits& t : kCodingKinds)
    if (name == t.name) return &t;
  return nullptr;
}

inline bool uses(const HeadDecision& dec, DecisionField f) {
  const CodingKindTraits* t = find_coding_kind(dec.kind);
  return t && (t->fields & f) != 0;
}

}  // namespace kvq
