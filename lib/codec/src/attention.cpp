#include "kvq/codec/attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "kvq/util/error.hpp"

namespace kvq::codec {

void reference_apply_rope(float* x, int head_dim, int64_t pos, const RopeSpec& rope) {
  const int dr = rope.rotary_dim > 0 ? rope.rotary_dim : head_dim;
  const int nb = dr / 2;
  KVQ_ASSERT(rope.inv_freq.empty() || rope.inv_freq.size() == static_cast<size_t>(nb));
  const double af = rope.attention_factor;
  for (int i = 0; i < nb; ++i) {
    const double inv_freq =
        rope.inv_freq.empty() ? rope_block_default_inv_freq(rope.theta, i, dr) : rope.inv_freq[static_cast<size_t>(i)];
    const double ang = static_cast<double>(pos) * inv_freq;
    const double c = af * std::cos(ang), s = af * std::sin(ang);
    int a, b;
    rope_block_coords(rope.pairing, head_dim, dr, i, &a, &b);
    double ya, yb;
    rope_rotate_pair<double>(x[a], x[b], c, s, &ya, &yb);
    x[a] = static_cast<float>(ya);
    x[b] = static_cast<float>(yb);
  }
}

void validate(const AttentionProblem& p) {
  auto bad = [](const std::string& field, const std::string& what) {
    throw Error("", "attention: " + field, what);
  };
  if (p.n_kv_heads < 1) bad("n_kv_heads", "must be >= 1");
  if (p.n_q_heads < p.n_kv_heads || p.n_q_heads % p.n_kv_heads != 0)
    bad("n_q_heads", std::to_string(p.n_q_heads) + " is not a multiple of n_kv_heads " +
                         std::to_string(p.n_kv_heads));
  if (p.n_tokens < 1) bad("n_tokens", "must be >= 1");
  if (p.window < 0) bad("window", "must be >= 0 (0 = full), got " + std::to_string(p.window));
  if (!p.q) bad("q", "is null");
  const size_t h = static_cast<size_t>(p.n_kv_heads);
  if (p.k_codecs.size() != h || p.v_codecs.size() != h || p.k_packed.size() != h ||
      p.v_packed.size() != h)
    bad("k/v codecs and buffers", "need one per KV head");
  for (size_t i = 0; i < h; ++i) {
    if (!p.k_codecs[i] || !p.v_codecs[i] || !p.k_packed[i] || !p.v_packed[i])
      bad("kv head " + std::to_string(i), "null codec or buffer");
    if (p.k_codecs[i]->head_dim() != p.head_dim || p.v_codecs[i]->head_dim() != p.head_dim)
      bad("kv head " + std::to_string(i), "codec head_dim differs from head_dim " +
                                              std::to_string(p.head_dim));
    if (p.rope.enabled && !p.k_codecs[i]->decision().post_rope && !p.positions)
      bad("positions", "needed to apply RoPE to pre-RoPE keys");
  }
  if (p.rope.enabled) {
    const int dr = p.rope.rotary_dim > 0 ? p.rope.rotary_dim : p.head_dim;
    if (dr % 2 != 0 || dr > p.head_dim)
      bad("rope.rotary_dim", "must be even and <= head_dim, got " + std::to_string(dr));
  }
}

void reference_decode_attention(const AttentionProblem& p, float* out) {
  validate(p);
  const int d = p.head_dim, T = p.n_tokens, t0 = first_attended(p);
  const int group = p.n_q_heads / p.n_kv_heads;
  const double scale = p.softmax_scale > 0.f ? p.softmax_scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> k(static_cast<size_t>(T) * d), v(static_cast<size_t>(T) * d);
  std::vector<double> s(static_cast<size_t>(T));
  for (int kv = 0; kv < p.n_kv_heads; ++kv) {
    const HeadCodec& kc = *p.k_codecs[static_cast<size_t>(kv)];
    kc.decode(p.k_packed[static_cast<size_t>(kv)], T, k.data());
    p.v_codecs[static_cast<size_t>(kv)]->decode(p.v_packed[static_cast<size_t>(kv)], T, v.data());
    if (p.rope.enabled && !kc.decision().post_rope)
      for (int t = 0; t < T; ++t) reference_apply_rope(k.data() + static_cast<size_t>(t) * d, d, p.positions[t], p.rope);
    for (int g = 0; g < group; ++g) {
      const int qh = kv * group + g;
      const float* q = p.q + static_cast<size_t>(qh) * d;
      double mx = -INFINITY;
      for (int t = t0; t < T; ++t) {
        double acc = 0.0;
        for (int i = 0; i < d; ++i) acc += static_cast<double>(q[i]) * k[static_cast<size_t>(t) * d + i];
        s[static_cast<size_t>(t)] = acc * scale;
        mx = std::max(mx, s[static_cast<size_t>(t)]);
      }
      double l = 0.0;
      for (int t = t0; t < T; ++t) {
        double& e = s[static_cast<size_t>(t)];
        e = std::exp(e - mx);
        l += e;
      }
      float* o = out + static_cast<size_t>(qh) * d;
      for (int i = 0; i < d; ++i) {
        double acc = 0.0;
        for (int t = t0; t < T; ++t) acc += s[static_cast<size_t>(t)] * v[static_cast<size_t>(t) * d + i];
        o[i] = static_cast<float>(acc / l);
      }
    }
  }
}

}  // namespace kvq::codec
