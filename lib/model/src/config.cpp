#include "kvq/model/config.hpp"

#include <algorithm>
#include <cmath>

#include "kvq/util/error.hpp"

namespace kvq {

const char* to_string(RopeType t) {
  switch (t) {
    case RopeType::kDefault: return "default";
    case RopeType::kLinear: return "linear";
    case RopeType::kDynamic: return "dynamic";
    case RopeType::kLlama3: return "llama3";
    case RopeType::kYarn: return "yarn";
  }
  return "unknown";
}

RopeType rope_type_from_string(const std::string& s) {
  for (RopeType t : {RopeType::kDefault, RopeType::kLinear, RopeType::kDynamic, RopeType::kLlama3, RopeType::kYarn})
    if (s == to_string(t)) return t;
  throw Error("", "rope_type", "unknown value '" + s + "' (expected default, linear, dynamic, llama3 or yarn)");
}

double ModelConfig::attn_scale() const {
  return softmax_scale > 0.0 ? softmax_scale : 1.0 / std::sqrt(double(head_dim));
}

int ModelConfig::kv_index(int d) const {
  if (attn_layer_index.empty()) return d;
  const auto it = std::find(attn_layer_index.begin(), attn_layer_index.end(), d);
  return it == attn_layer_index.end() ? -1 : int(it - attn_layer_index.begin());
}

std::vector<double> rope_default_inv_freq(double theta, int rotary_dim) {
  std::vector<double> inv(size_t(std::max(0, rotary_dim / 2)));
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = rope_block_default_inv_freq(theta, int(i), rotary_dim);
  return inv;
}

namespace {

// YaRN's magnitude correction 0.1 m ln s + 1 (1 at s <= 1).
double yarn_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

}  // namespace

RopeParams rope_params(const ModelConfig& cfg, int64_t seq_len) {
  const RopeScaling& r = cfg.rope_scaling;
  const int d = cfg.rotary_dim;
  RopeParams p;
  switch (r.type) {
    case RopeType::kDefault:
      p.inv_freq = rope_default_inv_freq(cfg.rope_theta, d);
      break;
    case RopeType::kLinear:
      p.inv_freq = rope_default_inv_freq(cfg.rope_theta, d);
      for (double& f : p.inv_freq) f /= r.factor;
      break;
    case RopeType::kDynamic: {
      // NTK: past the trained length the base grows with the length actually run (HF recomputes
      // it from the forward's largest position).
      const double M = cfg.max_seq_len, L = seq_len > 0 ? double(seq_len) : M;
      double base = cfg.rope_theta;
      if (L > M) base *= std::pow(r.factor * L / M - (r.factor - 1.0), double(d) / double(d - 2));
      p.inv_freq = rope_default_inv_freq(base, d);
      break;
    }
    case RopeType::kLlama3: {
      const double kPi = 3.14159265358979323846;
      const double orig = r.original_max_position_embeddings;
      const double lo_wavelen = orig / r.low_freq_factor, hi_wavelen = orig / r.high_freq_factor;
      p.inv_freq = rope_default_inv_freq(cfg.rope_theta, d);
      for (double& f : p.inv_freq) {
        const double wavelen = 2.0 * kPi / f;
        if (wavelen < hi_wavelen) continue;  // high frequencies: unchanged
        if (wavelen > lo_wavelen) {
          f /= r.factor;  // low frequencies: interpolated
        } else {          // between: a smooth blend
          const double s = (orig / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          f = (1.0 - s) * f / r.factor + s * f;
        }
      }
      break;
    }
    case RopeType::kYarn: {
      const double kPi = 3.14159265358979323846;
      const double f = r.factor, base = cfg.rope_theta;
      const double orig = r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings : cfg.max_seq_len;
      if (r.attention_factor > 0)
        p.attention_factor = r.attention_factor;
      else if (r.mscale > 0 && r.mscale_all_dim > 0)
        p.attention_factor = yarn_mscale(f, r.mscale) / yarn_mscale(f, r.mscale_all_dim);
      else
        p.attention_factor = yarn_mscale(f, 1.0);
      // The block index at which a wavelength completes `rotations` turns over the trained length.
      auto correction = [&](double rotations) { return d * std::log(orig / (2.0 * kPi * rotations)) / (2.0 * std::log(base)); };
      double low = correction(r.beta_fast), high = correction(r.beta_slow);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, double(d - 1));
      if (low == high) high += 0.001;  // no zero-width ramp
      p.inv_freq = rope_default_inv_freq(base, d);
      for (size_t j = 0; j < p.inv_freq.size(); ++j) {
        const double ramp = std::clamp((double(j) - low) / (high - low), 0.0, 1.0);
        p.inv_freq[j] = ramp * p.inv_freq[j] / f + (1.0 - ramp) * p.inv_freq[j];
      }
      break;
    }
  }
  return p;
}

RopeParams local_rope_params(const ModelConfig& cfg) {
  RopeParams p;
  p.inv_freq = rope_default_inv_freq(cfg.rope_local_theta, cfg.rotary_dim);
  return p;
}

RopeParams rope_params(const ModelConfig& cfg, int64_t seq_len, int layer) {
  if (layer < 0 || !cfg.local_rope(layer)) return rope_params(cfg, seq_len);
  return local_rope_params(cfg);
}

}  // namespace kvq
