#pragma once
// The contract between kvq-allocate (lib/alloc), the allocation file (lib/io) and the codec
// (lib/codec, kernels/): what one (layer, KV head, side) is quantized with. Enum values are written
// to disk: never renumber; retire with a comment.
#include <cstdint>
#include <string>
#include <vector>

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
};
const char* to_string(Method m);
Method method_from_string(const std::string& s);  // throws kvq::Error listing the valid names

// How a head vector is coded.
enum class CodingKind : uint32_t {
  kTqGroups = 0,         // TQ-MSE on one or more coordinate groups (uniform, block-gtq)
  kLowRankHadamard = 1,  // y = U_r^T (x - mu), seeded-sign WHT, uniform scalar at `bits`
  kKivi = 2,
};

// One TQ-MSE group: the head coordinates it covers (for Block-GTQ K: the post-RoPE coordinates of
// its RoPE blocks, block order, each block's pair in the model's pairing), its width and the seed
// of its Haar rotation. Codebook id = bits (Lloyd-Max for N(0, 1/m), m = dims.size()).
struct TqGroup {
  int bits = 0;
  std::vector<int> dims;
  uint64_t rotation_seed = 0;
};

struct HeadDecision {
  int layer = 0;
  int kv_head = 0;
  Side side = Side::kK;
  CodingKind kind = CodingKind::kTqGroups;
  bool post_rope = false;  // K coded after RoPE (Block-GTQ) or before (COBRA, uniform pre-RoPE)

  // kTqGroups
  std::vector<TqGroup> groups;
  std::vector<int> block_bits;  // per RoPE block, for reporting (Block-GTQ K); empty otherwise

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
};

}  // namespace kvq
