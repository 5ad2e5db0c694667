#pragma once
// Quantized-weight readers: how a logical weight is stored in a checkpoint as it ships, and its
// dequantization to fp32 a row range at a time (one layer, one expert, one parallel chunk), never
// the whole model. Torch-free. Formats (MODEL-FAMILIES-2026.md §2.5, §3.4, §7; the official code
// where that map is silent):
//   FP8 blocks     X.weight F8_E4M3 [out,in] + X.weight_scale_inv F32 [ceil(out/bo), ceil(in/bi)]
//                  (DeepSeek-V3 kernel.py weight_dequant: W = fp8(Q) * S[i/bo, j/bi], in fp32)
//   FP8 + scale    X.weight F8_E4M3 + X.weight_scale: [] or [1] per tensor, [out,1] per channel,
//                  [ceil(out/bo), ceil(in/bi)] per block (compressed-tensors, AutoFP8, ModelOpt);
//                  X.input_scale (activations) is not read
//   INT4 packed    X.weight_packed I32 [out, ceil(in/8)] + X.weight_scale [out, ceil(in/g)] +
//                  X.weight_shape I32 [2] (compressed-tensors pack-quantized, symmetric):
//                  W = (nibble - 8) * scale, element j in nibble j%8 of word j/8
//   MXFP4          P_blocks U8 [E?, out, in/32, 16] + P_scales U8 [E?, out, in/32] (gpt-oss):
//                  W = E2M1(nibble, low first) * 2^(scale - 127)
//   plain          X.weight F32/F16/BF16, as it is
// Use: parse_quant_config once per checkpoint; per weight, describe_weight (validates; call it for
// every weight before decoding any), check_weight_shape against the config, then decode_rows over
// chunks of rows in parallel (at::parallel_for), one layer or one expert at a time.
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "../safetensors.hpp"

namespace kvq::detail {

// ---- scalar decoders (exact in fp32; a NaN code decodes to NaN, the weight decoders refuse it) --

// FP8 E4M3 "e4m3fn": no infinity, S.1111.111 (0x7F, 0xFF) is NaN, max ±448, subnormals 2^-6·m/8.
float fp8_e4m3_to_f32(uint8_t code);
inline bool fp8_e4m3_is_nan(uint8_t code) { return (code & 0x7F) == 0x7F; }
// FP4 E2M1 (OCP MX), low 4 bits of `nibble`: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
float fp4_e2m1_to_f32(uint8_t nibble);
// E8M0 scale 2^(s-127); s = 255 is NaN (OCP MX).
float e8m0_to_f32(uint8_t s);
inline bool e8m0_is_nan(uint8_t s) { return s == 0xFF; }
// Element j of a compressed-tensors pack-quantized INT4 row (int32 words, little-endian as stored):
// nibble j%8 of word j/8, minus the offset 8, in [-8, 7].
int int4_packed_at(const uint8_t* row_words, int64_t j);

// ---- what the config says ---------------------------------------------------------------------

// config.json's quantization_config, parsed and checked once (throws kvq::Error naming `source`,
// the field and the value). Known quant_method: "fp8" (DeepSeek / HF fine-grained FP8, AutoFP8),
// "compressed-tensors" (FP8 float-quantized / naive-quantized, INT4 pack-quantized), "mxfp4"
// (gpt-oss), "modelopt" (quant_algo FP8). Null or absent: no weight is quantized.
struct QuantConfig {
  enum class Method { kNone, kFp8, kCompressedTensors, kMxfp4, kModelOpt };
  Method method = Method::kNone;
  std::string source;                  // the config file, for messages
  // FP8 block size [bo, bi] (weight_block_size, or compressed-tensors' block_structure); 0: none.
  int64_t block_out = 0, block_in = 0;
  // Which stored forms the config allows: FP8 weights (fp8; compressed-tensors float groups;
  // modelopt quant_algo FP8), INT4 pack-quantized (compressed-tensors int groups; group size along
  // `in`, 0 for strategy "channel": one scale per row).
  bool has_fp8 = false;
  bool has_int4 = false;
  int64_t int4_group = 32;
};

QuantConfig parse_quant_config(const nlohmann::json& quantization_config, const std::string& source);
const char* method_name(QuantConfig::Method m);

// ---- how one logical weight is stored ---------------------------------------------------------

// The checkpoint's tensors as the loader knows them: which file holds tensor `name` (nullptr when
// none does; the loader passes its weight_map), and what to call the checkpoint in a message about
// a tensor no file holds (the directory, or the index file).
struct TensorLookup {
  std::function<const SafetensorsFile*(const std::string& name)> find;
  std::string where;
};

enum class WeightFormat { kPlain, kFp8Block, kFp8Tensor, kFp8Channel, kInt4Packed, kMxfp4 };
const char* format_name(WeightFormat f);

struct QuantWeight {
  std::string name;                       // the logical weight: "X.weight", or "P" for MXFP4
  WeightFormat format = WeightFormat::kPlain;
  std::vector<int64_t> shape;             // logical: [out, in], [E, out, in] (MXFP4), or as stored
  const SafetensorsFile* file = nullptr;  // holds the codes (the plain tensor)
  std::string data;                       // X.weight, X.weight_packed, P_blocks
  const SafetensorsFile* scale_file = nullptr;
  std::string scale;                      // X.weight_scale_inv, X.weight_scale, P_scales; "" plain
  // One scale per block_rows × block_cols elements of the [rows, cols] view (per tensor: the
  // whole matrix; per channel: 1 × cols; INT4: 1 × group; MXFP4: 1 × 32), row-major.
  int64_t block_rows = 1, block_cols = 1;

  // The [rows, cols] view decode_rows works on: cols is the last logical dim, rows the rest (an
  // MXFP4 expert e is rows [e·out, (e+1)·out)).
  int64_t rows() const;
  int64_t cols() const;
  // Every stored tensor decoding reads (for SafetensorsFile::drop and stored_bytes).
  std::vector<std::string> stored_tensors() const;
};

// True when the checkpoint holds logical weight `name` in any of the forms above.
bool weight_present(const TensorLookup& lookup, const std::string& name);

// Finds how `name` is stored and validates everything the headers say before any payload is read:
// the format against qc.method, every dtype, the scale's presence and shape, an INT4 weight_shape
// (two int32 read) against the packed shape, no zero point / g_idx. Throws kvq::Error (one line:
// file, tensor, field and value) on any mismatch.
QuantWeight describe_weight(const TensorLookup& lookup, const QuantConfig& qc, const std::string& name);

// The logical shape against the one the config implies; throws kvq::Error like
// SafetensorsFile::check ("shape [..] does not match [..] expected from the config").
void check_weight_shape(const QuantWeight& w, const std::vector<int64_t>& expected);

// Rows [row_begin, row_end) of w's [rows, cols] view, dequantized to fp32 into
// dst[0, (row_end - row_begin) · cols). Rows are independent: callers split a weight into chunks
// and decode them in parallel. A NaN code (FP8 0x7F/0xFF, E8M0 255) or a non-finite result throws
// kvq::Error naming the tensor and the element. The range must lie inside the view (KVQ_ASSERT).
void decode_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* dst);

}  // namespace kvq::detail
