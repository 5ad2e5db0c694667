// Qwen3.5 / Qwen3.6 (transformers' modeling_qwen3_5.py, modular_qwen3_5_moe.py): the config under
// text_config, the language model's tensors under model.language_model. (vision tower and MTP
// layer never read). `layer_types` (default: every full_attention_interval-th layer, 4) says which
// decoder layers are full attention — the only ones with a KV cache, so kvq's layers are those
// (ModelConfig::attn_layer_index) — and which run Gated DeltaNet (parts/gated_delta.hpp). The
// attention: q_proj's rows per head [query | gate], per-head q/k RMSNorm (1 + w) before RoPE, partial
// RoPE (partial_rotary_factor 0.25: the first 64 of 256 dims, split-half inside them; MRoPE reduces
// to it for text), the output × sigmoid(gate) before o_proj, no biases. Every norm but the DeltaNet's
// gated one is (1 + w). Dense SwiGLU, or (qwen3_5_moe) on every layer a softmax router over all
// experts, top-k always renormalised, experts fused per layer ([E, 2I, D] gate rows then up rows,
// [E, D, I]) or one tensor each, and a shared expert scaled by sigmoid(shared_expert_gate · x).
#include "qwen3_5.hpp"

#include "parts/gated_delta.hpp"

namespace kvq::detail {
namespace {

enum class Kind { kDense, kMoe, kNext };

void parse_text(const json& text, const std::string& path, const std::string& prefix, Kind kind, ModelConfig* c) {
  const bool moe = kind != Kind::kDense;
  json tj = text;
  // The MoE config has no dense width (every layer is sparse): the common reader's key is filled in.
  if (moe && !tj.contains("intermediate_size") && tj.contains("moe_intermediate_size"))
    tj["intermediate_size"] = tj["moe_intermediate_size"];
  const ConfigReader r(tj, path, prefix);
  read_decoder_config(r, RopePairing::kSplitHalf, 0.25, c);
  if (r.boolean("attention_bias", false)) throw Error(path, prefix + "attention_bias", "true is not supported (Qwen3.5 has no attention bias)");
  c->qk_norm = true;
  c->attn_output_gate = r.boolean("attn_output_gate", true);

  // Which decoder layers attend (and keep a KV cache) and which run Gated DeltaNet.
  const int n = c->n_layers;
  const int interval = r.positive_int("full_attention_interval", 4);
  std::vector<int> attn;
  if (r.has("layer_types")) {
    const json& lt = r.raw("layer_types");
    if (!lt.is_array() || lt.size() != size_t(n))
      throw Error(path, prefix + "layer_types", "expected a list of " + std::to_string(n) + " layer types (num_hidden_layers), found " + lt.dump());
    for (size_t l = 0; l < lt.size(); ++l) {
      const std::string t = lt[l].is_string() ? lt[l].get<std::string>() : "";
      if (t != "linear_attention" && t != "full_attention")
        throw Error(path, prefix + "layer_types[" + std::to_string(l) + "]",
                    "expected \"linear_attention\" or \"full_attention\", found " + lt[l].dump());
      if (t == "full_attention") attn.push_back(int(l));
    }
  } else {
    for (int l = 0; l < n; ++l)
      if ((l + 1) % interval == 0) attn.push_back(l);
  }
  if (attn.empty())
    throw Error(path, prefix + (r.has("layer_types") ? "layer_types" : "full_attention_interval"),
                "no full_attention layer among the " + std::to_string(n) + ": the model keeps no KV cache for kvq to allocate");
  c->n_decoder_layers = n;
  c->n_layers = int(attn.size());
  c->attn_layer_index = attn;

  c->linear_key_heads = r.positive_int("linear_num_key_heads", 16);
  c->linear_value_heads = r.positive_int("linear_num_value_heads", 32);
  c->linear_key_dim = r.positive_int("linear_key_head_dim", 128);
  c->linear_value_dim = r.positive_int("linear_value_head_dim", 128);
  c->linear_conv_kernel = r.positive_int("linear_conv_kernel_dim", 4);
  if (c->linear_value_heads % c->linear_key_heads != 0)
    throw Error(path, prefix + "linear_num_value_heads", std::to_string(c->linear_value_heads) +
                                                             " is not a multiple of linear_num_key_heads " +
                                                             std::to_string(c->linear_key_heads));
  if (moe) {
    c->n_experts = r.positive_int("num_experts", 256);
    c->n_experts_per_tok = r.positive_int("num_experts_per_tok", 8);
    if (c->n_experts_per_tok > c->n_experts)
      throw Error(path, prefix + "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above num_experts " +
                                                            std::to_string(c->n_experts));
    c->moe_intermediate_size = r.positive_int("moe_intermediate_size", 512);
    c->shared_expert_intermediate_size = r.positive_int("shared_expert_intermediate_size", 512);
    c->layer_moe.assign(size_t(n), 1);
    c->norm_topk_prob = true;  // Qwen3.5-MoE always renormalises (the key is gone)
    if (kind == Kind::kNext) {  // Qwen3-Next: Qwen2-MoE's rules — sparse step, dense layers, the key
      c->norm_topk_prob = r.boolean("norm_topk_prob", true);
      const int step = r.positive_int("decoder_sparse_step", 1);
      for (int l = 0; l < n; ++l)
        if ((l + 1) % step != 0) c->layer_moe[size_t(l)] = 0;
      for (int l : r.layer_list("mlp_only_layers", n)) c->layer_moe[size_t(l)] = 0;
    }
  }
}

void parse_config(const ConfigReader& r, Kind kind, ModelConfig* c) {
  if (r.has("text_config")) {
    if (!r.raw("text_config").is_object()) throw Error(r.path(), "text_config", "expected an object");
    json text = r.raw("text_config");
    // The multimodal config keeps tie_word_embeddings at its top level (Qwen3.5-0.8B ties): the text
    // config's own key wins where it is written.
    if (!text.contains("tie_word_embeddings") && r.has("tie_word_embeddings"))
      text["tie_word_embeddings"] = r.boolean("tie_word_embeddings", false);
    parse_text(text, r.path(), "text_config.", kind, c);
  } else {
    parse_text(r.json_object(), r.path(), "", kind, c);
  }
}

void parse_dense(const ConfigReader& r, ModelConfig* c) { parse_config(r, Kind::kDense, c); }
void parse_moe(const ConfigReader& r, ModelConfig* c) { parse_config(r, Kind::kMoe, c); }
void parse_next(const ConfigReader& r, ModelConfig* c) { parse_text(r.json_object(), r.path(), "", Kind::kNext, c); }

// model.language_model. (the hub's multimodal checkpoints) or model. (a text-only export).
std::string prefix_of(const TensorIndex& t) {
  for (const char* p : {"model.language_model.", "model."})
    if (t.has(std::string(p) + "embed_tokens.weight")) return p;
  return "model.language_model.";
}

GlobalNames globals(const ModelConfig&, const TensorIndex& t) {
  const std::string p = prefix_of(t);
  GlobalNames g{p + "embed_tokens.weight", p + "norm.weight", "lm_head.weight"};
  g.final_norm_offset = 1.0f;
  return g;
}

using Dst = std::function<at::Tensor&(LayerWeights&)>;

bool grouped(const ModelConfig& c) { return c.architecture == "qwen3_next"; }

// Qwen3-Next's in_proj_qkvz [Hk (2 dk + 2 r dv), D] holds per key head h [q_h | k_h | v_h (its r value
// heads) | z_h], and in_proj_ba [2 Hv, D] per key head [b_h (r) | a_h (r)]
// (fix_query_key_value_ordering). Read as row ranges into Qwen3.5's order: every q, every k, every v
// (the conv's channels), every z, every b, every a.
std::vector<WantTensor> grouped_projection(const ModelConfig& c, const std::string& a) {
  const int64_t D = c.hidden_size, Hk = c.linear_key_heads, dk = c.linear_key_dim, dv = c.linear_value_dim;
  const int64_t r = c.linear_value_heads / Hk, G = 2 * dk + 2 * r * dv;
  const std::string qkvz = a + "in_proj_qkvz.weight", ba = a + "in_proj_ba.weight";
  const std::vector<int64_t> whole_qkvz{Hk * G, D}, whole_ba{Hk * 2 * r, D};
  std::vector<WantTensor> parts;
  // (offset within a key head's group, rows) of q, k, v, z
  const std::pair<int64_t, int64_t> pieces[] = {{0, dk}, {dk, dk}, {2 * dk, r * dv}, {2 * dk + r * dv, r * dv}};
  for (const auto& [off, rows] : pieces)
    for (int64_t h = 0; h < Hk; ++h) parts.emplace_back(qkvz, std::vector<int64_t>{rows, D}, h * G + off, whole_qkvz);
  for (int64_t off : {int64_t(0), r})
    for (int64_t h = 0; h < Hk; ++h) parts.emplace_back(ba, std::vector<int64_t>{r, D}, h * 2 * r + off, whole_ba);
  return parts;
}

LayerPlan plan(const ModelConfig& c, int l, const TensorIndex& t) {
  const std::string p = prefix_of(t) + "layers." + std::to_string(l) + ".";
  const int64_t D = c.hidden_size, H = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  LayerPlan plan;
  auto one = [&](Dst dst, const std::string& name, std::vector<int64_t> shape, float offset = 0) {
    Slot s{std::move(dst), {{name, std::move(shape)}}};
    s.offset = offset;
    plan.push_back(std::move(s));
  };
  one([](LayerWeights& L) -> at::Tensor& { return L.attn_norm; }, p + "input_layernorm.weight", {D}, 1.0f);
  if (c.kv_index(l) >= 0) {
    const std::string a = p + "self_attn.";
    plan.push_back({[](LayerWeights& L) -> at::Tensor& { return L.wqkv; },
                    {{a + "q_proj.weight", {(c.attn_output_gate ? 2 : 1) * H * d, D}},
                     {a + "k_proj.weight", {Hk * d, D}},
                     {a + "v_proj.weight", {Hk * d, D}}}});
    one([](LayerWeights& L) -> at::Tensor& { return L.wo; }, a + "o_proj.weight", {D, H * d});
    one([](LayerWeights& L) -> at::Tensor& { return L.q_norm; }, a + "q_norm.weight", {d}, 1.0f);
    one([](LayerWeights& L) -> at::Tensor& { return L.k_norm; }, a + "k_norm.weight", {d}, 1.0f);
  } else {
    const std::string a = p + "linear_attn.";
    const int64_t Hv = c.linear_value_heads, CD = c.linear_conv_dim(), Vd = c.linear_v_dim();
    if (grouped(c))
      plan.push_back({[](LayerWeights& L) -> at::Tensor& { return L.wqkv; }, grouped_projection(c, a)});
    else
      plan.push_back({[](LayerWeights& L) -> at::Tensor& { return L.wqkv; },
                      {{a + "in_proj_qkv.weight", {CD, D}},
                       {a + "in_proj_z.weight", {Vd, D}},
                       {a + "in_proj_b.weight", {Hv, D}},
                       {a + "in_proj_a.weight", {Hv, D}}}});
    one([](LayerWeights& L) -> at::Tensor& { return L.conv_w; }, a + "conv1d.weight", {CD, 1, c.linear_conv_kernel});
    one([](LayerWeights& L) -> at::Tensor& { return L.dt_bias; }, a + "dt_bias", {Hv});
    one([](LayerWeights& L) -> at::Tensor& { return L.a_log; }, a + "A_log", {Hv});
    one([](LayerWeights& L) -> at::Tensor& { return L.gdn_norm; }, a + "norm.weight", {c.linear_value_dim});
    one([](LayerWeights& L) -> at::Tensor& { return L.wo; }, a + "out_proj.weight", {D, Vd});
  }
  one([](LayerWeights& L) -> at::Tensor& { return L.ffn_norm; }, p + "post_attention_layernorm.weight", {D}, 1.0f);
  const std::string m = p + "mlp.";
  if (!c.is_moe_layer(l)) {
    const int64_t I = c.intermediate_size;
    plan.push_back({[](LayerWeights& L) -> at::Tensor& { return L.w_gate_up; },
                    {{m + "gate_proj.weight", {I, D}}, {m + "up_proj.weight", {I, D}}}});
    one([](LayerWeights& L) -> at::Tensor& { return L.w_down; }, m + "down_proj.weight", {D, I});
    return plan;
  }
  const int64_t E = c.n_experts, I = c.moe_intermediate_size, Is = c.shared_width();
  one([](LayerWeights& L) -> at::Tensor& { return L.router; }, m + "gate.weight", {E, D});
  // The hub's fused tensors ([E, 2I, D]: gate rows then up rows; [E, D, I]), or one tensor per expert.
  const std::string x = m + "experts.";
  const bool fused = t.owner.empty() || t.has(x + "gate_up_proj");
  for (int e = 0; e < E; ++e) {
    const size_t i = size_t(e);
    const std::string xe = x + std::to_string(e) + ".";
    Slot gu{[i, E](LayerWeights& L) -> at::Tensor& {
              L.expert_gate_up.resize(size_t(E));
              return L.expert_gate_up[i];
            },
            fused ? std::vector<WantTensor>{WantTensor(x + "gate_up_proj", {2 * I, D}, e * 2 * I, {E, 2 * I, D})}
                  : std::vector<WantTensor>{{xe + "gate_proj.weight", {I, D}}, {xe + "up_proj.weight", {I, D}}},
            e};
    Slot dn{[i, E](LayerWeights& L) -> at::Tensor& {
              L.expert_down.resize(size_t(E));
              return L.expert_down[i];
            },
            fused ? std::vector<WantTensor>{WantTensor(x + "down_proj", {D, I}, e * D, {E, D, I})}
                  : std::vector<WantTensor>{{xe + "down_proj.weight", {D, I}}},
            e};
    plan.push_back(std::move(gu));
    plan.push_back(std::move(dn));
  }
  plan.push_back({[](LayerWeights& L) -> at::Tensor& { return L.shared_gate_up; },
                  {{m + "shared_expert.gate_proj.weight", {Is, D}}, {m + "shared_expert.up_proj.weight", {Is, D}}}});
  one([](LayerWeights& L) -> at::Tensor& { return L.shared_down; }, m + "shared_expert.down_proj.weight", {D, Is});
  one([](LayerWeights& L) -> at::Tensor& { return L.shared_gate; }, m + "shared_expert_gate.weight", {1, D});
  return plan;
}

// The experts in one form per layer: a fused tensor beside per-expert ones is ambiguous.
void check(const ModelConfig& c, const TensorIndex& t, const std::string&) {
  for (int l = 0; l < c.decoder_layers(); ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string x = prefix_of(t) + "layers." + std::to_string(l) + ".mlp.experts.";
    if (t.has(x + "gate_up_proj") && t.has(x + "0.gate_proj.weight"))
      throw Error(t.file_of(x + "gate_up_proj").path(), "tensor '" + x + "gate_up_proj'",
                  "both fused experts and per-expert tensors ('" + x + "0.gate_proj.weight'): one form per layer");
  }
}

}  // namespace

const Family kQwen3_5Family = {"qwen3_5", {"Qwen3_5ForConditionalGeneration"}, parse_dense, globals, nullptr, plan,
                               hybrid_layer};
const Family kQwen3_5MoeFamily = {"qwen3_5_moe", {"Qwen3_5MoeForConditionalGeneration"}, parse_moe, globals, check, plan,
                                  hybrid_layer};
const Family kQwen3NextFamily = {"qwen3_next", {"Qwen3NextForCausalLM"}, parse_next, globals, check, plan, hybrid_layer};
// The text-only forms (the text_config's own model_type, its fields at the top level).
const Family kQwen3_5TextFamily = {"qwen3_5_text", {"Qwen3_5ForCausalLM"}, parse_dense, globals, nullptr, plan,
                                   hybrid_layer};
const Family kQwen3_5MoeTextFamily = {"qwen3_5_moe_text", {"Qwen3_5MoeForCausalLM"}, parse_moe, globals, check, plan,
                                      hybrid_layer};

}  // namespace kvq::detail
