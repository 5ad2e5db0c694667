#pragma once
// The contract between kvq-allocate (lib/alloc), the allocation file (lib/io) and the codec
// (lib/codec, kernels/): what one (layer, KV head, side) is quantized with. Enum values and method
// names are written to disk: never renumber or rename; retire with a comment.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/format/packed_layout.hpp"
#include "kvq/util/error.hpp"

namespace kvq {

enum class Side : uint32_t { kK = 0, kV = 1 };

enum class Method : uint32_t {
  kUniform = 0,        // TQ-MSE, one group = whole head vector
  kBlockGtq = 1,       // TQ-MSE per group of equal-width RoPE blocks (post-RoPE K)
  kCobraMse = 2,       // low rank + Hadamard + uniform scalar, C1 + damped C2
  kCobraKl = 3,        // as kCobraMse with KL-weighted basis order
  kCobraDp = 4,        // C1 curves + exact C2
  kCobraMeasured = 5,  // measured D(r,b) + exact C2
  kKivi = 6,           // KIVI-style asymmetric baseline (K per channel, V per token)
  kLayerPrecision = 7, // per layer: FP8 E4M3 or NVFP4 for its K and V (serving engines' formats)
  kVllmTurboQuant = 8, // vLLM's TurboQuant cache: one preset for the model, the layers to keep in BF16
};

struct MethodName {
  Method method;
  const char* name;
};
// Names are user-facing (--method) and recorded in files: never rename. Index = enum value.
inline constexpr MethodName kMethodNames[] = {
    {Method::kUniform, "uniform"},         {Method::kBlockGtq, "block-gtq"},
    {Method::kCobraMse, "cobra-mse"},      {Method::kCobraKl, "cobra-kl"},
    {Method::kCobraDp, "cobra-dp"},        {Method::kCobraMeasured, "cobra-measured"},
    {Method::kKivi, "kivi"},               {Method::kLayerPrecision, "layer-precision"},
    {Method::kVllmTurboQuant, "vllm-turboquant"},
};
constexpr bool method_table_in_enum_order() {
  for (size_t i = 0; i < sizeof(kMethodNames) / sizeof(kMethodNames[0]); ++i)
    if (static_cast<size_t>(kMethodNames[i].method) != i) return false;
  return true;
}
static_assert(method_table_in_enum_order(), "kMethodNames must list every Method in enum order");
static_assert(static_cast<uint32_t>(Method::kKivi) == 6 && static_cast<uint32_t>(Method::kLayerPrecision) == 7 &&
                  static_cast<uint32_t>(Method::kVllmTurboQuant) == 8,
              "Method values are frozen (written to files)");

inline const char* to_string(Method m) {
  const auto i = static_cast<size_t>(m);
  return i < sizeof(kMethodNames) / sizeof(kMethodNames[0]) ? kMethodNames[i].name : "unknown";
}

// Throws kvq::Error listing the valid names.
inline Method method_from_string(const std::string& s) {
  std::string valid;
  for (const auto& e : kMethodNames) {
    if (s == e.name) return e.method;
    valid += valid.empty() ? "" : ", ";
    valid += e.name;
  }
  throw Error("", "method", "unknown value '" + s + "' (valid: " + valid + ")");
}

inline bool is_cobra(Method m) {
  return m == Method::kCobraMse || m == Method::kCobraKl || m == Method::kCobraDp || m == Method::kCobraMeasured;
}

// How a head vector is coded.
enum class CodingKind : uint32_t {
  kTqGroups = 0,         // TQ-MSE on one or more coordinate groups (uniform, block-gtq)
  kLowRankHadamard = 1,  // y = U_r^T (x - mu), seeded-sign WHT, uniform scalar at `bits`
  kKivi = 2,
  kMinifloat = 3,  // a serving engine's number format (MinifloatFormat) with a static per-head scale
  // vLLM's TurboQuant cache, one side of the engine's slot (kvq/codec/vllm_turboquant.hpp), by
  // `bits`: K 3 or 4 = Lloyd-Max keys after the Hadamard rotation with the norm correction of the
  // _nc presets, K 8 = FP8 E4M3 keys (k8v4); V 3 or 4 = per-token min/max uniform values; 16 = the
  // layer kept in the model dtype (--kv-cache-dtype-skip-layers), stored as BF16.
  kVllmTurboQuant = 4,
};
// kMinifloat formats (kvq/codec/minifloat.hpp). Written to files: never renumber.
enum class MinifloatFormat : uint32_t {
  kFp8E4M3 = 0,  // x^ = E4M3(x / scale) * scale, scale = amax * margin / 448 (vLLM's k_scale/v_scale)
  kNvfp4 = 1,    // blocks of 16: E4M3 block scale, E2M1 codes, fp32 global scale = amax / (448 * 6)
};
static_assert(static_cast<uint32_t>(CodingKind::kTqGroups) == layout::kKindTqGroups &&
                  static_cast<uint32_t>(CodingKind::kLowRankHadamard) == layout::kKindLowRankHadamard &&
                  static_cast<uint32_t>(CodingKind::kKivi) == layout::kKindKivi &&
                  static_cast<uint32_t>(CodingKind::kMinifloat) == layout::kKindMinifloat &&
                  static_cast<uint32_t>(CodingKind::kVllmTurboQuant) == layout::kKindVllmTurboQuant,
              "CodingKind and the packed layout's kind numbers are one set");
static_assert(static_cast<uint32_t>(Side::kK) == layout::kSideK && static_cast<uint32_t>(Side::kV) == layout::kSideV,
              "Side and the packed layout's side numbers are one set");

// A TQ group's rotation. Written to files as "haar" / "identity" (allocation version 2; absent =
// haar): never rename.
enum class TqRotation : uint32_t {
  kHaar = 0,      // the seeded Haar matrix of rotation_seed
  kIdentity = 1,  // no rotation (kvq-allocate --rotate-below: narrow groups, as the Block-GTQ
                  // reference codes groups below 3 bits)
};

// A TQ group's scalar codebook. Written to files as "gaussian" / "exact" (allocation version 2,
// groups[].codebook, written only for kSphere; absent = gaussian): never rename.
enum class TqCodebook : uint32_t {
  kGaussian = 0,  // Lloyd-Max for N(0, 1/m) (the normal approximation of a coordinate's law)
  kSphere = 1,    // Lloyd-Max for the exact law of one coordinate of a uniformly random unit vector
                  // in R^m, density ~ (1 - x^2)^((m-3)/2) (kvq-allocate --codebook exact);
                  // only for 2 <= m <= kTqSphereMaxM (a larger group is refused, never silently
                  // coded with another table: kvq-allocate records gaussian for those groups)
};
// Largest group size with a kSphere codebook (= kvq::codec::kSphereExactMaxM, static_assert there).
inline constexpr int kTqSphereMaxM = 64;

// One TQ-MSE group: the head coordinates it covers (for Block-GTQ K: the post-RoPE coordinates of
// its RoPE blocks, block order, each block's pair in the model's pairing), its width, its
// rotation (the seed of its Haar rotation, kept even when the group is coded unrotated) and its
// codebook kind. Codebook id = (codebook, bits, m = dims.size()), computed, never stored.
struct TqGroup {
  int bits = 0;
  std::vector<int> dims;
  uint64_t rotation_seed = 0;
  TqRotation rotation = TqRotation::kHaar;
  TqCodebook codebook = TqCodebook::kGaussian;
};

struct HeadDecision {
  int layer = 0;
  int kv_head = 0;
  Side side = Side::kK;
  CodingKind kind = CodingKind::kTqGroups;
  bool post_rope = false;  // K coded after RoPE (Block-GTQ) or before (COBRA, uniform pre-RoPE)

  // kTqGroups
  std::vector<TqGroup> groups;
  // Decode x_D = rho~ Pi^T (c / ||c||) instead of rho~ Pi^T c (c = the token's centroid vector of
  // group D): Lloyd-Max centroids shrink a unit vector (E||c||^2 = 1 - MSE), so without it every
  // decoded vector is biased towards zero. Codes are the same either way. false = allocation
  // format version 1's decoding (and the default here, so a hand-built decision decodes as
  // before); kvq-allocate's --norm-correction on|off|auto sets it (auto, the default: per head,
  // from the reservoir). Per decision: every decoder takes it per head (allocation files store
  // one value, or, version 3, one per TQ head when they differ).
  bool norm_correction = false;
  std::vector<int> block_bits;  // per RoPE block, for reporting (Block-GTQ K); empty otherwise
  // Compact group norms (allocation format version 4; kvq-allocate --group-norms compact): instead
  // of one fp16 norm per group, each token stores one 16-bit record = the head norm rho = ||x|| as
  // a level code of 16 - ratio_bits bits plus the index of the nearest ratio vector
  // (rho_1, ..., rho_G) / rho in ratio_codebook (ratio_bits bits); group g decodes with
  // rho~_g = level(code) * ratio_codebook[index][g]. Levels: 0 -> 0, q >= 1 ->
  // 2^(norm_log2_lo + (q - 1) * norm_log2_step) (tq_compact_levels). 0 = fp16 per group (the
  // default, and every file before version 4). Needs >= 2 groups.
  int ratio_bits = 0;
  float norm_log2_lo = 0.f;
  float norm_log2_step = 0.f;
  std::vector<float> ratio_codebook;  // [2^ratio_bits][groups.size()] row-major, finite, >= 0

  // kLowRankHadamard
  int rank = 0;
  int bits = 0;
  int budget_bits = 0;        // B_h, the per-token bit budget the solver gave this head
  std::vector<float> basis;   // [d][rank] row-major: column j = j-th kept direction
  std::vector<float> mean;    // [d]
  uint64_t hadamard_seed = 0;
  float scale = 0.f;          // per-head quantizer scale, if the codec uses a static one
  double predicted_distortion = 0.0;  // D*_h(B_h) under the solver's model

  // kKivi
  int group_size = 32;

  // kVllmTurboQuant: `bits` above (K 3, 4, 8 or 16; V 3, 4 or 16).

  // kMinifloat: the format; `scale` above holds its static scale (FP8: the per-head scale, NVFP4:
  // the global scale), computed from the calibration's amax.
  MinifloatFormat minifloat = MinifloatFormat::kFp8E4M3;
};

}  // namespace kvq
