// vLLM's TurboQuant KV cache (`--kv-cache-dtype turboquant_*`), reproduced on the CPU: the four
// presets, the Lloyd-Max key codebook exactly as vLLM solves it, the normalised Sylvester Hadamard
// rotation, the key and value quantizers and the bytes of one (token, KV head) slot. Facts from
// vllm-project/vllm (see ../shared/VLLM-TURBOQUANT.md for the paths): centroids.py at 06d0369d, the
// store kernel and the backend at 0135d081, config.py at 1471680b.
//
// Keys (3/4-bit presets): k in fp32, n = ||k||2, x = k / (n + 1e-8), y = x . H (H symmetric,
// orthonormal, no random signs); the code of y_j is the number of fp32 midpoints of the fp32
// centroids that are <= y_j; stored: the codes, then fp16(n). Decode: c_j = centroids[code_j],
// with norm correction c <- c / sqrt(sum c^2 + 1e-16), k^ = f16(n) * (c . H).
// k8v4: the key is D FP8 E4M3 bytes (round to nearest even, saturating), no rotation, no scale.
// Values (every preset): not rotated; mn, mx of the vector in fp32; s = max((mx - mn) / (2^b - 1),
// 1e-8) in fp32; q = clamp(trunc((v - mn) / s + 0.5), 0, 2^b - 1); stored fp16(s), fp16(mn);
// decode v^ = q * f16(s) + f16(mn) (a minimum below -65504 is -inf in fp16: the vector decodes
// non-finite, as in the engine, vLLM #53334).
// Slot: [key codes | fp16 norm | value codes | fp16 scale | fp16 zero | pad to even], fp16 little-
// endian; 4-bit codes two per byte, element 2j in the low nibble; 3-bit codes in 24-bit little-
// endian words of 8 elements, element i at bits 3i..3i+2.
// Where a GPU may differ: the order of the norm's and the rotation's sums, Triton's fp32 division
// (div.full, <= 2 ulp) in the value code at an exact .5 tie, FMA; codes agree except at such ties.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvq::vllm_tq {

enum class Preset { kK8V4, k4BitNc, kK3V4Nc, k3BitNc };
inline constexpr int kNumPresets = 4;

struct PresetInfo {
  Preset preset;
  const char* name;  // the --kv-cache-dtype value
  int key_bits;      // 8 = FP8 E4M3 keys; 3 or 4 = Lloyd-Max keys
  int value_bits;    // 3 or 4
  bool norm_correction;
};
const PresetInfo& info(Preset p);
std::optional<Preset> parse_preset(std::string_view name);
std::string preset_names();  // "turboquant_k8v4, turboquant_4bit_nc, ..." for messages

// Bytes of one (token, KV head) slot at head dim D.
struct SlotLayout {
  int head_dim = 0;
  int key_code_bytes = 0;    // ceil(D * key_bits / 8), or D for FP8 keys
  int key_bytes = 0;         // + 2 (fp16 norm) for Lloyd-Max keys
  int value_code_bytes = 0;  // ceil(D * value_bits / 8)
  int value_bytes = 0;       // + 4 (fp16 scale, fp16 zero)
  int slot_bytes = 0;        // key_bytes + value_bytes rounded up to even
};
// Why vLLM cannot code head dim D (empty when it can): not a power of two (#41413), under 8 (the
// 3-bit words), over 256.
std::string unsupported_head_dim(int head_dim);
SlotLayout slot_layout(Preset p, int head_dim);  // throws std::invalid_argument when unsupported

// vLLM's solve_lloyd_max(d, bits): Lloyd-Max for N(0, 1/d) in double, trapezoid integrals over 200
// intervals, outer edges +-10.5 sigma, stop when the largest move < 1e-10 (returning the iterate
// before that move) or after 200 iterations; centroids cast to float.
struct Codebook {
  std::vector<float> centroids;  // 2^bits, ascending
  std::vector<float> midpoints;  // (c_i + c_{i+1}) / 2 in fp32, what the store kernel searches
  int iterations = 0;            // updates made (the stopping iteration's move not counted)
};
Codebook lloyd_max(int head_dim, int bits);

// The D x D Sylvester Hadamard matrix divided by sqrt(D) in fp32, row-major.
std::vector<float> hadamard(int head_dim);

// One side of a slot on its own, codes unpacked (one per element) — what the coding kind
// `vllm-turboquant` (kind_vllm_turboquant.cpp) stores in kvq's packed layout and Codec packs into
// the engine's slot. Key (3/4 bits): codes and the fp16 bits of the norm; decode with the norm
// correction of the _nc presets. Value: codes and the fp16 bits of the scale and the zero.
void encode_key(const Codebook& cb, const std::vector<float>& rotation, int head_dim, const float* k, uint8_t* codes,
                uint16_t* norm_f16);
void decode_key(const Codebook& cb, const std::vector<float>& rotation, int head_dim, bool norm_correction,
                const uint8_t* codes, uint16_t norm_f16, float* k);
void encode_value(const float* v, int head_dim, int bits, uint8_t* codes, uint16_t* scale_f16, uint16_t* zero_f16);
void decode_value(const uint8_t* codes, int head_dim, uint16_t scale_f16, uint16_t zero_f16, float* v);

// Everything one preset needs at one head dim, built once.
class Codec {
 public:
  Codec(Preset p, int head_dim);
  const PresetInfo& preset() const { return *info_; }
  const SlotLayout& layout() const { return layout_; }
  const Codebook& codebook() const { return codebook_; }  // empty for k8v4
  const std::vector<float>& rotation() const { return h_; }

  // One token of one KV head: k and v (D floats each) into slot (layout().slot_bytes bytes).
  void encode(const float* k, const float* v, uint8_t* slot) const;
  // The engine's reading of a slot: k and v (D floats each).
  void decode(const uint8_t* slot, float* k, float* v) const;

  // The codes of a slot (one per element, key then value) — for tests and kvq-inspect.
  void unpack(const uint8_t* slot, uint8_t* key_codes, uint8_t* value_codes) const;

 private:
  const PresetInfo* info_;
  SlotLayout layout_;
  Codebook codebook_;
  std::vector<float> h_;
};

}  // namespace kvq::vllm_tq
