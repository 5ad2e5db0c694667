#include "mla.hpp"

#include "kvq/util/error.hpp"

namespace kvq::detail {

// DeepSeek-V2 MLA, served (absorbed) form, from ws.h into ws.q [N][H][rope + R], ws.k [N][rope + R]
// and ws.v [N][R], all pre-RoPE: k = [k_pe, c~], v = c~ with c~ = RMS(c; kv_a_layernorm), and
// q_h = [q_pe_h, W_UK,h^T q_nope_h]. Then q_h . k = q_pe_h . k_pe + q_nope_h . (W_UK,h c~), the naive
// per-head score, and the rotary dims come first.
void mla_project(const ModelConfig& c, const LayerWeights& L, Workspace& ws) {
  const int64_t N = ws.h.size(0), H = c.n_heads, R = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const int64_t nope = c.qk_nope_head_dim, qk = nope + rope, d = c.head_dim;
  const int64_t qrows = c.q_lora_rank > 0 ? c.q_lora_rank : H * qk;
  linear(ws, ws.qkv, ws.h, L.wqkv);  // [q (or q_a) | c | k_pe]
  if (c.q_lora_rank > 0) {
    ws.mla_qa.copy_(ws.qkv.narrow(1, 0, qrows));
    rms_norm(ws.mla_qa, L.q_a_norm, c.rms_norm_eps, ws.mla_qa);  // row-wise: read, then write
    linear(ws, ws.mla_q, ws.mla_qa, L.wq_b);
  } else {
    ws.mla_q.copy_(ws.qkv.narrow(1, 0, qrows));
  }
  ws.v.copy_(ws.qkv.narrow(1, qrows, R));
  rms_norm(ws.v, L.kv_a_norm, c.rms_norm_eps, ws.v);
  at::Tensor k = ws.k.view({N, d});
  k.narrow(1, 0, rope).copy_(ws.qkv.narrow(1, qrows + R, rope));
  k.narrow(1, rope, R).copy_(ws.v);
  const at::Tensor q3 = ws.mla_q.view({N, H, qk});
  at::Tensor qo = ws.q.view({N, H, d});
  qo.narrow(2, 0, rope).copy_(q3.narrow(2, nope, rope));
  ws.mla_nope.copy_(q3.narrow(2, 0, nope).permute({1, 0, 2}));
  const at::Tensor w_uk = L.w_kv_b.view({H, nope + c.v_head_dim, R}).narrow(1, 0, nope);  // [H, nope, R]
  at::bmm_out(ws.mla_lat, ws.mla_nope, w_uk);
  qo.narrow(2, rope, R).copy_(ws.mla_lat.permute({1, 0, 2}));
}

// MLA's head outputs: out_h = W_UV,h (ws.attn_h), [N][H][v] in ws.mla_o (o_proj's input).
const at::Tensor& mla_output(const ModelConfig& c, const LayerWeights& L, Workspace& ws) {
  const int64_t N = ws.h.size(0), H = c.n_heads, R = c.kv_lora_rank, nope = c.qk_nope_head_dim, v = c.v_head_dim;
  ws.mla_lat.copy_(ws.attn.view({N, H, R}).permute({1, 0, 2}));
  const at::Tensor w_uv = L.w_kv_b.view({H, nope + v, R}).narrow(1, nope, v);  // [H, v, R]
  at::bmm_out(ws.mla_out, ws.mla_lat, w_uv.transpose(1, 2));
  ws.mla_o.view({N, H, v}).copy_(ws.mla_out.permute({1, 0, 2}));
  return ws.mla_o;
}

LayerPlan mla_plan(const ModelConfig& c, const std::string& p) {
  const int64_t D = c.hidden_size, H = c.n_heads, R = c.kv_lora_rank;
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const WantTensor kv_a{p + "kv_a_proj_with_mqa.weight", {R + c.qk_rope_head_dim, D}};
  LayerPlan plan;
  auto one = [&](std::function<at::Tensor&(LayerWeights&)> dst, const std::string& name, std::vector<int64_t> shape) {
    plan.push_back({std::move(dst), {{name, std::move(shape)}}});
  };
  if (c.q_lora_rank > 0) {
    plan.push_back({[](LayerWeights& L) -> at::Tensor& { return L.wqkv; },
                    {{p + "q_a_proj.weight", {c.q_lora_rank, D}}, kv_a}});
    one([](LayerWeights& L) -> at::Tensor& { return L.q_a_norm; }, p + "q_a_layernorm.weight", {c.q_lora_rank});
    one([](LayerWeights& L) -> at::Tensor& { return L.wq_b; }, p + "q_b_proj.weight", {H * qk, c.q_lora_rank});
  } else {
    plan.push_back({[](LayerWeights& L) -> at::Tensor& { return L.wqkv; }, {{p + "q_proj.weight", {H * qk, D}}, kv_a}});
  }
  one([](LayerWeights& L) -> at::Tensor& { return L.kv_a_norm; }, p + "kv_a_layernorm.weight", {R});
  one([](LayerWeights& L) -> at::Tensor& { return L.w_kv_b; }, p + "kv_b_proj.weight",
      {H * (c.qk_nope_head_dim + c.v_head_dim), R});
  one([](LayerWeights& L) -> at::Tensor& { return L.wo; }, p + "o_proj.weight", {D, H * c.v_head_dim});
  return plan;
}

void check_kv_lora_rank(const ModelConfig& c, const TensorIndex& t, const std::string& config_path) {
  const int64_t R = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    struct Want { std::string name; size_t dim; int64_t size; const char* what; };
    const Want wants[] = {
        {p + "kv_a_proj_with_mqa.weight", 0, R + rope, "rows (kv_lora_rank + qk_rope_head_dim)"},
        {p + "kv_a_layernorm.weight", 0, R, "entries (kv_lora_rank)"},
        {p + "kv_b_proj.weight", 1, R, "columns (kv_lora_rank)"}};
    for (const Want& w : wants) {
      if (!t.has(w.name)) continue;  // the shape checks name an absent tensor
      const StTensorInfo* info = t.file_of(w.name).find(w.name);
      if (!info || info->shape.size() <= w.dim || info->shape[w.dim] == w.size) continue;
      throw Error(config_path, "kv_lora_rank",
                  std::to_string(R) + " disagrees with the weights: tensor '" + w.name + "' (in " +
                      t.file_of(w.name).path() + ") has shape " + shape_str(info->shape) + ", expected " +
                      std::to_string(w.size) + " " + w.what);
    }
  }
}

}  // namespace kvq::detail
