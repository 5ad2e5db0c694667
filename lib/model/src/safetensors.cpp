#include "safetensors.hpp"

#include <algorithm>

#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "kvq/util/error.hpp"

namespace kvq::detail {
namespace {

// The safetensors spec caps the header at 100 MB; anything larger is corrupt, not a big model.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

int dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, int> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1},
      {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string tensor_field(const std::string& name) { return "tensor '" + name + "'"; }

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// IEEE binary16 -> binary32, bit-identical to c10::detail::fp16_ieee_to_fp32_value for all 65536
// inputs (checked when it replaced it): exact, subnormals normalised, NaN payload kept but quieted.
float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0);  // NaNs come out quiet
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(mant & 0x400)) { mant <<= 1; --exp; }
    bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const uint64_t size = file_.size();
  if (size < 8)
    throw Error(path, "header length",
                "file is truncated: " + std::to_string(size) + " bytes, needs at least 8");
  const uint64_t header_len = read_u64_le(file_.data());
  if (header_len > size - 8)
    throw Error(path, "header length",
                std::to_string(header_len) + " bytes runs past the end of the file (" +
                    std::to_string(size) + " bytes)");
  if (header_len > kMaxHeaderBytes)
    throw Error(path, "header length", std::to_string(header_len) + " bytes exceeds the 100 MB limit");
  const char* hp = reinterpret_cast<const char*>(file_.data() + 8);
  nlohmann::json header = nlohmann::json::parse(hp, hp + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    throw Error(path, "header", "is not a JSON object");

  data_ = file_.data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string field = tensor_field(it.key());
    const auto& t = it.value();
    if (!t.is_object()) throw Error(path, field, "entry is not an object");
    StTensorInfo info;
    if (!t.contains("dtype") || !t["dtype"].is_string()) throw Error(path, field, "missing dtype");
    info.dtype = t["dtype"].get<std::string>();
    const int esize = dtype_bytes(info.dtype);
    if (esize == 0) throw Error(path, field, "unknown dtype '" + info.dtype + "'");

    if (!t.contains("shape") || !t["shape"].is_array()) throw Error(path, field, "missing shape");
    uint64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        throw Error(path, field, "shape has an invalid dimension " + d.dump());
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim)
        throw Error(path, field, "shape " + t["shape"].dump() + " is too large");
      numel *= dim;
      info.shape.push_back(static_cast<int64_t>(dim));
    }

    const auto& off = t.contains("data_offsets") ? t["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      throw Error(path, field, "data_offsets must be two non-negative integers");
    info.begin = off[0].get<uint64_t>();
    info.end = off[1].get<uint64_t>();
    if (info.begin > info.end || info.end > data_size)
      throw Error(path, field,
                  "data_offsets [" + std::to_string(info.begin) + "," + std::to_string(info.end) +
                      "] past the end of the data (" + std::to_string(data_size) + " bytes)");
    const uint64_t want = numel * static_cast<uint64_t>(esize);
    if (info.end - info.begin != want)
      throw Error(path, field,
                  "data_offsets span " + std::to_string(info.end - info.begin) + " bytes but " +
                      info.dtype + " " + shape_str(info.shape) + " needs " + std::to_string(want));
    tensors_.emplace(it.key(), std::move(info));
  }
}

const StTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void SafetensorsFile::check(const std::string& name, const std::vector<int64_t>& shape) const {
  const StTensorInfo* t = find(name);
  if (!t) throw Error(path(), tensor_field(name), "missing");
  if (t->dtype != "F32" && t->dtype != "F16" && t->dtype != "BF16")
    throw Error(path(), tensor_field(name), "dtype " + t->dtype + " is not supported (F32, F16, BF16)");
  if (t->shape != shape)
    throw Error(path(), tensor_field(name),
                "shape " + shape_str(t->shape) + " does not match " + shape_str(shape) +
                    " expected from the config");
}

void SafetensorsFile::drop(const std::string& name) const {
  if (const StTensorInfo* t = find(name)) file_.drop(uint64_t(data_ - file_.data()) + t->begin, t->end - t->begin);
}

void SafetensorsFile::prefault(const std::string& name) const {
  if (const StTensorInfo* t = find(name)) file_.prefault(uint64_t(data_ - file_.data()) + t->begin, t->end - t->begin);
}

void SafetensorsFile::drop(const std::string& name, uint64_t begin, uint64_t len) const {
  if (const StTensorInfo* t = find(name))
    file_.drop(uint64_t(data_ - file_.data()) + t->begin + begin, std::min(len, t->end - t->begin - std::min(begin, t->end - t->begin)));
}

void SafetensorsFile::prefault(const std::string& name, uint64_t begin, uint64_t len) const {
  if (const StTensorInfo* t = find(name))
    file_.prefault(uint64_t(data_ - file_.data()) + t->begin + begin, std::min(len, t->end - t->begin - std::min(begin, t->end - t->begin)));
}

uint64_t SafetensorsFile::stored_bytes(const std::string& name) const {
  const StTensorInfo* t = find(name);
  return t ? t->end - t->begin : 0;
}

const uint8_t* SafetensorsFile::raw_bytes(const std::string& name) const {
  const StTensorInfo* t = find(name);
  KVQ_ASSERT(t != nullptr);
  return data_ + t->begin;
}

void SafetensorsFile::read_f32(const std::string& name, int64_t begin, int64_t end, float* dst) const {
  const StTensorInfo* t = find(name);
  KVQ_ASSERT(t != nullptr && (t->dtype == "F32" || t->dtype == "F16" || t->dtype == "BF16"));
  const uint64_t esize = t->dtype == "F32" ? 4 : 2;
  KVQ_ASSERT(0 <= begin && begin <= end && uint64_t(end) * esize <= t->end - t->begin);
  const uint8_t* src = data_ + t->begin + uint64_t(begin) * esize;
  const int64_t n = end - begin;
  if (esize == 4) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);  // memcpy: the data need not be aligned
    return;
  }
  const bool bf16 = t->dtype == "BF16";
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = bf16 ? bf16_to_f32(h) : fp16_to_f32(h);
  }
}

}  // namespace kvq::detail
