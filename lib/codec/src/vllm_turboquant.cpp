// vLLM's TurboQuant KV cache on the CPU (kvq/codec/vllm_turboquant.hpp has the coding, exactly).
// Compiled without fused multiply-adds (CMakeLists.txt): the codebook's double arithmetic must
// round as vLLM's Python floats do, one operation at a time.
#include "kvq/codec/vllm_turboquant.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kvq/codec/minifloat.hpp"
#include "kvq/format/coding_kinds.hpp"
#include "kvq/format/packed_layout.hpp"

namespace kvq::vllm_tq {

namespace {

// The presets of vllm/model_executor/layers/quantization/turboquant/config.py (TQ_PRESETS).
const PresetInfo kPresets[kNumPresets] = {
    {Preset::kK8V4, "turboquant_k8v4", 8, 4, false},
    {Preset::k4BitNc, "turboquant_4bit_nc", 4, 4, true},
    {Preset::kK3V4Nc, "turboquant_k3v4_nc", 3, 4, true},
    {Preset::k3BitNc, "turboquant_3bit_nc", 3, 3, true},
};

int ceil_bytes(int n, int bits) { return (n * bits + 7) / 8; }

// vLLM's packing — 4-bit: element 2j in the low nibble of byte j; 3-bit: 8 elements per 24-bit
// little-endian word, element i at bits 3i — is kvq's LSB-first code stream (packed_layout.hpp).
// The output must be zeroed: the stream ORs its codes in (encode zeroes the slot).
void pack(const uint8_t* codes, int n, int bits, uint8_t* out) {
  layout::pack_codes(codes, uint32_t(n), uint32_t(bits), out, 0);
}

void unpack_codes(const uint8_t* in, int n, int bits, uint8_t* codes) {
  layout::unpack_codes(in, 0, uint32_t(bits), uint32_t(n), codes);
}

}  // namespace

const PresetInfo& info(Preset p) { return kPresets[int(p)]; }

std::optional<Preset> parse_preset(std::string_view name) {
  for (const auto& p : kPresets)
    if (name == p.name) return p.preset;
  return std::nullopt;
}

std::string preset_names() {
  std::string s;
  for (const auto& p : kPresets) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

// The rule lives with the coding kind's layout checks (kvq/format/coding_kinds.hpp).
std::string unsupported_head_dim(int D) { return kinds::vllm_tq_unsupported_head_dim(D); }

SlotLayout slot_layout(Preset p, int D) {
  if (const std::string why = unsupported_head_dim(D); !why.empty()) throw std::invalid_argument(why);
  const PresetInfo& in = info(p);
  SlotLayout L;
  L.head_dim = D;
  L.key_code_bytes = in.key_bits == 8 ? D : ceil_bytes(D, in.key_bits);
  L.key_bytes = L.key_code_bytes + (in.key_bits == 8 ? 0 : 2);
  L.value_code_bytes = ceil_bytes(D, in.value_bits);
  L.value_bytes = L.value_code_bytes + 4;
  const int s = L.key_bytes + L.value_bytes;
  L.slot_bytes = s + (s % 2);
  return L;
}

Codebook lloyd_max(int d, int bits) {
  if (d <= 0 || bits < 1 || bits > 8) throw std::invalid_argument("lloyd_max: bad head dim or bits");
  // Every expression below is vLLM's (centroids.py), evaluated in the same order in double.
  const int n_levels = 1 << bits;
  const double sigma2 = 1.0 / double(d);
  const double sigma = std::sqrt(sigma2);
  const double norm = 1.0 / std::sqrt(2 * M_PI * sigma2);
  const double two_s2 = 2 * sigma2;
  auto pdf = [&](double x) { return norm * std::exp(-x * x / two_s2); };
  auto trapz = [](auto f, double a, double b) {
    constexpr int n = 200;
    const double h = (b - a) / n;
    double result = 0.5 * (f(a) + f(b));
    for (int i = 1; i < n; ++i) result += f(a + double(i) * h);
    return result * h;
  };
  const double lo = -3.5 * sigma, hi = 3.5 * sigma;
  std::vector<double> c(static_cast<size_t>(n_levels));
  std::vector<double> next(c.size()), edges(c.size() + 1);
  for (int i = 0; i < n_levels; ++i) c[size_t(i)] = lo + (hi - lo) * (double(i) + 0.5) / double(n_levels);
  Codebook cb;
  for (int iter = 0; iter < 200; ++iter) {
    edges.front() = lo * 3;
    edges.back() = hi * 3;
    for (int i = 0; i + 1 < n_levels; ++i) edges[size_t(i) + 1] = (c[size_t(i)] + c[size_t(i) + 1]) / 2.0;
    double move = 0.0;
    for (int i = 0; i < n_levels; ++i) {
      const double a = edges[size_t(i)], b = edges[size_t(i) + 1];
      const double num = trapz([&](double x) { return x * pdf(x); }, a, b);
      const double den = trapz(pdf, a, b);
      next[size_t(i)] = den > 1e-15 ? num / den : c[size_t(i)];
      move = std::max(move, std::fabs(next[size_t(i)] - c[size_t(i)]));
    }
    if (move < 1e-10) break;  // the iterate before this last move is the one returned
    c.swap(next);
    ++cb.iterations;
  }
  for (double x : c) cb.centroids.push_back(float(x));
  for (size_t i = 0; i + 1 < cb.centroids.size(); ++i)
    cb.midpoints.push_back((cb.centroids[i] + cb.centroids[i + 1]) / 2.0f);
  return cb;
}

std::vector<float> hadamard(int D) {
  if (D <= 0 || (D & (D - 1)) != 0) throw std::invalid_argument("hadamard: head dim must be a power of two");
  // H / sqrt(D) in fp32, as torch divides a float tensor by a Python float (the scalar taken as float).
  const float inv = 1.0f / float(std::sqrt(double(D)));
  std::vector<float> h(size_t(D) * size_t(D));
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) h[size_t(i) * size_t(D) + size_t(j)] = (__builtin_popcount(unsigned(i & j)) & 1) ? -inv : inv;
  return h;
}

Codec::Codec(Preset p, int D) : info_(&info(p)), layout_(slot_layout(p, D)) {
  if (info_->key_bits != 8) {
    codebook_ = lloyd_max(D, info_->key_bits);
    h_ = hadamard(D);
  }
}

void encode_key(const Codebook& cb, const std::vector<float>& h, int D, const float* k, uint8_t* codes,
                uint16_t* norm_f16) {
  double ss = 0.0;
  for (int j = 0; j < D; ++j) ss += double(k[j]) * double(k[j]);
  const float n = float(std::sqrt(ss));
  const float denom = n + 1e-8f;
  float x[256];
  for (int j = 0; j < D; ++j) x[j] = k[j] / denom;
  const std::vector<float>& mid = cb.midpoints;
  for (int j = 0; j < D; ++j) {
    double acc = 0.0;  // y_j = sum_i x_i H[i][j], summed in double and rounded once
    for (int i = 0; i < D; ++i) acc += double(x[i]) * double(h[size_t(i) * size_t(D) + size_t(j)]);
    const float y = float(acc);
    codes[j] = uint8_t(std::upper_bound(mid.begin(), mid.end(), y) - mid.begin());  // midpoints <= y
  }
  *norm_f16 = layout::f32_to_f16(n);
}

void decode_key(const Codebook& cb, const std::vector<float>& h, int D, bool norm_correction, const uint8_t* codes,
                uint16_t norm_f16, float* k) {
  float c[256];
  double ss = 0.0;
  for (int j = 0; j < D; ++j) {
    c[j] = cb.centroids[codes[j]];
    ss += double(c[j]) * double(c[j]);
  }
  if (norm_correction) {
    const float cn = std::sqrt(float(ss) + 1e-16f);
    for (int j = 0; j < D; ++j) c[j] = c[j] / cn;
  }
  const float n = layout::f16_to_f32(norm_f16);
  for (int j = 0; j < D; ++j) {
    double acc = 0.0;  // (c . H)_j, H symmetric: the inverse rotation
    for (int i = 0; i < D; ++i) acc += double(c[i]) * double(h[size_t(i) * size_t(D) + size_t(j)]);
    k[j] = n * float(acc);
  }
}

// The engine's value quantizer (triton_turboquant_store.py, _store_quantized_value), in fp32.
void encode_value(const float* v, int D, int bits, uint8_t* codes, uint16_t* scale_f16, uint16_t* zero_f16) {
  float mn = v[0], mx = v[0];
  for (int j = 1; j < D; ++j) {
    mn = std::min(mn, v[j]);
    mx = std::max(mx, v[j]);
  }
  const float top = float((1 << bits) - 1);
  float s = (mx - mn) / top;
  s = s > 1e-8f ? s : 1e-8f;
  for (int j = 0; j < D; ++j) {
    const float t = (v[j] - mn) / s + 0.5f;
    // trunc toward zero, clamped to the code range (a NaN converts to 0 on the GPU)
    codes[j] = std::isnan(t) ? 0 : t >= top ? uint8_t(top) : t <= 0.0f ? 0 : uint8_t(int(t));
  }
  *scale_f16 = layout::f32_to_f16(s);
  *zero_f16 = layout::f32_to_f16(mn);
}

void decode_value(const uint8_t* codes, int D, uint16_t scale_f16, uint16_t zero_f16, float* v) {
  const float s = layout::f16_to_f32(scale_f16), z = layout::f16_to_f32(zero_f16);
  for (int j = 0; j < D; ++j) v[j] = float(codes[j]) * s + z;
}

void Codec::encode(const float* k, const float* v, uint8_t* slot) const {
  const int D = layout_.head_dim;
  std::fill(slot, slot + layout_.slot_bytes, uint8_t(0));
  uint8_t codes[256] = {};
  uint16_t a = 0, b = 0;
  if (info_->key_bits == 8) {
    for (int j = 0; j < D; ++j) slot[j] = codec::e4m3_encode(double(k[j]), codec::E4M3Overflow::kSaturate);
  } else {
    encode_key(codebook_, h_, D, k, codes, &a);
    pack(codes, D, info_->key_bits, slot);
    layout::store_u16le(slot + layout_.key_code_bytes, a);
  }
  uint8_t* val = slot + layout_.key_bytes;
  encode_value(v, D, info_->value_bits, codes, &a, &b);
  pack(codes, D, info_->value_bits, val);
  layout::store_u16le(val + layout_.value_code_bytes, a);
  layout::store_u16le(val + layout_.value_code_bytes + 2, b);
}

void Codec::decode(const uint8_t* slot, float* k, float* v) const {
  const int D = layout_.head_dim;
  uint8_t codes[256] = {};
  if (info_->key_bits == 8) {
    for (int j = 0; j < D; ++j) k[j] = codec::e4m3_decode(slot[j]);
  } else {
    unpack_codes(slot, D, info_->key_bits, codes);
    decode_key(codebook_, h_, D, info_->norm_correction, codes, layout::load_u16le(slot + layout_.key_code_bytes), k);
  }
  const uint8_t* val = slot + layout_.key_bytes;
  unpack_codes(val, D, info_->value_bits, codes);
  decode_value(codes, D, layout::load_u16le(val + layout_.value_code_bytes),
               layout::load_u16le(val + layout_.value_code_bytes + 2), v);
}

void Codec::unpack(const uint8_t* slot, uint8_t* key_codes, uint8_t* value_codes) const {
  const int D = layout_.head_dim;
  if (info_->key_bits == 8) std::copy(slot, slot + D, key_codes);
  else unpack_codes(slot, D, info_->key_bits, key_codes);
  unpack_codes(slot + layout_.key_bytes, D, info_->value_bits, value_codes);
}

}  // namespace kvq::vllm_tq
