#include "quant.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>
#include <nlohmann/json.hpp>

#include "kvq/util/error.hpp"

namespace kvq::detail {
namespace {

using json = nlohmann::json;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const std::string kQc = "quantization_config";

std::string tensor_field(const std::string& name) { return "tensor '" + name + "'"; }

bool is_float_dtype(const std::string& d) { return d == "F32" || d == "F16" || d == "BF16"; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One table per code width: the hot loops index these instead of decoding bit fields.
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int c = 0; c < 256; ++c) a[c] = fp8_e4m3_to_f32(uint8_t(c));
    return a;
  }();
  return t;
}

constexpr std::array<float, 16> kE2m1 = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                         -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

std::string hex_byte(unsigned v) {
  static const char* d = "0123456789ABCDEF";
  return std::string("0x") + d[(v >> 4) & 0xF] + d[v & 0xF];
}

std::string index_str(std::initializer_list<int64_t> idx) { return shape_str(std::vector<int64_t>(idx)); }

std::string fmt_float(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A positive integer pair [a, b] (weight_block_size, block_structure); "AxB" strings are the
// older compressed-tensors spelling.
std::pair<int64_t, int64_t> parse_block(const json& j, const std::string& source, const std::string& field) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    const size_t x = s.find('x');
    try {
      size_t p1 = 0, p2 = 0;
      const long long a = std::stoll(s.substr(0, x), &p1), b = std::stoll(s.substr(x + 1), &p2);
      if (x != std::string::npos && p1 == x && p2 == s.size() - x - 1 && a > 0 && b > 0) return {a, b};
    } catch (const std::exception&) {
    }
    throw Error(source, field, "'" + s + "' is not a block size [rows, cols] of positive integers");
  }
  if (!j.is_array() || j.size() != 2 || !j[0].is_number_integer() || !j[1].is_number_integer() ||
      j[0].get<int64_t>() <= 0 || j[1].get<int64_t>() <= 0)
    throw Error(source, field, j.dump() + " is not a block size [rows, cols] of positive integers");
  return {j[0].get<int64_t>(), j[1].get<int64_t>()};
}

void parse_compressed_tensors(const json& qc, QuantConfig& c) {
  const std::string& src = c.source;
  const std::string top_format = qc.contains("format") && qc["format"].is_string() ? qc["format"].get<std::string>() : "";
  if (!qc.contains("config_groups") || qc["config_groups"].is_null()) return;  // e.g. a KV-cache-only config
  const json& groups = qc["config_groups"];
  if (!groups.is_object()) throw Error(src, kQc + ".config_groups", "is not an object");
  for (auto it = groups.begin(); it != groups.end(); ++it) {
    const std::string gfield = kQc + ".config_groups." + it.key();
    if (!it.value().is_object()) throw Error(src, gfield, "is not an object");
    const json& g = it.value();
    if (!g.contains("weights") || g["weights"].is_null()) continue;
    const json& w = g["weights"];
    const std::string wf = gfield + ".weights";
    if (!w.is_object()) throw Error(src, wf, "is not an object");
    const std::string format = g.contains("format") && g["format"].is_string() ? g["format"].get<std::string>() : top_format;
    auto str = [&](const char* key, const std::string& dflt) {
      if (!w.contains(key) || w[key].is_null()) return dflt;
      if (!w[key].is_string()) throw Error(src, wf + "." + key, w[key].dump() + " is not a string");
      return w[key].get<std::string>();
    };
    auto integer = [&](const char* key, int64_t dflt) {
      if (!w.contains(key) || w[key].is_null()) return dflt;
      if (!w[key].is_number_integer()) throw Error(src, wf + "." + key, w[key].dump() + " is not an integer");
      return w[key].get<int64_t>();
    };
    const std::string type = str("type", "int");
    const int64_t bits = integer("num_bits", 8);
    const std::string strategy = str("strategy", "tensor");
    if (type == "int") {
      if (bits != 4) throw Error(src, wf + ".num_bits", std::to_string(bits) + " is not supported for int weights (4)");
      if (w.contains("symmetric") && !w["symmetric"].is_null() && !(w["symmetric"].is_boolean() && w["symmetric"].get<bool>()))
        throw Error(src, wf + ".symmetric", w["symmetric"].dump() + ": asymmetric INT4 (zero points) is not supported, symmetric only");
      if (format != "pack-quantized")
        throw Error(src, kQc + ".format", "'" + format + "' is not supported for int weights (pack-quantized)");
      int64_t group = 0;
      if (strategy == "group") {
        group = integer("group_size", 32);
        if (group <= 0) throw Error(src, wf + ".group_size", std::to_string(group) + " is not positive");
      } else if (strategy != "channel") {
        throw Error(src, wf + ".strategy", "'" + strategy + "' is not supported for int weights (group, channel)");
      }
      if (c.has_int4 && c.int4_group != group)
        throw Error(src, wf + ".group_size", "config groups with different INT4 group sizes are not supported");
      c.has_int4 = true;
      c.int4_group = group;
    } else if (type == "float") {
      if (bits != 8)
        throw Error(src, wf + ".num_bits", std::to_string(bits) + " is not supported for float weights (8: FP8 E4M3)");
      if (!format.empty() && format != "float-quantized" && format != "naive-quantized")
        throw Error(src, kQc + ".format", "'" + format + "' is not supported for float weights (float-quantized, naive-quantized)");
      if (strategy == "block") {
        if (!w.contains("block_structure")) throw Error(src, wf + ".block_structure", "missing for strategy 'block'");
        const auto b = parse_block(w["block_structure"], src, wf + ".block_structure");
        if (c.block_out && (c.block_out != b.first || c.block_in != b.second))
          throw Error(src, wf + ".block_structure", "config groups with different FP8 blocks are not supported");
        c.block_out = b.first;
        c.block_in = b.second;
      } else if (strategy != "tensor" && strategy != "channel") {
        throw Error(src, wf + ".strategy", "'" + strategy + "' is not supported for float weights (tensor, channel, block)");
      }
      c.has_fp8 = true;
    } else {
      throw Error(src, wf + ".type", "'" + type + "' is not supported (int, float)");
    }
  }
}

}  // namespace

// ---- scalar decoders ----------------------------------------------------------------------------

float fp8_e4m3_to_f32(uint8_t code) {
  if (fp8_e4m3_is_nan(code)) return kNaN;
  const uint32_t sign = uint32_t(code & 0x80) << 24, exp = (code >> 3) & 0xF, mant = code & 7;
  if (exp == 0) {
    const float v = float(mant) * 0x1p-9f;  // subnormal: 2^-6 · m/8
    return sign ? -v : v;
  }
  return from_bits(sign | ((exp - 7 + 127) << 23) | (mant << 20));  // rebias 7 -> 127
}

float fp4_e2m1_to_f32(uint8_t nibble) { return kE2m1[nibble & 0xF]; }

float e8m0_to_f32(uint8_t s) {
  if (e8m0_is_nan(s)) return kNaN;
  return s == 0 ? from_bits(0x00400000u) /* 2^-127: an fp32 subnormal */ : from_bits(uint32_t(s) << 23);
}

int int4_packed_at(const uint8_t* row_words, int64_t j) {
  uint32_t w;
  std::memcpy(&w, row_words + 4 * (j / 8), 4);  // host little-endian, as the safetensors reader assumes
  return int((w >> (4 * (j % 8))) & 0xF) - 8;
}

// ---- config -------------------------------------------------------------------------------------

const char* method_name(QuantConfig::Method m) {
  switch (m) {
    case QuantConfig::Method::kNone: return "none";
    case QuantConfig::Method::kFp8: return "fp8";
    case QuantConfig::Method::kCompressedTensors: return "compressed-tensors";
    case QuantConfig::Method::kMxfp4: return "mxfp4";
    case QuantConfig::Method::kModelOpt: return "modelopt";
  }
  return "?";
}

QuantConfig parse_quant_config(const json& qc, const std::string& source) {
  QuantConfig c;
  c.source = source;
  if (qc.is_null()) return c;
  if (!qc.is_object()) throw Error(source, kQc, "is not an object");
  if (!qc.contains("quant_method") || !qc["quant_method"].is_string())
    throw Error(source, kQc + ".quant_method", "missing or not a string");
  const std::string m = qc["quant_method"].get<std::string>();
  if (m == "fp8") {
    c.method = QuantConfig::Method::kFp8;
    c.has_fp8 = true;
    if (qc.contains("fmt") && qc["fmt"] != "e4m3")
      throw Error(source, kQc + ".fmt", qc["fmt"].dump() + " is not supported (e4m3)");
    // DeepSeek-V3's config names [128, 128]; it is also what HF's fine-grained FP8 defaults to.
    c.block_out = c.block_in = 128;
    if (qc.contains("weight_block_size") && !qc["weight_block_size"].is_null())
      std::tie(c.block_out, c.block_in) = parse_block(qc["weight_block_size"], source, kQc + ".weight_block_size");
  } else if (m == "compressed-tensors") {
    c.method = QuantConfig::Method::kCompressedTensors;
    parse_compressed_tensors(qc, c);
  } else if (m == "mxfp4") {
    c.method = QuantConfig::Method::kMxfp4;
  } else if (m == "modelopt") {
    c.method = QuantConfig::Method::kModelOpt;
    // vLLM's ModelOptFp8Config reads quant_algo under "quantization" (hf_quant_config.json's
    // layout) or at the top (config.json's).
    const bool nested = qc.contains("quantization") && qc["quantization"].is_object();
    const json& q = nested ? qc["quantization"] : qc;
    const std::string field = kQc + (nested ? ".quantization" : "") + ".quant_algo";
    if (q.contains("quant_algo") && !q["quant_algo"].is_null()) {
      if (q["quant_algo"] != "FP8" && q["quant_algo"] != "FP8_PER_CHANNEL_PER_TOKEN")
        throw Error(source, field, q["quant_algo"].dump() + " is not supported (FP8, FP8_PER_CHANNEL_PER_TOKEN)");
      c.has_fp8 = true;
    }
  } else {
    throw Error(source, kQc + ".quant_method",
                "'" + m + "' is not supported (fp8, compressed-tensors, mxfp4, modelopt)");
  }
  return c;
}

// ---- description --------------------------------------------------------------------------------

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kPlain: return "plain";
    case WeightFormat::kFp8Block: return "FP8 blocks";
    case WeightFormat::kFp8Tensor: return "FP8 per tensor";
    case WeightFormat::kFp8Channel: return "FP8 per channel";
    case WeightFormat::kInt4Packed: return "INT4 pack-quantized";
    case WeightFormat::kMxfp4: return "MXFP4";
  }
  return "?";
}

int64_t QuantWeight::rows() const {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
  return r;
}

int64_t QuantWeight::cols() const { return shape.empty() ? 1 : shape.back(); }

std::vector<std::string> QuantWeight::stored_tensors() const {
  std::vector<std::string> v = {data};
  if (!scale.empty()) v.push_back(scale);
  if (format == WeightFormat::kInt4Packed) v.push_back(name + "_shape");
  return v;
}

bool weight_present(const TensorLookup& lookup, const std::string& name) {
  return lookup.find(name) || lookup.find(name + "_packed") || lookup.find(name + "_blocks");
}

namespace {

// Tensor `name` in the file the lookup named for it; an index may name a shard that lacks it.
const StTensorInfo& info_of(const SafetensorsFile* f, const std::string& name) {
  const StTensorInfo* t = f->find(name);
  if (!t) throw Error(f->path(), tensor_field(name), "missing (the checkpoint's index names this file for it)");
  return *t;
}

// The quantization_config a format needs, or a one-line refusal naming the stored tensor.
void require_method(const QuantConfig& qc, bool ok, const SafetensorsFile* f, const std::string& tensor,
                    const std::string& what, const std::string& needs) {
  if (ok) return;
  const std::string found = qc.method == QuantConfig::Method::kNone
                                ? qc.source + " has no quantization_config"
                                : qc.source + "'s quantization_config (quant_method '" +
                                      method_name(qc.method) + "') declares none";
  throw Error(f->path(), tensor_field(tensor), "is " + what + " but " + found + " (needs " + needs + ")");
}

void require_float_scale(const SafetensorsFile* f, const std::string& scale, const StTensorInfo& t) {
  if (!is_float_dtype(t.dtype))
    throw Error(f->path(), tensor_field(scale), "dtype " + t.dtype + " is not a scale dtype (F32, F16, BF16)");
}

void describe_fp8(const TensorLookup& lookup, const QuantConfig& qc, const StTensorInfo& t, QuantWeight& w) {
  const bool fp8_ok = (qc.method == QuantConfig::Method::kFp8 || qc.method == QuantConfig::Method::kCompressedTensors ||
                       qc.method == QuantConfig::Method::kModelOpt) && qc.has_fp8;
  require_method(qc, fp8_ok, w.file, w.name, "F8_E4M3", "fp8, compressed-tensors float weights or modelopt FP8");
  if (t.shape.size() != 2)
    throw Error(w.file->path(), tensor_field(w.name), "F8_E4M3 weight of shape " + shape_str(t.shape) + " is not 2-D [out, in]");
  const int64_t out = t.shape[0], in = t.shape[1];
  w.shape = t.shape;
  const std::string inv = w.name + "_scale_inv", sc = w.name + "_scale";
  const SafetensorsFile* sf = lookup.find(inv);
  w.scale = inv;
  if (!sf) {
    sf = lookup.find(sc);
    w.scale = sc;
  }
  if (!sf)
    throw Error(w.file->path(), tensor_field(inv),
                "missing: F8_E4M3 weight '" + w.name + "' has no scale tensor (" + inv + " or " + sc + ")");
  w.scale_file = sf;
  const StTensorInfo& s = info_of(sf, w.scale);
  require_float_scale(sf, w.scale, s);
  const bool is_inv = w.scale == inv;
  // _scale_inv is DeepSeek's block format only; default its block where the config names none.
  const int64_t bo = qc.block_out ? qc.block_out : (is_inv ? 128 : 0), bi = qc.block_in ? qc.block_in : (is_inv ? 128 : 0);
  const std::vector<int64_t> blocks = bo ? std::vector<int64_t>{ceil_div(out, bo), ceil_div(in, bi)} : std::vector<int64_t>{};
  const std::string per_block = bo ? shape_str(blocks) + " per " + std::to_string(bo) + "x" + std::to_string(bi) + " block" : "";
  if (!is_inv && (s.shape.empty() || s.shape == std::vector<int64_t>{1})) {
    w.format = WeightFormat::kFp8Tensor;
    w.block_rows = out;
    w.block_cols = in;
  } else if (!is_inv && s.shape == std::vector<int64_t>{out, 1}) {
    w.format = WeightFormat::kFp8Channel;
    w.block_rows = 1;
    w.block_cols = in;
  } else if (bo && s.shape == blocks) {
    w.format = WeightFormat::kFp8Block;
    w.block_rows = bo;
    w.block_cols = bi;
  } else {
    const std::string want = is_inv ? per_block
                                    : "[] or [1] per tensor, " + shape_str({out, 1}) + " per channel" +
                                          (bo ? ", " + per_block : "");
    throw Error(sf->path(), tensor_field(w.scale),
                "shape " + shape_str(s.shape) + " does not fit weight '" + w.name + "' " + shape_str(t.shape) +
                    " (expected " + want + ")");
  }
  // Degenerate weights (a zero dim) have no blocks; rows()/cols() then decode nothing.
  if (out == 0 || in == 0) w.block_rows = w.block_cols = 1;
}

int64_t read_int(const uint8_t* p, const std::string& dtype, int64_t i) {
  if (dtype == "I64") {
    int64_t v;
    std::memcpy(&v, p + 8 * i, 8);
    return v;
  }
  int32_t v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

void describe_int4(const TensorLookup& lookup, const QuantConfig& qc, QuantWeight& w) {
  const std::string packed = w.name + "_packed";
  const StTensorInfo& p = info_of(w.file, packed);
  require_method(qc, qc.method == QuantConfig::Method::kCompressedTensors && qc.has_int4, w.file, packed,
                 "INT4 pack-quantized", "compressed-tensors with int weights");
  const std::string path = w.file->path();
  if (p.dtype != "I32" || p.shape.size() != 2)
    throw Error(path, tensor_field(packed), p.dtype + " " + shape_str(p.shape) + " is not I32 [out, ceil(in/8)]");
  for (const char* extra : {"_zero_point", "_g_idx"})
    if (lookup.find(w.name + extra))
      throw Error(lookup.find(w.name + extra)->path(), tensor_field(w.name + extra),
                  std::string(extra) == "_zero_point" ? "asymmetric INT4 (a zero point) is not supported, symmetric only"
                                                      : "activation reordering (g_idx) is not supported");
  const std::string shape_name = w.name + "_shape";
  const SafetensorsFile* shf = lookup.find(shape_name);
  if (!shf) throw Error(path, tensor_field(shape_name), "missing: INT4 weight '" + w.name + "' needs its [out, in]");
  const StTensorInfo& sh = info_of(shf, shape_name);
  if ((sh.dtype != "I32" && sh.dtype != "I64") || sh.shape != std::vector<int64_t>{2})
    throw Error(shf->path(), tensor_field(shape_name), sh.dtype + " " + shape_str(sh.shape) + " is not I32 [2]");
  const int64_t out = read_int(shf->raw_bytes(shape_name), sh.dtype, 0), in = read_int(shf->raw_bytes(shape_name), sh.dtype, 1);
  if (out < 0 || in < 0 || out != p.shape[0] || ceil_div(in, 8) != p.shape[1])
    throw Error(shf->path(), tensor_field(shape_name),
                "value " + shape_str({out, in}) + " disagrees with " + packed + " " + shape_str(p.shape) +
                    " (needs [out, ceil(in/8)])");
  w.shape = {out, in};
  w.format = WeightFormat::kInt4Packed;
  w.data = packed;
  const int64_t group = qc.int4_group ? qc.int4_group : std::max<int64_t>(in, 1);
  w.scale = w.name + "_scale";
  w.scale_file = lookup.find(w.scale);
  if (!w.scale_file)
    throw Error(path, tensor_field(w.scale), "missing: INT4 weight '" + w.name + "' has no scale tensor");
  const StTensorInfo& s = info_of(w.scale_file, w.scale);
  require_float_scale(w.scale_file, w.scale, s);
  const std::vector<int64_t> want = {out, ceil_div(in, group)};
  if (s.shape != want)
    throw Error(w.scale_file->path(), tensor_field(w.scale),
                "shape " + shape_str(s.shape) + " does not fit weight '" + w.name + "' " + shape_str({out, in}) +
                    " (expected " + shape_str(want) + ": one scale per " + std::to_string(group) + " inputs)");
  w.block_rows = 1;
  w.block_cols = group;
}

void describe_mxfp4(const TensorLookup& lookup, const QuantConfig& qc, QuantWeight& w) {
  const std::string blocks = w.name + "_blocks";
  const StTensorInfo& b = info_of(w.file, blocks);
  require_method(qc, qc.method == QuantConfig::Method::kMxfp4, w.file, blocks, "MXFP4 blocks", "mxfp4");
  const std::string path = w.file->path();
  if (b.dtype != "U8" || b.shape.size() < 3 || b.shape.size() > 4 || b.shape.back() != 16)
    throw Error(path, tensor_field(blocks), b.dtype + " " + shape_str(b.shape) + " is not U8 [E?, out, in/32, 16]");
  w.scale = w.name + "_scales";
  w.scale_file = lookup.find(w.scale);
  if (!w.scale_file)
    throw Error(path, tensor_field(w.scale), "missing: MXFP4 weight '" + w.name + "' has no scale tensor");
  const StTensorInfo& s = info_of(w.scale_file, w.scale);
  const std::vector<int64_t> want(b.shape.begin(), b.shape.end() - 1);
  if (s.dtype != "U8" || s.shape != want)
    throw Error(w.scale_file->path(), tensor_field(w.scale),
                s.dtype + " " + shape_str(s.shape) + " does not fit " + blocks + " " + shape_str(b.shape) +
                    " (expected U8 " + shape_str(want) + ": one E8M0 scale per 32 inputs)");
  w.format = WeightFormat::kMxfp4;
  w.data = blocks;
  w.shape = want;
  w.shape.back() *= 32;
  w.block_rows = 1;
  w.block_cols = 32;
}

}  // namespace

QuantWeight describe_weight(const TensorLookup& lookup, const QuantConfig& qc, const std::string& name) {
  QuantWeight w;
  w.name = name;
  w.data = name;
  if ((w.file = lookup.find(name))) {
    const StTensorInfo& t = info_of(w.file, name);
    if (is_float_dtype(t.dtype)) {
      // A scale beside a float weight means the weight was meant to be scaled: refuse, not guess.
      for (const std::string& sc : {name + "_scale_inv", name + "_scale"})
        if (const SafetensorsFile* sf = lookup.find(sc))
          throw Error(sf->path(), tensor_field(sc), "scales weight '" + name + "' stored as " + t.dtype + ", not F8_E4M3");
      w.shape = t.shape;
      return w;
    }
    if (t.dtype != "F8_E4M3")
      throw Error(w.file->path(), tensor_field(name), "dtype " + t.dtype + " is not a weight dtype (F32, F16, BF16, F8_E4M3)");
    describe_fp8(lookup, qc, t, w);
    return w;
  }
  if ((w.file = lookup.find(name + "_packed"))) {
    describe_int4(lookup, qc, w);
    return w;
  }
  if ((w.file = lookup.find(name + "_blocks"))) {
    describe_mxfp4(lookup, qc, w);
    return w;
  }
  throw Error(lookup.where, tensor_field(name), "missing (and no " + name + "_packed or " + name + "_blocks)");
}

void check_weight_shape(const QuantWeight& w, const std::vector<int64_t>& expected) {
  if (w.shape != expected)
    throw Error(w.file->path(), tensor_field(w.data),
                "shape " + shape_str(w.shape) + (w.format == WeightFormat::kPlain ? "" : std::string(" (") + format_name(w.format) + ")") +
                    " does not match " + shape_str(expected) + " expected from the config");
}

// ---- decoding -----------------------------------------------------------------------------------

namespace {

// The [rows, cols] index of a weight as a message prints it: [e, o, c] for a 3-D MXFP4 weight.
std::string element_str(const QuantWeight& w, int64_t r, int64_t c) {
  if (w.shape.size() == 3) return index_str({r / w.shape[1], r % w.shape[1], c});
  return index_str({r, c});
}

// Scale (sr, b) of the [scale rows, scale cols] grid, printed as the scale tensor is shaped.
[[noreturn]] void bad_scale(const QuantWeight& w, int64_t sr, int64_t b, float s) {
  const size_t rank = w.scale_file->find(w.scale)->shape.size();
  throw Error(w.scale_file->path(), tensor_field(w.scale),
              "element " + (rank == 2 ? index_str({sr, b}) : std::string("[]")) + " is " + fmt_float(s) +
                  ", not a finite scale");
}

[[noreturn]] void overflow(const QuantWeight& w, int64_t r, int64_t c, float code_value, float s) {
  throw Error(w.file->path(), tensor_field(w.data),
              "element " + element_str(w, r, c) + " = " + fmt_float(code_value) + " x scale " + fmt_float(s) +
                  " overflows fp32");
}

// FP8 (blocks, per tensor, per channel: only the scale granularity differs) and INT4 share the
// layout "one scale per block_rows × block_cols"; each row reads its row of scales once. A template
// so the code width is not a branch in the inner loop.
template <bool fp8>
void decode_scaled(const QuantWeight& w, int64_t r0, int64_t r1, float* dst) {
  const int64_t cols = w.cols(), ncb = ceil_div(cols, w.block_cols);
  const uint8_t* codes = w.file->raw_bytes(w.data);
  const int64_t row_bytes = fp8 ? cols : 4 * ceil_div(cols, 8);
  const auto& lut = fp8_table();
  std::vector<float> srow(static_cast<size_t>(ncb));
  int64_t cached = -1;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t sr = r / w.block_rows;
    if (sr != cached) {
      w.scale_file->read_f32(w.scale, sr * ncb, (sr + 1) * ncb, srow.data());
      cached = sr;
    }
    const uint8_t* row = codes + r * row_bytes;
    float* o = dst + (r - r0) * cols;
    for (int64_t b = 0; b < ncb; ++b) {
      const float s = srow[size_t(b)];
      if (!std::isfinite(s)) bad_scale(w, sr, b, s);
      const int64_t c0 = b * w.block_cols, c1 = std::min(cols, (b + 1) * w.block_cols);
      // Branch-free over the block, then one (vectorised) finiteness check of it: a NaN code or an
      // overflow is rare, and found again element by element only then.
      for (int64_t c = c0; c < c1; ++c) {
        if constexpr (fp8) o[c] = lut[row[c]] * s;
        else o[c] = float(int4_packed_at(row, c)) * s;
      }
      bool finite = true;
      for (int64_t c = c0; c < c1; ++c) finite &= std::abs(o[c]) <= std::numeric_limits<float>::max();
      if (!finite)
        for (int64_t c = c0; c < c1; ++c) {
          if (std::abs(o[c]) <= std::numeric_limits<float>::max()) continue;
          if (fp8 && fp8_e4m3_is_nan(row[c]))
            throw Error(w.file->path(), tensor_field(w.data),
                        "NaN code " + hex_byte(row[c]) + " at element " + element_str(w, r, c));
          overflow(w, r, c, fp8 ? lut[row[c]] : float(int4_packed_at(row, c)), s);
        }
    }
  }
}

void decode_mxfp4(const QuantWeight& w, int64_t r0, int64_t r1, float* dst) {
  const int64_t cols = w.cols(), ng = cols / 32;
  const uint8_t* blocks = w.file->raw_bytes(w.data);
  const uint8_t* scales = w.scale_file->raw_bytes(w.scale);
  for (int64_t r = r0; r < r1; ++r) {
    float* o = dst + (r - r0) * cols;
    for (int64_t g = 0; g < ng; ++g) {
      const uint8_t sc = scales[r * ng + g];
      if (e8m0_is_nan(sc))
        throw Error(w.scale_file->path(), tensor_field(w.scale),
                    "NaN scale 255 (E8M0) at element " + element_str(w, r, g));
      const float s = e8m0_to_f32(sc);
      const uint8_t* blk = blocks + (r * ng + g) * 16;
      for (int t = 0; t < 32; ++t) {
        const uint8_t nib = (t & 1) ? uint8_t(blk[t / 2] >> 4) : uint8_t(blk[t / 2] & 0x0F);  // low nibble first
        const float v = kE2m1[nib];
        o[g * 32 + t] = v * s;
        if (!std::isfinite(o[g * 32 + t])) overflow(w, r, g * 32 + t, v, s);
      }
    }
  }
}

}  // namespace

void decode_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* dst) {
  KVQ_ASSERT(0 <= row_begin && row_begin <= row_end && row_end <= w.rows());
  if (row_begin == row_end || w.cols() == 0) return;
  switch (w.format) {
    case WeightFormat::kPlain:
      w.file->read_f32(w.data, row_begin * w.cols(), row_end * w.cols(), dst);
      return;
    case WeightFormat::kFp8Block:
    case WeightFormat::kFp8Tensor:
    case WeightFormat::kFp8Channel:
      decode_scaled<true>(w, row_begin, row_end, dst);
      return;
    case WeightFormat::kInt4Packed:
      decode_scaled<false>(w, row_begin, row_end, dst);
      return;
    case WeightFormat::kMxfp4:
      decode_mxfp4(w, row_begin, row_end, dst);
      return;
  }
}

}  // namespace kvq::detail
