// HF checkpoints: safetensors weights (single file or sharded through an index), opened and
// validated against the config (hf_config.cpp) before anything is converted. The tensor names
// and shapes come from the model's family (families/), as a plan of which LayerWeights tensor
// each fills (parts/layout.hpp); fused tensors load as the stacked fp32 tensors the forward uses.
// Quantized weights (config.json's quantization_config: FP8 blocks / per tensor / per channel,
// INT4 pack-quantized, MXFP4; parts/quant.hpp) are described and checked with the rest, then
// dequantized to fp32 a layer (streamed: an expert) at a time.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
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
#include "parts/quant.hpp"
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
  HfCheckpoint(const std::string& dir, const std::string& config_path, const ModelConfig& c, const Family& family,
               Precision precision)
      : c_(c), family_(family), precision_(precision) {
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
    const json cj = parse_json_file(config_path);
    qc_ = parse_quant_config(cj.contains("quantization_config") ? cj["quantization_config"] : json(), config_path);
    for (const auto& kv : t_.owner)
      for (const char* suffix : {"_packed", "_blocks"}) {
        const std::string& n = kv.first;
        const size_t k = std::char_traits<char>::length(suffix);
        if (n.size() > k && n.compare(n.size() - k, k, suffix) == 0 && !t_.owner.count(n.substr(0, n.size() - k)))
          t_.packed.insert(n.substr(0, n.size() - k));
      }
    lookup_.find = [this](const std::string& n) -> const SafetensorsFile* {
      auto it = t_.owner.find(n);
      return it == t_.owner.end() ? nullptr : it->second;
    };
    lookup_.where = t_.source;
    names_ = family.global_names(c, t_);
    const int64_t D = c.hidden_size, V = c.vocab_size;
    // Validate everything before converting anything.
    if (family.check_weights) family.check_weights(c, t_, config_path);
    check(names_.embed, {V, D});
    for (int l = 0; l < c.decoder_layers(); ++l)
      for (const auto& want : plan_tensors(plan(l))) check(want.name, want.stored_shape());
    check(names_.final_norm, {D});
    if (!c.tie_word_embeddings) check(names_.lm_head, {V, D});
  }

  // Streamed: a MoE layer's routed experts are converted when routed to (LayerWeights::expert_source).
  void set_lazy_experts(bool on) { lazy_experts_ = on; }

  const GlobalNames& names() const { return names_; }

  at::Tensor load(const std::string& name, const std::vector<int64_t>& shape) const {
    auto q = quant_.find(name);
    if (q == quant_.end()) return file_of(name).load_f32(name, shape);
    at::Tensor t = at::empty(shape, at::kFloat);
    decode_into(q->second, t);
    return t;
  }
  // A GEMM weight (the embedding, the head) in the precision's dtype.
  at::Tensor load_gemm(const std::string& name, const std::vector<int64_t>& shape) const {
    if (precision_ == Precision::kFp32) return load(name, shape);
    at::Tensor t = at::empty(shape, at::kBFloat16);
    convert_into(name, t);
    return t;
  }
  Precision precision() const { return precision_; }

  void build(int l, LayerWeights* out) const override {
    LayerWeights L;
    const LayerPlan p = plan(l);
    for (const Slot& s : p)
      if (s.expert < 0 || !lazy_experts_) fill(s, L);
    if (lazy_experts_ && c_.is_moe_layer(l)) {
      // Each expert's slots (gate_up, down), converted on demand and handed back to the kernel after.
      auto slots = std::make_shared<std::vector<std::vector<Slot>>>(static_cast<size_t>(c_.n_experts));
      for (const Slot& s : p)
        if (s.expert >= 0) (*slots)[size_t(s.expert)].push_back(s);
      // One pair of fp32 buffers serves every expert of the layer in turn (the experts share a
      // shape): converting into pages already mapped, not fresh ones the kernel must zero.
      struct Buffers {
        at::Tensor gate_up, down;
      };
      auto buf = std::make_shared<Buffers>();
      L.expert_source = [this, slots, buf, E = size_t(c_.n_experts)](int e, at::Tensor* gate_up, at::Tensor* down) {
        LayerWeights one;
        one.expert_gate_up.resize(E);
        one.expert_down.resize(E);
        one.expert_gate_up[size_t(e)] = buf->gate_up;
        one.expert_down[size_t(e)] = buf->down;
        for (const Slot& s : (*slots)[size_t(e)]) fill(s, one);
        buf->gate_up = *gate_up = one.expert_gate_up[size_t(e)];
        buf->down = *down = one.expert_down[size_t(e)];
      };
    }
    *out = std::move(L);
  }

  void release(int l) const override {
    for (const auto& want : plan_tensors(plan(l))) drop_stored(want.name);
  }

  // The layer's stored bytes mapped at once while it is converted: each tensor's pages are handed
  // back as soon as it is (fill), so the largest one's.
  int64_t stored_bytes(int l) const override {
    int64_t widest = 0;
    for (const WantTensor& w : plan_tensors(plan(l))) widest = std::max(widest, stored(w));
    return widest;
  }

  at::Tensor embed_rows(const at::Tensor& ids) const override {
    const std::string& name = names_.embed;
    const int64_t N = ids.numel(), D = c_.hidden_size;
    at::Tensor out = at::empty({N, D}, at::kFloat);
    const int64_t* id = ids.data_ptr<int64_t>();
    float* o = out.data_ptr<float>();
    auto q = quant_.find(name);
    if (q != quant_.end()) {
      at::parallel_for(0, N, 1, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) decode_rows(q->second, id[r], id[r] + 1, o + r * D);
      });
      return round_rows(out);
    }
    const SafetensorsFile& f = file_of(name);
    at::parallel_for(0, N, std::max<int64_t>(1, 8192 / D), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) f.read_f32(name, id[r] * D, (id[r] + 1) * D, o + r * D);
    });
    return round_rows(out);
  }

  at::Tensor lm_head() const override {
    const std::string& name = c_.tie_word_embeddings ? names_.embed : names_.lm_head;
    at::Tensor t = load_gemm(name, {c_.vocab_size, c_.hidden_size});
    drop_stored(name);
    return t;
  }

  void drop(const std::string& name) const { drop_stored(name); }

  // Layer l's attention sinks [H] (the plan's slot that fills LayerWeights::sinks), or empty.
  std::vector<float> sinks(int l) const {
    LayerWeights probe;
    for (const Slot& s : plan(l))
      if (&s.dst(probe) == &probe.sinks) {
        const at::Tensor t = load(s.parts[0].name, s.parts[0].shape).contiguous();
        std::vector<float> v(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
        for (size_t h = 0; h < v.size(); ++h)
          if (!std::isfinite(v[h]))
            throw Error(file_of(s.parts[0].name).path(), "tensor '" + s.parts[0].name + "'",
                        "sink of head " + std::to_string(h) + " is not finite: " + std::to_string(v[h]));
        return v;
      }
    return {};
  }

 private:
  LayerPlan plan(int l) const { return family_.layer_plan(c_, l, t_); }
  const SafetensorsFile& file_of(const std::string& name) const { return t_.file_of(name); }

  // Checks tensor `name` against the shape the config implies. A checkpoint without a
  // quantization_config whose tensor is a float one keeps the plain check (and its messages);
  // anything else is described by parts/quant.hpp (format, dtypes, scales) and remembered.
  void check(const std::string& name, const std::vector<int64_t>& shape) {
    auto it = t_.owner.find(name);
    const bool plain_float = it != t_.owner.end() && [&] {
      const std::string& d = it->second->find(name)->dtype;
      return d == "F32" || d == "F16" || d == "BF16";
    }();
    if ((qc_.method == QuantConfig::Method::kNone && plain_float) || (it == t_.owner.end() && !t_.packed.count(name))) {
      file_of(name).check(name, shape);
      return;
    }
    QuantWeight w = describe_weight(lookup_, qc_, name);
    if (w.format == WeightFormat::kPlain) {
      file_of(name).check(name, shape);
      return;
    }
    check_weight_shape(w, shape);
    quant_[name] = std::move(w);
  }

  // BF16 precision: embedding rows as the whole load's BF16 table holds them (nearest even).
  at::Tensor round_rows(const at::Tensor& rows) const {
    return precision_ == Precision::kBf16 ? rows.to(at::kBFloat16).to(at::kFloat) : rows;
  }

  // Logical tensor `name` (stored plain or quantized) converted into dst, a contiguous fp32 or
  // BF16 tensor of its elements from row `row0` of its [rows, cols] view on (0: all of it; an
  // expert of a stacked tensor otherwise). BF16 rounds each fp32 value to nearest even a block at a
  // time: no fp32 copy of the whole tensor is made.
  void convert_into(const std::string& name, const at::Tensor& dst, int64_t row0 = 0) const {
    auto q = quant_.find(name);
    const int64_t cols = dst.dim() > 0 ? dst.size(dst.dim() - 1) : 1, off = row0 * cols;  // element offset
    if (dst.scalar_type() == at::kFloat) {
      if (q != quant_.end()) {
        decode_into(q->second, dst, row0);
      } else {
        const SafetensorsFile& f = file_of(name);
        float* d = dst.data_ptr<float>();
        at::parallel_for(0, dst.numel(), 1 << 16, [&](int64_t b, int64_t e) { f.read_f32(name, off + b, off + e, d + b); });
      }
      return;
    }
    KVQ_ASSERT(dst.scalar_type() == at::kBFloat16 && dst.is_contiguous());
    c10::BFloat16* d = dst.data_ptr<c10::BFloat16>();
    auto round = [](const std::vector<float>& buf, c10::BFloat16* out) {
      for (size_t i = 0; i < buf.size(); ++i) out[i] = c10::BFloat16(buf[i]);  // nearest even
    };
    if (q != quant_.end()) {
      const QuantWeight& w = q->second;
      const int64_t wc = w.cols(), rows = dst.numel() / wc;
      const int64_t rows_per = std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, wc));
      KVQ_ASSERT(wc == cols && row0 + rows <= w.rows());
      at::parallel_for(0, rows, rows_per, [&](int64_t b, int64_t e) {
        std::vector<float> buf;
        for (int64_t r = b; r < e; r += rows_per) {
          const int64_t re = std::min(e, r + rows_per);
          buf.resize(size_t((re - r) * wc));
          decode_rows(w, row0 + r, row0 + re, buf.data());
          round(buf, d + r * wc);
        }
      });
      return;
    }
    const SafetensorsFile& f = file_of(name);
    const StTensorInfo* info = f.find(name);
    if (info && info->dtype == "BF16") {  // stored BF16: the bytes as shipped, no rounding to do
      KVQ_ASSERT(int64_t(info->end - info->begin) >= (off + dst.numel()) * 2);
      const uint8_t* src = f.raw_bytes(name) + 2 * off;
      at::parallel_for(0, dst.numel(), 1 << 18, [&](int64_t b, int64_t e) {
        std::memcpy(d + b, src + 2 * b, size_t(e - b) * 2);  // little-endian BF16 both sides
      });
      return;
    }
    constexpr int64_t kBlock = int64_t(1) << 14;
    at::parallel_for(0, dst.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      std::vector<float> buf;
      for (int64_t i = b; i < e; i += kBlock) {
        const int64_t ie = std::min(e, i + kBlock);
        buf.resize(size_t(ie - i));
        f.read_f32(name, off + i, off + ie, buf.data());
        round(buf, d + i);
      }
    });
  }

  // Dequantizes rows [row0, row0 + dst's rows) of w's [rows, cols] view into dst, rows in parallel.
  static void decode_into(const QuantWeight& w, const at::Tensor& dst, int64_t row0 = 0) {
    const int64_t cols = w.cols(), rows = dst.numel() / cols;
    KVQ_ASSERT(dst.is_contiguous() && dst.numel() == rows * cols && row0 + rows <= w.rows());
    float* d = dst.data_ptr<float>();
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, cols));
    at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) { decode_rows(w, row0 + b, row0 + e, d + b * cols); });
  }

  // One slot into L: a tensor as it is, or several stacked as row ranges of one (into the slot's
  // tensor when it already has the shape: a reused buffer). Each part's stored pages are mapped in
  // one call before it is converted and handed back to the kernel after.
  void fill(const Slot& s, LayerWeights& L) const {
    at::Tensor& dst = s.dst(L);
    int64_t total = 0;
    for (const WantTensor& p : s.parts) total += p.shape[0];
    std::vector<int64_t> shape = s.parts[0].shape;
    shape[0] = total;
    const at::ScalarType dtype = slot_dtype(s, precision_);
    at::Tensor t = dst.defined() && dst.is_contiguous() && dst.scalar_type() == dtype && dst.sizes() == at::IntArrayRef(shape)
                       ? dst
                       : at::empty(shape, dtype);
    int64_t at_row = 0;
    for (const WantTensor& p : s.parts) {
      at::Tensor rows = t.narrow(0, at_row, p.shape[0]);
      pages(p, true);
      if (p.transposed) {  // stored [in, out]: read as fp32 (exact), transposed into the slot's dtype
        at::Tensor stored = at::empty({p.shape[1], p.shape[0]}, at::kFloat);
        convert_into(p.name, stored, std::max<int64_t>(p.row0, 0));
        rows.copy_(stored.t());
      } else {
        convert_into(p.name, rows, std::max<int64_t>(p.row0, 0));
      }
      pages(p, false);
      at_row += p.shape[0];
    }
    if (s.offset != 0) t.add_(s.offset);
    dst = t;
  }

  // Maps (fault) or hands back the stored pages a part reads: the whole tensors behind it, or for a
  // row range (one expert of a stacked tensor) only those rows' bytes of each (codes and scales
  // alike hold whole rows of its [rows, ...] view), not the layer's other experts'.
  void pages(const WantTensor& p, bool fault) const {
    for (const std::string& n : stored_names(p.name)) {
      const SafetensorsFile& f = file_of(n);
      if (p.row0 < 0) {
        fault ? f.prefault(n) : f.drop(n);
        continue;
      }
      const uint64_t per_row = f.stored_bytes(n) / uint64_t(whole_rows(p));
      const uint64_t begin = uint64_t(p.row0) * per_row, len = uint64_t(part_rows(p)) * per_row;
      fault ? f.prefault(n, begin, len) : f.drop(n, begin, len);
    }
  }
  // A row-range part: the rows of its stacked tensor's [rows, ...] view, and how many it reads.
  static int64_t whole_rows(const WantTensor& p) {
    int64_t r = 1;
    for (size_t i = 0; i + 1 < p.whole.size(); ++i) r *= p.whole[i];
    return r;
  }
  static int64_t part_rows(const WantTensor& p) { return p.transposed ? p.shape[1] : p.shape[0]; }

  // The stored tensors behind logical tensor `name` (a quantized weight: codes, scales, shape).
  std::vector<std::string> stored_names(const std::string& name) const {
    auto q = quant_.find(name);
    return q == quant_.end() ? std::vector<std::string>{name} : q->second.stored_tensors();
  }
  void drop_stored(const std::string& name) const {
    for (const std::string& n : stored_names(name)) file_of(n).drop(n);
  }
  // Stored bytes a part reads (a row range: its share of each stored tensor).
  int64_t stored(const WantTensor& p) const {
    int64_t b = 0;
    for (const std::string& n : stored_names(p.name)) {
      const int64_t bytes = int64_t(file_of(n).stored_bytes(n));
      b += p.row0 < 0 ? bytes : bytes / whole_rows(p) * part_rows(p);
    }
    return b;
  }

  ModelConfig c_;
  const Family& family_;
  GlobalNames names_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
  TensorIndex t_;
  QuantConfig qc_;
  TensorLookup lookup_;
  std::map<std::string, QuantWeight> quant_;  // the weights stored quantized, by logical name
  bool lazy_experts_ = false;
  Precision precision_ = Precision::kFp32;
};

}  // namespace

void load_hf(const std::string& dir, ModelConfig* cfg, ModelWeights* w, std::string* config_sha256, bool stream,
             Precision precision) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) throw Error(dir, "config.json", "missing");
  *cfg = parse_hf_config(config_path);
  *config_sha256 = sha256_file(config_path);
  const ModelConfig& c = *cfg;
  auto ckpt = std::make_shared<HfCheckpoint>(dir, config_path, c, *find_family(c.architecture), precision);
  w->final_norm = ckpt->load(ckpt->names().final_norm, {c.hidden_size});
  if (ckpt->names().final_norm_offset != 0) w->final_norm.add_(ckpt->names().final_norm_offset);
  if (c.attn_sinks)  // small ([H] a layer), kept apart so that a streamed model knows them before a forward
    for (int l = 0; l < c.n_layers; ++l) w->sinks.push_back(ckpt->sinks(c.decoder_index(l)));
  if (stream) {
    ckpt->set_lazy_experts(true);
    w->source = ckpt;
    return;
  }
  // Whole model: every layer converted, each layer's stored pages dropped once it is (the peak is
  // the fp32 model plus one layer's stored bytes, not the fp32 model plus the whole checkpoint).
  w->embed = ckpt->load_gemm(ckpt->names().embed, {c.vocab_size, c.hidden_size});
  ckpt->drop(ckpt->names().embed);
  w->layers.resize(size_t(c.decoder_layers()));
  for (int l = 0; l < c.decoder_layers(); ++l) {
    ckpt->build(l, &w->layers[size_t(l)]);
    ckpt->release(l);
  }
  w->lm_head = c.tie_word_embeddings ? w->embed : ckpt->lm_head();
}

}  // namespace kvq::detail
