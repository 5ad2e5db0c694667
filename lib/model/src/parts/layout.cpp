#include "layout.hpp"

#include "kvq/util/error.hpp"

namespace kvq::detail {

const SafetensorsFile& TensorIndex::file_of(const std::string& name) const {
  auto it = owner.find(name);
  if (it == owner.end())
    throw Error(source, "tensor '" + name + "'",
                source.size() > 5 && source.substr(source.size() - 5) == ".json" ? "not in weight_map" : "missing");
  return *it->second;
}

GlobalNames llama_global_names() { return {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}; }

ExpertNames llama_expert_names(int l, int e) {
  const std::string x = "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + ".";
  return {x + "gate_proj.weight", x + "up_proj.weight", x + "down_proj.weight"};
}

LayerNames llama_layer_names(int l) {
  LayerNames n;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  n.attn_norm = p + "input_layernorm.weight";
  n.ffn_norm = p + "post_attention_layernorm.weight";
  n.q = p + "self_attn.q_proj";
  n.k = p + "self_attn.k_proj";
  n.v = p + "self_attn.v_proj";
  n.o = p + "self_attn.o_proj.weight";
  n.o_bias = p + "self_attn.o_proj.bias";
  n.q_norm = p + "self_attn.q_norm.weight";
  n.k_norm = p + "self_attn.k_norm.weight";
  n.gate = p + "mlp.gate_proj.weight";
  n.up = p + "mlp.up_proj.weight";
  n.down = p + "mlp.down_proj.weight";
  n.router = p + "mlp.gate.weight";
  n.expert = [l](int e) { return llama_expert_names(l, e); };
  n.shared = {p + "mlp.shared_experts.gate_proj.weight", p + "mlp.shared_experts.up_proj.weight",
              p + "mlp.shared_experts.down_proj.weight"};
  return n;
}

LayerPlan decoder_plan(const ModelConfig& c, int l, const LayerNames& n, const LayerPlan* attention) {
  const int64_t D = c.hidden_size, I = c.intermediate_size;
  const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
  LayerPlan p;
  auto one = [&](std::function<at::Tensor&(LayerWeights&)> dst, const std::string& name, std::vector<int64_t> shape) {
    p.push_back({std::move(dst), {{name, std::move(shape)}}});
  };
  one([](LayerWeights& L) -> at::Tensor& { return L.attn_norm; }, n.attn_norm, {D});
  if (attention) {
    p.insert(p.end(), attention->begin(), attention->end());
  } else {
    if (!n.qkv.empty()) {
      one([](LayerWeights& L) -> at::Tensor& { return L.wqkv; }, n.qkv, {qd + 2 * kvd, D});
      if (c.qkv_bias) one([](LayerWeights& L) -> at::Tensor& { return L.bqkv; }, n.qkv_bias, {qd + 2 * kvd});
    } else {
      p.push_back({[](LayerWeights& L) -> at::Tensor& { return L.wqkv; },
                   {{n.q + ".weight", {qd, D}}, {n.k + ".weight", {kvd, D}}, {n.v + ".weight", {kvd, D}}}});
      if (c.qkv_bias)
        p.push_back({[](LayerWeights& L) -> at::Tensor& { return L.bqkv; },
                     {{n.q + ".bias", {qd}}, {n.k + ".bias", {kvd}}, {n.v + ".bias", {kvd}}}});
    }
    one([](LayerWeights& L) -> at::Tensor& { return L.wo; }, n.o, {D, qd});
  }
  if (c.o_bias) one([](LayerWeights& L) -> at::Tensor& { return L.bo; }, n.o_bias, {D});
  if (c.qk_norm) {
    one([](LayerWeights& L) -> at::Tensor& { return L.q_norm; }, n.q_norm, {c.head_dim});
    one([](LayerWeights& L) -> at::Tensor& { return L.k_norm; }, n.k_norm, {c.head_dim});
  }
  if (c.sandwich_norm) {
    one([](LayerWeights& L) -> at::Tensor& { return L.post_attn_norm; }, n.post_attn_norm, {D});
    one([](LayerWeights& L) -> at::Tensor& { return L.post_mlp_norm; }, n.post_mlp_norm, {D});
  }
  one([](LayerWeights& L) -> at::Tensor& { return L.ffn_norm; }, n.ffn_norm, {D});
  if (c.is_moe_layer(l)) {
    const int64_t E = c.n_experts, Ie = c.moe_intermediate_size;
    one([](LayerWeights& L) -> at::Tensor& { return L.router; }, n.router, {E, D});
    if (!n.router_bias.empty()) one([](LayerWeights& L) -> at::Tensor& { return L.router_bias; }, n.router_bias, {E});
    for (int e = 0; e < E; ++e) {
      const ExpertNames en = n.expert(e);
      const size_t i = size_t(e);
      p.push_back({[i, E](LayerWeights& L) -> at::Tensor& {
                     L.expert_gate_up.resize(size_t(E));
                     return L.expert_gate_up[i];
                   },
                   {{en.gate, {Ie, D}}, {en.up, {Ie, D}}},
                   e});
      p.push_back({[i, E](LayerWeights& L) -> at::Tensor& {
                     L.expert_down.resize(size_t(E));
                     return L.expert_down[i];
                   },
                   {{en.down, {D, Ie}}},
                   e});
    }
    if (c.shared_width() > 0) {
      const int64_t Is = c.shared_width();
      p.push_back({[](LayerWeights& L) -> at::Tensor& { return L.shared_gate_up; },
                   {{n.shared.gate, {Is, D}}, {n.shared.up, {Is, D}}}});
      one([](LayerWeights& L) -> at::Tensor& { return L.shared_down; }, n.shared.down, {D, Is});
    }
  } else if (!n.gate_up.empty()) {
    one([](LayerWeights& L) -> at::Tensor& { return L.w_gate_up; }, n.gate_up, {2 * I, D});
    one([](LayerWeights& L) -> at::Tensor& { return L.w_down; }, n.down, {D, I});
  } else {
    p.push_back({[](LayerWeights& L) -> at::Tensor& { return L.w_gate_up; }, {{n.gate, {I, D}}, {n.up, {I, D}}}});
    one([](LayerWeights& L) -> at::Tensor& { return L.w_down; }, n.down, {D, I});
  }
  return p;
}

std::vector<WantTensor> plan_tensors(const LayerPlan& plan) {
  std::vector<WantTensor> w;
  for (const Slot& s : plan) w.insert(w.end(), s.parts.begin(), s.parts.end());
  return w;
}

bool slot_is_gemm_weight(const Slot& s) {
  if (s.parts.empty() || s.parts[0].shape.size() != 2) return false;
  LayerWeights probe;  // which LayerWeights tensor the slot fills, by address
  const at::Tensor* t = &s.dst(probe);
  return t != &probe.router && t != &probe.w_kv_b && t != &probe.expert_gate_up_b && t != &probe.expert_down_b &&
         t != &probe.shared_gate && t != &probe.conv_w;
}

at::ScalarType slot_dtype(const Slot& s, Precision p) {
  return p == Precision::kBf16 && slot_is_gemm_weight(s) ? at::kBFloat16 : at::kFloat;
}

int64_t plan_bytes(const LayerPlan& plan, Precision p) {
  int64_t n = 0;
  for (const Slot& s : plan) {
    const int64_t elem = at::elementSize(slot_dtype(s, p));
    for (const WantTensor& t : s.parts) {
      int64_t e = 1;
      for (int64_t d : t.shape) e *= d;
      n += e * elem;
    }
  }
  return n;
}

void check_expert_count(const ModelConfig& c, const std::string& config_path, const TensorIndex& t,
                        const std::string& key, const std::function<ExpertNames(int layer, int expert)>& names) {
  const std::string stated = key + " is " + std::to_string(c.n_experts);
  for (const auto& kv : t.owner) {
    const std::string& name = kv.first;
    const size_t at = name.find(".experts.");
    if (at == std::string::npos || name.rfind("model.layers.", 0) != 0) continue;
    const size_t b = at + 9, e = name.find('.', b);
    if (e == std::string::npos || e == b || name.find_first_not_of("0123456789", b) != e) continue;
    if (e - b > 9 || std::stoll(name.substr(b, e - b)) >= c.n_experts)
      throw Error(config_path, key, stated + " but the weights have tensor '" + name + "' (in " + kv.second->path() + ")");
  }
  for (int l = 0; l < c.decoder_layers(); ++l) {
    if (!c.is_moe_layer(l)) continue;
    for (int x = 0; x < c.n_experts; ++x) {
      const ExpertNames n = names(l, x);
      for (const std::string* tn : {&n.gate, &n.up, &n.down})
        if (!t.has(*tn))
          throw Error(config_path, key, stated + " but tensor '" + *tn + "' is missing from " + t.source);
    }
  }
}

}  // namespace kvq::detail

namespace kvq::detail {

GlobalNames llama_globals(const ModelConfig&, const TensorIndex&) { return llama_global_names(); }

LayerPlan llama_plan(const ModelConfig& c, int l, const TensorIndex&) {
  return decoder_plan(c, l, llama_layer_names(l));
}

}  // namespace kvq::detail
