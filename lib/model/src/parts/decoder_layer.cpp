#include "decoder_layer.hpp"

#include "mla.hpp"
#include "moe.hpp"

namespace kvq::detail {

// Decoder layer l on one batch: x += attention(norm(x)); x += mlp(norm(x)), with the observer and
// the K/V hooks of opts.
void decoder_layer(const ModelConfig& c, const LayerWeights& L, int l, Workspace& ws, Pass& p,
                const Model::ForwardOptions& opts) {
  attention_block(c, L, l, ws, p, opts);
  mlp_block(c, L, ws, p);
}

void attention_block(const ModelConfig& c, const LayerWeights& L, int dl, Workspace& ws, Pass& p,
                     const Model::ForwardOptions& opts) {
  const int64_t B = p.B, T = p.T, N = B * T;
  const int64_t H = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t qd = H * d, kvd = Hk * d;
  const int l = c.kv_index(dl);  // the KV layer: what captures, hooks, windows and RoPE are indexed by
  at::Tensor& x = p.x;
  rms_norm(x, L.attn_norm, c.rms_norm_eps, ws.h);
  if (c.is_mla()) {
    mla_project(c, L, ws);
  } else if (c.attn_output_gate) {  // Qwen3.5: q_proj's rows per head are [query | gate]
    linear(ws, ws.qkv, ws.h, L.wqkv, L.bqkv);
    const at::Tensor qg = ws.qkv.narrow(1, 0, 2 * qd).view({N, H, 2, d});
    ws.q.view({N, H, d}).copy_(qg.select(2, 0));
    ws.attn_gate.view({N, H, d}).copy_(qg.select(2, 1));
    ws.k.copy_(ws.qkv.narrow(1, 2 * qd, kvd));
    ws.v.copy_(ws.qkv.narrow(1, 2 * qd + kvd, kvd));
  } else {
    linear(ws, ws.qkv, ws.h, L.wqkv, L.bqkv);
    ws.q.copy_(ws.qkv.narrow(1, 0, qd));
    ws.k.copy_(ws.qkv.narrow(1, qd, kvd));
    ws.v.copy_(ws.qkv.narrow(1, qd + kvd, kvd));
  }
  if (L.q_norm.defined()) {  // Qwen3: per-head RMSNorm before RoPE (in place: row-wise, read then write)
    at::Tensor qr = ws.q.view({N * H, d}), kr = ws.k.view({N * Hk, d});
    rms_norm(qr, L.q_norm, c.rms_norm_eps, qr);
    rms_norm(kr, L.k_norm, c.rms_norm_eps, kr);
  }
  if (opts.observer) {
    LayerCapture cap;
    cap.layer = l;
    cap.batch = int(B);
    cap.seq = int(T);
    cap.n_heads = int(H);
    cap.n_kv_heads = int(Hk);
    cap.head_dim = int(d);
    cap.head_dim_v = c.head_dim_v;
    cap.q = ws.q.data_ptr<float>();
    cap.k = ws.k.data_ptr<float>();
    cap.v = ws.v.data_ptr<float>();
    cap.positions = p.positions.data();
    opts.observer->on_layer(cap);
  }
  // The pre-RoPE K/V of this layer as the hooks see them (k, v: the buffers they may rewrite).
  auto layer_kv = [&](at::Tensor& k, at::Tensor& v) {
    LayerKv kv;
    kv.layer = l;
    kv.batch = int(B);
    kv.seq = int(T);
    kv.n_kv_heads = int(Hk);
    kv.head_dim = int(d);
    kv.head_dim_v = c.head_dim_v;
    kv.k = k.data_ptr<float>();
    kv.v = v.data_ptr<float>();
    kv.positions = p.positions.data();
    return kv;
  };
  if (opts.kv_transform) {
    LayerKv kv = layer_kv(ws.k, ws.v);
    opts.kv_transform->apply(kv);
  }
  if (opts.protected_kv) {
    ws.kq.copy_(ws.k);
    ws.vq.copy_(ws.v);
    LayerKv kv = layer_kv(ws.kq, ws.vq);
    opts.protected_kv->code(kv);
    rope_rows(ws.kq.data_ptr<float>(), B, int(T), Hk, int(d), p.rope_of(c, l), c.pairing, false);
  }
  rope_rows(ws.q.data_ptr<float>(), B, int(T), H, int(d), p.rope_of(c, l), c.pairing, false);
  rope_rows(ws.k.data_ptr<float>(), B, int(T), Hk, int(d), p.rope_of(c, l), c.pairing, false);
  if (opts.protected_kv)
    attention_protected(ws, B, T, c, c.window_of(l), opts.protected_kv->sink, opts.protected_kv->recent, L.sinks);
  else
    attention(ws, B, T, c, c.window_of(l), L.sinks);
  if (c.attn_output_gate) ws.attn.mul_(ws.attn_gate.sigmoid_());
  const at::Tensor& o_in = c.is_mla() ? mla_output(c, L, ws) : ws.attn;
  if (L.post_attn_norm.defined()) {  // GLM-4-0414: x += norm(o_proj(attn)); ws.h is free here
    linear(ws, ws.h, o_in, L.wo);
    if (L.bo.defined()) ws.h.add_(L.bo);
    rms_norm(ws.h, L.post_attn_norm, c.rms_norm_eps, ws.h);  // row-wise: read, then write
    x.add_(ws.h);
  } else {
    if (L.bo.defined()) x.add_(L.bo);
    linear_add(ws, x, o_in, L.wo);
  }
}

void mlp_block(const ModelConfig& c, const LayerWeights& L, Workspace& ws, Pass& p) {
  const int64_t I = c.intermediate_size;
  at::Tensor& x = p.x;
  rms_norm(x, L.ffn_norm, c.rms_norm_eps, ws.h);
  if (L.router.defined()) {
    moe_mlp(ws, L, c, x);
  } else {
    linear(ws, ws.gate_up, ws.h, L.w_gate_up);
    if (c.gelu_tanh_mlp)  // Gemma: GeGLU with the tanh GELU
      at::gelu_out(ws.act, ws.gate_up.narrow(1, 0, I), "tanh");
    else
      at::silu_out(ws.act, ws.gate_up.narrow(1, 0, I));
    ws.act.mul_(ws.gate_up.narrow(1, I, I));
    if (L.post_mlp_norm.defined()) {  // x += norm(mlp(...)); ws.h was consumed by gate_up
      linear(ws, ws.h, ws.act, L.w_down);
      rms_norm(ws.h, L.post_mlp_norm, c.rms_norm_eps, ws.h);
      x.add_(ws.h);
    } else {
      linear_add(ws, x, ws.act, L.w_down);
    }
  }
}

}  // namespace kvq::detail
