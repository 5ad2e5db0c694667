#include "gated_delta.hpp"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace kvq::detail {

namespace {

// torch.nn.functional.softplus (beta 1, threshold 20: x itself above it).
float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

float silu(float x) { return x / (1.f + std::exp(-x)); }

}  // namespace

void gated_delta_block(const ModelConfig& c, const LayerWeights& L, Workspace& ws, Pass& p) {
  const int64_t B = p.B, T = p.T, N = B * T;
  const int64_t Hk = c.linear_key_heads, Hv = c.linear_value_heads, dk = c.linear_key_dim, dv = c.linear_value_dim;
  const int64_t Kd = Hk * dk, Vd = Hv * dv, CD = 2 * Kd + Vd, K = c.linear_conv_kernel;
  const int64_t P = CD + Vd + 2 * Hv;  // [m | z | b | a]
  const int64_t rep = Hv / Hk;
  linear(ws, ws.gdn_proj, ws.h, L.wqkv);
  const float* proj = ws.gdn_proj.data_ptr<float>();
  float* conv = ws.gdn_conv.data_ptr<float>();
  const float* w = L.conv_w.data_ptr<float>();  // [CD][1][K]

  // 2.-3. The causal conv and SiLU, then the unit-norm q and k (q also scaled), token by token.
  const float q_scale = float(1.0 / std::sqrt(double(dk)));
  at::parallel_for(0, N, std::max<int64_t>(1, 4096 / CD), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r % T;
      float* out = conv + r * CD;
      for (int64_t ch = 0; ch < CD; ++ch) {
        float s = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t src = t - (K - 1) + j;
          if (src >= 0) s += w[ch * K + j] * proj[(r - t + src) * P + ch];
        }
        out[ch] = silu(s);
      }
      for (int64_t h = 0; h < 2 * Hk; ++h) {
        float* v = out + h * dk;
        double ss = 0;
        for (int64_t i = 0; i < dk; ++i) ss += double(v[i]) * v[i];
        const float inv = float(1.0 / std::sqrt(ss + 1e-6)) * (h < Hk ? q_scale : 1.f);
        for (int64_t i = 0; i < dk; ++i) v[i] *= inv;
      }
    }
  });

  // 4.-6. The recurrence per (window, value head), then the gated norm of its outputs.
  const float* a_log = L.a_log.data_ptr<float>();
  const float* dt_bias = L.dt_bias.data_ptr<float>();
  const float* nw = L.gdn_norm.data_ptr<float>();
  float* o_all = ws.gdn_out.data_ptr<float>();
  const float eps = float(c.rms_norm_eps);
  at::parallel_for(0, B * Hv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> S(static_cast<size_t>(dk * dv)), delta(static_cast<size_t>(dv));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / Hv, hv = bh % Hv, hk = hv / rep;
      const float A = std::exp(a_log[hv]);
      std::fill(S.begin(), S.end(), 0.f);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t r = b * T + t;
        const float* m = conv + r * CD;
        const float* q = m + hk * dk;
        const float* k = m + Kd + hk * dk;
        const float* v = m + 2 * Kd + hv * dv;
        const float* pr = proj + r * P;
        const float beta = 1.f / (1.f + std::exp(-pr[CD + Vd + hv]));
        const float decay = std::exp(-A * softplus(pr[CD + Vd + Hv + hv] + dt_bias[hv]));
        // S ← S·exp(g); kv_mem = Sᵀ k
        for (int64_t j = 0; j < dv; ++j) delta[size_t(j)] = 0;
        for (int64_t i = 0; i < dk; ++i) {
          float* Si = S.data() + i * dv;
          const float ki = k[i];
          for (int64_t j = 0; j < dv; ++j) {
            Si[j] *= decay;
            delta[size_t(j)] += Si[j] * ki;
          }
        }
        for (int64_t j = 0; j < dv; ++j) delta[size_t(j)] = (v[j] - delta[size_t(j)]) * beta;
        // S ← S + k δᵀ; o = Sᵀ q
        float* o = o_all + r * Vd + hv * dv;
        for (int64_t j = 0; j < dv; ++j) o[j] = 0;
        for (int64_t i = 0; i < dk; ++i) {
          float* Si = S.data() + i * dv;
          const float ki = k[i], qi = q[i];
          for (int64_t j = 0; j < dv; ++j) {
            Si[j] += ki * delta[size_t(j)];
            o[j] += Si[j] * qi;
          }
        }
        // o ← o / rms(o) · w · silu(z)
        double ss = 0;
        for (int64_t j = 0; j < dv; ++j) ss += double(o[j]) * o[j];
        const float inv = float(1.0 / std::sqrt(ss / double(dv) + eps));
        const float* z = pr + CD + hv * dv;
        for (int64_t j = 0; j < dv; ++j) o[j] = (o[j] * inv) * nw[j] * silu(z[j]);
      }
    }
  });
  linear_add(ws, p.x, ws.gdn_out, L.wo);
}

void hybrid_layer(const ModelConfig& c, const LayerWeights& L, int l, Workspace& ws, Pass& p,
                  const Model::ForwardOptions& opts) {
  if (c.kv_index(l) >= 0) {
    attention_block(c, L, l, ws, p, opts);
  } else {
    rms_norm(p.x, L.attn_norm, c.rms_norm_eps, ws.h);
    gated_delta_block(c, L, ws, p);
  }
  mlp_block(c, L, ws, p);
}

}  // namespace kvq::detail
