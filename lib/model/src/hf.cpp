// HF checkpoints: safetensors weights (single file or sharded through an index), opened and
// validated against the config (hf_config.cpp) before anything is converted. The tensor names
// and shapes come from the model's family (families/), as a plan of which LayerWeights tensor
// each fills (parts/layout.hpp); fused tensors load as the stacked fp32 tensors the forward uses.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "families/family.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "parts/hf_json.hpp"
#include "parts/layout.hpp"
#include "safetensors.hpp"
#include "weights.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace kvq::detail {
namespace {

// An opened, fully validated HF checkpoint: every tensor's file, dtype and shape checked before
// any is converted. Converts on demand; the whole-model load and the streamed forward both build
// their fp32 layers here.
class HfCheckpoint final : public LayerSource {
 public:
  HfCheckpoint(const std::string& dir, const std::string& config_path, const ModelConfig& c, const Family& family)
      : c_(c), family_(family), names_(family.global_names(c)) {
    // Where each tensor lives: one file, or the shard named by the index's weight_map.
    const std::string single = (fs::path(dir) / "model.safetensors").string();
    const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
    if (fs::exists(single)) {
      t_.source = single;
      auto f = std::make_unique<SafetensorsFile>(single);
      for (const auto& kv : f->tensors()) t_.owner[kv.first] = f.get();
      shards_[single] = std::move(f);
    } else if (fs::exists(index)) {
      t_.source = index;
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
        t_.owner[it.key()] = f.get();
      }
    } else {
      throw Error(dir, "model.safetensors", "missing (and no model.safetensors.index.json)");
    }
    const int64_t D = c.hidden_size, V = c.vocab_size;
    // Validate everything before converting anything.
    if (family.check_weights) family.check_weights(c, t_, config_path);
    file_of(names_.embed).check(names_.embed, {V, D});
    for (int l = 0; l < c.n_layers; ++l)
      for (const auto& want : plan_tensors(plan(l))) file_of(want.name).check(want.name, want.shape);
    file_of(names_.final_norm).check(names_.final_norm, {D});
    if (!c.tie_word_embeddings) file_of(names_.lm_head).check(names_.lm_head, {V, D});
  }

  const GlobalNames& names() const { return names_; }

  at::Tensor load(const std::string& name, const std::vector<int64_t>& shape) const {
    return file_of(name).load_f32(name, shape);
  }

  void build(int l, LayerWeights* out) const override {
    // Converts tensor `name` into rows of a stacked tensor (a contiguous row range of dst).
    auto into = [&](const std::string& name, at::Tensor dst) {
      const SafetensorsFile& f = file_of(name);
      float* d = dst.data_ptr<float>();
      at::parallel_for(0, dst.numel(), 1 << 16, [&](int64_t b, int64_t e) { f.read_f32(name, b, e, d + b); });
    };
    LayerWeights L;
    for (const Slot& s : plan(l)) {
      at::Tensor& dst = s.dst(L);
      if (s.parts.size() == 1) {
        dst = load(s.parts[0].name, s.parts[0].shape);
        continue;
      }
      int64_t total = 0;
      for (const WantTensor& p : s.parts) total += p.shape[0];
      const std::vector<int64_t>& first = s.parts[0].shape;
      at::Tensor t = first.size() > 1 ? at::empty({total, first[1]}, at::kFloat) : at::empty({total}, at::kFloat);
      int64_t at_row = 0;
      for (const WantTensor& p : s.parts) {
        into(p.name, t.narrow(0, at_row, p.shape[0]));
        at_row += p.shape[0];
      }
      dst = t;
    }
    *out = std::move(L);
  }

  void release(int l) const override {
    for (const auto& want : plan_tensors(plan(l))) file_of(want.name).drop(want.name);
  }

  int64_t stored_bytes(int l) const override {
    int64_t n = 0;
    for (const auto& want : plan_tensors(plan(l))) n += int64_t(file_of(want.name).stored_bytes(want.name));
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
  LayerPlan plan(int l) const { return family_.layer_plan(c_, l, t_); }
  const SafetensorsFile& file_of(const std::string& name) const { return t_.file_of(name); }

  ModelConfig c_;
  const Family& family_;
  GlobalNames names_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
  TensorIndex t_;
};

}  // namespace

void load_hf(const std::string& dir, ModelConfig* cfg, ModelWeights* w, std::string* config_sha256, bool stream) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) throw Error(dir, "config.json", "missing");
  *cfg = parse_hf_config(config_path);
  *config_sha256 = sha256_file(config_path);
  const ModelConfig& c = *cfg;
  auto ckpt = std::make_shared<HfCheckpoint>(dir, config_path, c, *find_family(c.architecture));
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
