// HF checkpoints: safetensors weights (single file or sharded through an index), opened and
// validated against the config (hf_config.cpp) before anything is converted.
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
  const std::string key = c.architecture == "mixtral" ? "num_local_experts" : "num_experts";
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

// The tensors of decoder layer l, with the shapes the config implies.
std::vector<WantTensor> layer_tensors(const ModelConfig& c, int l) {
  const int64_t D = c.hidden_size, I = c.intermediate_size;
  const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  std::vector<WantTensor> w;
  w.push_back({p + "input_layernorm.weight", {D}});
  w.push_back({p + "self_attn.q_proj.weight", {qd, D}});
  w.push_back({p + "self_attn.k_proj.weight", {kvd, D}});
  w.push_back({p + "self_attn.v_proj.weight", {kvd, D}});
  if (c.qkv_bias) {
    w.push_back({p + "self_attn.q_proj.bias", {qd}});
    w.push_back({p + "self_attn.k_proj.bias", {kvd}});
    w.push_back({p + "self_attn.v_proj.bias", {kvd}});
  }
  w.push_back({p + "self_attn.o_proj.weight", {D, qd}});
  if (c.o_bias) w.push_back({p + "self_attn.o_proj.bias", {D}});
  if (c.qk_norm) {
    w.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
    w.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
  }
  w.push_back({p + "post_attention_layernorm.weight", {D}});
  if (c.is_moe_layer(l)) {
    const int64_t E = c.n_experts, Ie = c.moe_intermediate_size;
    w.push_back({router_name(c, l), {E, D}});
    for (int e = 0; e < E; ++e) {
      const ExpertNames n = expert_names(c, l, e);
      w.push_back({n.gate, {Ie, D}});
      w.push_back({n.up, {Ie, D}});
      w.push_back({n.down, {D, Ie}});
    }
  } else {
    w.push_back({p + "mlp.gate_proj.weight", {I, D}});
    w.push_back({p + "mlp.up_proj.weight", {I, D}});
    w.push_back({p + "mlp.down_proj.weight", {D, I}});
  }
  return w;
}

// An opened, fully validated HF checkpoint: every tensor's file, dtype and shape checked before
// any is converted. Converts on demand; the whole-model load and the streamed forward both build
// their fp32 layers here.
class HfCheckpoint final : public LayerSource {
 public:
  HfCheckpoint(const std::string& dir, const std::string& config_path, const ModelConfig& c) : c_(c) {
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
    // Validate everything before converting anything.
    if (c.n_experts > 0) check_expert_count(c, config_path, owner_, source_);
    file_of("model.embed_tokens.weight").check("model.embed_tokens.weight", {V, D});
    for (int l = 0; l < c.n_layers; ++l)
      for (const auto& want : layer_tensors(c, l)) file_of(want.name).check(want.name, want.shape);
    file_of("model.norm.weight").check("model.norm.weight", {D});
    if (!c.tie_word_embeddings) file_of("lm_head.weight").check("lm_head.weight", {V, D});
  }

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
    LayerWeights L;
    L.attn_norm = load(p + "input_layernorm.weight", {D});
    L.wqkv = stack({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"},
                   {qd, kvd, kvd}, D);
    if (c.qkv_bias)
      L.bqkv = stack({p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"},
                     {qd, kvd, kvd}, 0);
    L.wo = load(p + "self_attn.o_proj.weight", {D, qd});
    if (c.o_bias) L.bo = load(p + "self_attn.o_proj.bias", {D});
    L.ffn_norm = load(p + "post_attention_layernorm.weight", {D});
    if (c.qk_norm) {
      L.q_norm = load(p + "self_attn.q_norm.weight", {c.head_dim});
      L.k_norm = load(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    if (c.is_moe_layer(l)) {
      const int64_t Ie = c.moe_intermediate_size;
      L.router = load(router_name(c, l), {c.n_experts, D});
      for (int e = 0; e < c.n_experts; ++e) {
        const ExpertNames n = expert_names(c, l, e);
        L.expert_gate_up.push_back(stack({n.gate, n.up}, {Ie, Ie}, D));
        L.expert_down.push_back(load(n.down, {D, Ie}));
      }
    } else {
      L.w_gate_up = stack({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, {I, I}, D);
      L.w_down = load(p + "mlp.down_proj.weight", {D, I});
    }
    *out = std::move(L);
  }

  void release(int l) const override {
    for (const auto& want : layer_tensors(c_, l)) file_of(want.name).drop(want.name);
  }

  int64_t stored_bytes(int l) const override {
    int64_t n = 0;
    for (const auto& want : layer_tensors(c_, l)) n += int64_t(file_of(want.name).stored_bytes(want.name));
    return n;
  }

  at::Tensor embed_rows(const at::Tensor& ids) const override {
    const std::string name = "model.embed_tokens.weight";
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
    const std::string name = c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
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

  ModelConfig c_;
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
  w->final_norm = ckpt->load("model.norm.weight", {c.hidden_size});
  if (stream) {
    w->source = ckpt;
    return;
  }
  // Whole model: every layer converted, each layer's stored pages dropped once it is (the peak is
  // the fp32 model plus one layer's stored bytes, not the fp32 model plus the whole checkpoint).
  w->embed = ckpt->load("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  ckpt->drop("model.embed_tokens.weight");
  w->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    ckpt->build(l, &w->layers[size_t(l)]);
    ckpt->release(l);
  }
  w->lm_head = c.tie_word_embeddings ? w->embed : ckpt->lm_head();
}

}  // namespace kvq::detail
