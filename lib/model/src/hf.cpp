// HF checkpoints: safetensors weights (single file or sharded through an index), opened and
// validated against the config (hf_config.cpp) before anything is converted. Llama-layout names
// for every family, ChatGLM's own (transformer.encoder.layers.N ...) for chatglm; fused q|k|v and
// gate|up tensors load as the stacked fp32 tensors the forward uses anyway.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "hf_json.hpp"
#include "safetensors.hpp"
#include "weights.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace kvq::detail {
namespace {

// MoE tensor names: Qwen3-MoE `mlp.gate` + `mlp.experts.{e}.{gate,up,down}_proj`, Mixtral
// `block_sparse_moe.gate` + `block_sparse_moe.experts.{e}.w1/w3/w2` (w1 gate, w3 up, w2 down).
std::string moe_prefix(const ModelConfig& c, int layer) {
  return "model.layers." + std::to_string(layer) + (c.architecture == "mixtral" ? ".block_sparse_moe." : ".mlp.");
}
std::string router_name(const ModelConfig& c, int layer) { return moe_prefix(c, layer) + "gate.weight"; }
struct ExpertNames { std::string gate, up, down; };
ExpertNames expert_names(const ModelConfig& c, int layer, int e) {
  const std::string p = moe_prefix(c, layer) + "experts." + std::to_string(e) + ".";
  if (c.architecture == "mixtral") return {p + "w1.weight", p + "w3.weight", p + "w2.weight"};
  return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
}

// The expert count of config.json against the tensors present: a missing expert or one numbered
// past the count is a config/weights mismatch, reported as such rather than as one absent tensor.
void check_expert_count(const ModelConfig& c, const std::string& config_path,
                        const std::map<std::string, const SafetensorsFile*>& owner, const std::string& source) {
  const std::string key = c.architecture == "mixtral"       ? "num_local_experts"
                          : c.architecture == "deepseek_v2" ? "n_routed_experts"
                                                            : "num_experts";
  const std::string stated = key + " is " + std::to_string(c.n_experts);
  for (const auto& kv : owner) {
    const std::string& name = kv.first;
    const size_t at = name.find(".experts.");
    if (at == std::string::npos || name.rfind("model.layers.", 0) != 0) continue;
    const size_t b = at + 9, e = name.find('.', b);
    if (e == std::string::npos || e == b || name.find_first_not_of("0123456789", b) != e) continue;
    if (e - b > 9 || std::stoll(name.substr(b, e - b)) >= c.n_experts)
      throw Error(config_path, key, stated + " but the weights have tensor '" + name + "' (in " + kv.second->path() + ")");
  }
  for (int l = 0; l < c.n_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    for (int x = 0; x < c.n_experts; ++x) {
      const ExpertNames n = expert_names(c, l, x);
      for (const std::string* t : {&n.gate, &n.up, &n.down})
        if (!owner.count(*t))
          throw Error(config_path, key, stated + " but tensor '" + *t + "' is missing from " + source);
    }
  }
}

struct WantTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Tensor names of a checkpoint form. Llama layout (model.layers.N.self_attn.q_proj ...) for every
// family but chatglm (transformer.encoder.layers.N.self_attention.query_key_value ...). Fused
// tensors hold their parts as row ranges: qkv = [Q; K; V], gate_up = [gate; up].
struct GlobalNames {
  std::string embed, final_norm, lm_head;
};
GlobalNames global_names(const ModelConfig& c) {
  if (c.architecture == "chatglm")
    return {"transformer.embedding.word_embeddings.weight", "transformer.encoder.final_layernorm.weight",
            "transformer.output_layer.weight"};
  return {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
}

struct LayerNames {
  std::string attn_norm, ffn_norm;
  std::string qkv;        // fused [Q; K; V] weight, or empty: q, k, v below
  std::string qkv_bias;   // the fused bias (qkv set and c.qkv_bias)
  std::string q, k, v;    // split projections (".weight"; their biases are ".bias")
  std::string o;
  std::string gate_up;    // fused [gate; up], or empty: gate, up below
  std::string gate, up, down;
  std::string post_attn_norm, post_mlp_norm;  // glm4 sandwich norms
};
LayerNames layer_names(const ModelConfig& c, int l, bool fused_qkv) {
  LayerNames n;
  if (c.architecture == "chatglm") {
    const std::string p = "transformer.encoder.layers." + std::to_string(l) + ".";
    n.attn_norm = p + "input_layernorm.weight";
    n.ffn_norm = p + "post_attention_layernorm.weight";
    n.qkv = p + "self_attention.query_key_value.weight";
    n.qkv_bias = p + "self_attention.query_key_value.bias";
    n.o = p + "self_attention.dense.weight";
    n.gate_up = p + "mlp.dense_h_to_4h.weight";
    n.down = p + "mlp.dense_4h_to_h.weight";
    return n;
  }
  const std::string p = "model.layers." + std::to_string(l) + ".";
  n.attn_norm = p + "input_layernorm.weight";
  n.ffn_norm = p + "post_attention_layernorm.weight";
  if (fused_qkv) {  // an older GLM converter's qkv_proj
    n.qkv = p + "self_attn.qkv_proj.weight";
    n.qkv_bias = p + "self_attn.qkv_proj.bias";
  } else {
    n.q = p + "self_attn.q_proj";
    n.k = p + "self_attn.k_proj";
    n.v = p + "self_attn.v_proj";
  }
  n.o = p + "self_attn.o_proj.weight";
  const bool glm = c.architecture == "glm" || c.architecture == "glm4";
  if (glm) {
    n.gate_up = p + "mlp.gate_up_proj.weight";
  } else {
    n.gate = p + "mlp.gate_proj.weight";
    n.up = p + "mlp.up_proj.weight";
  }
  n.down = p + "mlp.down_proj.weight";
  if (c.sandwich_norm) {
    n.post_attn_norm = p + "post_self_attn_layernorm.weight";
    n.post_mlp_norm = p + "post_mlp_layernorm.weight";
  }
  return n;
}

// DeepSeek-V2 MLA's attention tensors of layer l (o_proj included), the q projection first and
// kv_a_proj_with_mqa second: build() stacks them as the rows of one GEMM.
std::vector<WantTensor> mla_tensors(const ModelConfig& c, int l) {
  const int64_t D = c.hidden_size, H = c.n_heads, R = c.kv_lora_rank;
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
  std::vector<WantTensor> w;
  if (c.q_lora_rank > 0) {
    w.push_back({p + "q_a_proj.weight", {c.q_lora_rank, D}});
    w.push_back({p + "kv_a_proj_with_mqa.weight", {R + c.qk_rope_head_dim, D}});
    w.push_back({p + "q_a_layernorm.weight", {c.q_lora_rank}});
    w.push_back({p + "q_b_proj.weight", {H * qk, c.q_lora_rank}});
  } else {
    w.push_back({p + "q_proj.weight", {H * qk, D}});
    w.push_back({p + "kv_a_proj_with_mqa.weight", {R + c.qk_rope_head_dim, D}});
  }
  w.push_back({p + "kv_a_layernorm.weight", {R}});
  w.push_back({p + "kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), R}});
  w.push_back({p + "o_proj.weight", {D, H * c.v_head_dim}});
  return w;
}

// The tensors of decoder layer l, with the shapes the config implies.
std::vector<WantTensor> layer_tensors(const ModelConfig& c, int l, bool fused_qkv) {
  const int64_t D = c.hidden_size, I = c.intermediate_size;
  const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const LayerNames n = layer_names(c, l, fused_qkv);
  std::vector<WantTensor> w;
  w.push_back({n.attn_norm, {D}});
  if (c.is_mla()) {
    for (const auto& t : mla_tensors(c, l)) w.push_back(t);
  } else if (!n.qkv.empty()) {
    w.push_back({n.qkv, {qd + 2 * kvd, D}});
    if (c.qkv_bias) w.push_back({n.qkv_bias, {qd + 2 * kvd}});
  } else {
    w.push_back({n.q + ".weight", {qd, D}});
    w.push_back({n.k + ".weight", {kvd, D}});
    w.push_back({n.v + ".weight", {kvd, D}});
    if (c.qkv_bias) {
      w.push_back({n.q + ".bias", {qd}});
      w.push_back({n.k + ".bias", {kvd}});
      w.push_back({n.v + ".bias", {kvd}});
    }
  }
  if (!c.is_mla()) w.push_back({n.o, {D, qd}});
  if (c.o_bias) w.push_back({p + "self_attn.o_proj.bias", {D}});
  if (c.qk_norm) {
    w.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
    w.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
  }
  if (c.sandwich_norm) {
    w.push_back({n.post_attn_norm, {D}});
    w.push_back({n.post_mlp_norm, {D}});
  }
  w.push_back({n.ffn_norm, {D}});
  if (c.is_moe_layer(l)) {
    const int64_t E = c.n_experts, Ie = c.moe_intermediate_size;
    w.push_back({router_name(c, l), {E, D}});
    for (int e = 0; e < E; ++e) {
      const ExpertNames en = expert_names(c, l, e);
      w.push_back({en.gate, {Ie, D}});
      w.push_back({en.up, {Ie, D}});
      w.push_back({en.down, {D, Ie}});
    }
    if (c.n_shared_experts > 0) {
      const int64_t Is = int64_t(c.n_shared_experts) * Ie;
      w.push_back({p + "mlp.shared_experts.gate_proj.weight", {Is, D}});
      w.push_back({p + "mlp.shared_experts.up_proj.weight", {Is, D}});
      w.push_back({p + "mlp.shared_experts.down_proj.weight", {D, Is}});
    }
  } else {
    if (!n.gate_up.empty()) {
      w.push_back({n.gate_up, {2 * I, D}});
    } else {
      w.push_back({n.gate, {I, D}});
      w.push_back({n.up, {I, D}});
    }
    w.push_back({n.down, {D, I}});
  }
  return w;
}

// An opened, fully validated HF checkpoint: every tensor's file, dtype and shape checked before
// any is converted. Converts on demand; the whole-model load and the streamed forward both build
// their fp32 layers here.
class HfCheckpoint final : public LayerSource {
 public:
  HfCheckpoint(const std::string& dir, const std::string& config_path, const ModelConfig& c)
      : c_(c), names_(global_names(c)) {
    // Where each tensor lives: one file, or the shard named by the index's weight_map.
    const std::string single = (fs::path(dir) / "model.safetensors").string();
    const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
    if (fs::exists(single)) {
      source_ = single;
      auto f = std::make_unique<SafetensorsFile>(single);
      for (const auto& kv : f->tensors()) owner_[kv.first] = f.get();
      shards_[single] = std::move(f);
    } else if (fs::exists(index)) {
      source_ = index;
      const json j = parse_json_file(index);
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        throw Error(index, "weight_map", "missing or not an object");
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        const std::string field = "weight_map['" + it.key() + "']";
        if (!it.value().is_string()) throw Error(index, field, "expected a file name, found " + it.value().dump());
        const std::string shard = it.value().get<std::string>();
        if (shard.empty() || shard.find('/') != std::string::npos || shard == "..")
          throw Error(index, field, "'" + shard + "' is not a file name in the model directory");
        const std::string shard_path = (fs::path(dir) / shard).string();
        auto& f = shards_[shard_path];
        if (!f) {
          if (!fs::exists(shard_path)) throw Error(index, field, "shard '" + shard + "' does not exist");
          f = std::make_unique<SafetensorsFile>(shard_path);
        }
        owner_[it.key()] = f.get();
      }
    } else {
      throw Error(dir, "model.safetensors", "missing (and no model.safetensors.index.json)");
    }
    const int64_t D = c.hidden_size, V = c.vocab_size;
    fused_qkv_ = c.architecture == "chatglm" ||
                 ((c.architecture == "glm" || c.architecture == "glm4") && owner_.count("model.layers.0.self_attn.qkv_proj.weight"));
    // Validate everything before converting anything.
    if (c.n_experts > 0) check_expert_count(c, config_path, owner_, source_);
    if (fused_qkv_) check_fused_qkv(config_path);
    if (c.is_mla()) check_kv_lora_rank(config_path);
    file_of(names_.embed).check(names_.embed, {V, D});
    for (int l = 0; l < c.n_layers; ++l)
      for (const auto& want : layer_tensors(c, l, fused_qkv_)) file_of(want.name).check(want.name, want.shape);
    file_of(names_.final_norm).check(names_.final_norm, {D});
    if (!c.tie_word_embeddings) file_of(names_.lm_head).check(names_.lm_head, {V, D});
  }

  const GlobalNames& names() const { return names_; }

  at::Tensor load(const std::string& name, const std::vector<int64_t>& shape) const {
    return file_of(name).load_f32(name, shape);
  }

  void build(int l, LayerWeights* out) const override {
    const ModelConfig& c = c_;
    const int64_t D = c.hidden_size, I = c.intermediate_size;
    const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // Converts tensor `name` into rows of a stacked tensor (a contiguous row range of dst).
    auto into = [&](const std::string& name, at::Tensor dst) {
      const SafetensorsFile& f = file_of(name);
      float* d = dst.data_ptr<float>();
      at::parallel_for(0, dst.numel(), 1 << 16, [&](int64_t b, int64_t e) { f.read_f32(name, b, e, d + b); });
    };
    auto stack = [&](const std::vector<std::string>& names, const std::vector<int64_t>& rows, int64_t cols) {
      int64_t total = 0;
      for (int64_t r : rows) total += r;
      at::Tensor t = cols > 0 ? at::empty({total, cols}, at::kFloat) : at::empty({total}, at::kFloat);
      int64_t at_row = 0;
      for (size_t i = 0; i < names.size(); ++i) {
        into(names[i], t.narrow(0, at_row, rows[i]));
        at_row += rows[i];
      }
      return t;
    };
    const LayerNames n = layer_names(c, l, fused_qkv_);
    LayerWeights L;
    L.attn_norm = load(n.attn_norm, {D});
    if (c.is_mla()) {
      const std::vector<WantTensor> m = mla_tensors(c, l);  // q (or q_a), kv_a, [q_a_norm, q_b], kv_a_norm, kv_b, o
      L.wqkv = stack({m[0].name, m[1].name}, {m[0].shape[0], m[1].shape[0]}, D);
      size_t i = 2;
      if (c.q_lora_rank > 0) {
        L.q_a_norm = load(m[i].name, m[i].shape);
        L.wq_b = load(m[i + 1].name, m[i + 1].shape);
        i += 2;
      }
      L.kv_a_norm = load(m[i].name, m[i].shape);
      L.w_kv_b = load(m[i + 1].name, m[i + 1].shape);
      L.wo = load(m[i + 2].name, m[i + 2].shape);
    } else if (!n.qkv.empty()) {
      L.wqkv = load(n.qkv, {qd + 2 * kvd, D});
      if (c.qkv_bias) L.bqkv = load(n.qkv_bias, {qd + 2 * kvd});
    } else {
      L.wqkv = stack({n.q + ".weight", n.k + ".weight", n.v + ".weight"}, {qd, kvd, kvd}, D);
      if (c.qkv_bias) L.bqkv = stack({n.q + ".bias", n.k + ".bias", n.v + ".bias"}, {qd, kvd, kvd}, 0);
    }
    if (!c.is_mla()) L.wo = load(n.o, {D, qd});
    if (c.o_bias) L.bo = load(p + "self_attn.o_proj.bias", {D});
    L.ffn_norm = load(n.ffn_norm, {D});
    if (c.qk_norm) {
      L.q_norm = load(p + "self_attn.q_norm.weight", {c.head_dim});
      L.k_norm = load(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    if (c.sandwich_norm) {
      L.post_attn_norm = load(n.post_attn_norm, {D});
      L.post_mlp_norm = load(n.post_mlp_norm, {D});
    }
    if (c.is_moe_layer(l)) {
      const int64_t Ie = c.moe_intermediate_size;
      L.router = load(router_name(c, l), {c.n_experts, D});
      for (int e = 0; e < c.n_experts; ++e) {
        const ExpertNames en = expert_names(c, l, e);
        L.expert_gate_up.push_back(stack({en.gate, en.up}, {Ie, Ie}, D));
        L.expert_down.push_back(load(en.down, {D, Ie}));
      }
      if (c.n_shared_experts > 0) {
        const int64_t Is = int64_t(c.n_shared_experts) * Ie;
        L.shared_gate_up = stack({p + "mlp.shared_experts.gate_proj.weight", p + "mlp.shared_experts.up_proj.weight"},
                                 {Is, Is}, D);
        L.shared_down = load(p + "mlp.shared_experts.down_proj.weight", {D, Is});
      }
    } else {
      L.w_gate_up = n.gate_up.empty() ? stack({n.gate, n.up}, {I, I}, D) : load(n.gate_up, {2 * I, D});
      L.w_down = load(n.down, {D, I});
    }
    *out = std::move(L);
  }

  void release(int l) const override {
    for (const auto& want : layer_tensors(c_, l, fused_qkv_)) file_of(want.name).drop(want.name);
  }

  int64_t stored_bytes(int l) const override {
    int64_t n = 0;
    for (const auto& want : layer_tensors(c_, l, fused_qkv_)) n += int64_t(file_of(want.name).stored_bytes(want.name));
    return n;
  }

  at::Tensor embed_rows(const at::Tensor& ids) const override {
    const std::string& name = names_.embed;
    const SafetensorsFile& f = file_of(name);
    const int64_t N = ids.numel(), D = c_.hidden_size;
    at::Tensor out = at::empty({N, D}, at::kFloat);
    const int64_t* id = ids.data_ptr<int64_t>();
    float* o = out.data_ptr<float>();
    at::parallel_for(0, N, std::max<int64_t>(1, 8192 / D), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) f.read_f32(name, id[r] * D, (id[r] + 1) * D, o + r * D);
    });
    return out;
  }

  at::Tensor lm_head() const override {
    const std::string& name = c_.tie_word_embeddings ? names_.embed : names_.lm_head;
    at::Tensor t = load(name, {c_.vocab_size, c_.hidden_size});
    file_of(name).drop(name);
    return t;
  }

  void drop(const std::string& name) const { file_of(name).drop(name); }

 private:
  const SafetensorsFile& file_of(const std::string& name) const {
    auto it = owner_.find(name);
    if (it == owner_.end())
      throw Error(source_, "tensor '" + name + "'", source_.size() > 5 && source_.substr(source_.size() - 5) == ".json"
                                                        ? "not in weight_map"
                                                        : "missing");
    return *it->second;
  }

  // A fused [Q; K; V] projection must have the rows the config's head counts give: a checkpoint
  // whose rows do not add up is a config/weights mismatch, named as such (not a bare shape error).
  void check_fused_qkv(const std::string& config_path) const {
    const ModelConfig& c = c_;
    const bool chat = c.architecture == "chatglm";
    const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerNames n = layer_names(c, l, true);
      for (const std::string* name : {&n.qkv, c.qkv_bias ? &n.qkv_bias : nullptr}) {
        if (!name) continue;
        const StTensorInfo* t = file_of(*name).find(*name);
        if (!t || t->shape.empty() || t->shape[0] == qd + 2 * kvd) continue;  // absent: check() says so
        throw Error(file_of(*name).path(), "tensor '" + *name + "'",
                    std::to_string(t->shape[0]) + " rows do not add up to Q + K + V = " + std::to_string(qd) + " + " +
                        std::to_string(kvd) + " + " + std::to_string(kvd) + " = " + std::to_string(qd + 2 * kvd) +
                        " (" + config_path + ": num_attention_heads " +
                        std::to_string(c.n_heads) + ", " + (chat ? "multi_query_group_num " : "num_key_value_heads ") +
                        std::to_string(c.n_kv_heads) + ", " + (chat ? "kv_channels " : "head_dim ") +
                        std::to_string(c.head_dim) + ")");
      }
    }
  }

  // MLA: the latent width the tensors hold must be config.json's kv_lora_rank; a mismatch is named
  // as such (not as three unrelated shape errors).
  void check_kv_lora_rank(const std::string& config_path) const {
    const ModelConfig& c = c_;
    const int64_t R = c.kv_lora_rank, rope = c.qk_rope_head_dim;
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      struct Want { std::string name; size_t dim; int64_t size; const char* what; };
      const Want wants[] = {
          {p + "kv_a_proj_with_mqa.weight", 0, R + rope, "rows (kv_lora_rank + qk_rope_head_dim)"},
          {p + "kv_a_layernorm.weight", 0, R, "entries (kv_lora_rank)"},
          {p + "kv_b_proj.weight", 1, R, "columns (kv_lora_rank)"}};
      for (const Want& w : wants) {
        if (!owner_.count(w.name)) continue;  // check() names an absent tensor
        const StTensorInfo* t = file_of(w.name).find(w.name);
        if (!t || t->shape.size() <= w.dim || t->shape[w.dim] == w.size) continue;
        throw Error(config_path, "kv_lora_rank",
                    std::to_string(R) + " disagrees with the weights: tensor '" + w.name + "' (in " +
                        file_of(w.name).path() + ") has shape " + shape_str(t->shape) + ", expected " +
                        std::to_string(w.size) + " " + w.what);
      }
    }
  }

  ModelConfig c_;
  GlobalNames names_;
  bool fused_qkv_ = false;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsFile*> owner_;
  std::string source_;  // the file named when a tensor is absent
};

}  // namespace

void load_hf(const std::string& dir, ModelConfig* cfg, ModelWeights* w, std::string* config_sha256, bool stream) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) throw Error(dir, "config.json", "missing");
  *cfg = parse_hf_config(config_path);
  *config_sha256 = sha256_file(config_path);
  const ModelConfig& c = *cfg;
  auto ckpt = std::make_shared<HfCheckpoint>(dir, config_path, c);
  w->final_norm = ckpt->load(ckpt->names().final_norm, {c.hidden_size});
  if (stream) {
    w->source = ckpt;
    return;
  }
  // Whole model: every layer converted, each layer's stored pages dropped once it is (the peak is
  // the fp32 model plus one layer's stored bytes, not the fp32 model plus the whole checkpoint).
  w->embed = ckpt->load(ckpt->names().embed, {c.vocab_size, c.hidden_size});
  ckpt->drop(ckpt->names().embed);
  w->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    ckpt->build(l, &w->layers[size_t(l)]);
    ckpt->release(l);
  }
  w->lm_head = c.tie_word_embeddings ? w->embed : ckpt->lm_head();
}

}  // namespace kvq::detail
