#pragma once
// How a checkpoint's tensors become a layer's fp32 weights: a family names its tensors, the shared
// plans here say which LayerWeights tensor each fills and with what shape. One plan serves the
// checks before anything is converted, the conversion (whole-model and streamed), the pages dropped
// after a layer, the stored and the fp32 bytes. Internal to kvq_model.
#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvq/model/config.hpp"
#include "safetensors.hpp"
#include "weights.hpp"

namespace kvq::detail {

// A checkpoint tensor with the shape the config implies.
struct WantTensor {
  WantTensor() = default;
  WantTensor(std::string n, std::vector<int64_t> s) : name(std::move(n)), shape(std::move(s)) {}
  WantTensor(std::string n, std::vector<int64_t> s, int64_t r0, std::vector<int64_t> w, bool t = false)
      : name(std::move(n)), shape(std::move(s)), row0(r0), whole(std::move(w)), transposed(t) {}
  std::string name;
  std::vector<int64_t> shape;
  // row0 >= 0: rows [row0, row0 + shape[0]) of logical tensor `name` viewed as [rows, cols] (cols
  // its last dim), whose own shape is `whole` (one expert of gpt-oss's stacked [E, out, in]).
  int64_t row0 = -1;
  std::vector<int64_t> whole;
  // The rows are stored transposed: [in, out] (shape[1] rows from row0 of whole's [rows, out] view),
  // the slot holds [out, in] (a dequantized gpt-oss checkpoint's experts, [E, in, out]).
  bool transposed = false;
  const std::vector<int64_t>& stored_shape() const { return row0 >= 0 ? whole : shape; }
};

// One LayerWeights tensor and the checkpoint tensors it is made of, in check order: one part loads
// as it is; several stack as row ranges of one tensor (1-D parts concatenate).
struct Slot {
  std::function<at::Tensor&(LayerWeights&)> dst;
  std::vector<WantTensor> parts;
  int expert = -1;  // a routed expert's slot (its number): a streamed layer converts it when routed to
  float offset = 0;  // added to every element once converted (Gemma's norms: x · (1 + w) as x · w')
};
using LayerPlan = std::vector<Slot>;

// Where each tensor of an opened checkpoint lives (one file, or the shard the index names).
struct TensorIndex {
  std::map<std::string, const SafetensorsFile*> owner;
  std::string source;  // the file named when a tensor is absent (model.safetensors or the index)
  // Logical weights stored under other names (X.weight as X.weight_packed, INT4; P as P_blocks,
  // MXFP4): present, read through parts/quant.hpp.
  std::set<std::string> packed;

  bool has(const std::string& name) const { return owner.count(name) != 0 || packed.count(name) != 0; }
  // The file holding `name`; throws kvq::Error naming the source when it is absent.
  const SafetensorsFile& file_of(const std::string& name) const;
};

struct GlobalNames {
  std::string embed, final_norm, lm_head;
  float final_norm_offset = 0;  // added to the final norm's weight (Gemma: 1 + w)
};
// model.embed_tokens.weight, model.norm.weight, lm_head.weight.
GlobalNames llama_global_names();

struct ExpertNames {
  std::string gate, up, down;
};

// The tensor names of the common pre-norm decoder layer; a family fills the ones its layout has.
// Fused tensors hold their parts as row ranges: qkv = [Q; K; V], gate_up = [gate; up].
struct LayerNames {
  std::string attn_norm, ffn_norm;
  std::string qkv;         // fused [Q; K; V] weight, or empty: q, k, v below
  std::string qkv_bias;    // the fused bias (qkv set and c.qkv_bias)
  std::string q, k, v;     // split projections without ".weight" (their biases are ".bias")
  std::string o, o_bias;
  std::string q_norm, k_norm;                 // c.qk_norm
  std::string post_attn_norm, post_mlp_norm;  // c.sandwich_norm
  std::string gate_up;                        // fused [gate; up], or empty: gate, up below
  std::string gate, up, down;
  // MoE layers: the router, expert e's projections, and the shared experts' (c.n_shared_experts).
  std::string router;
  std::string router_bias;  // DeepSeek-V3's e_score_correction_bias [E], or empty (softmax routers)
  std::function<ExpertNames(int expert)> expert;
  ExpertNames shared;
};

// model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight (Qwen3-MoE, DeepSeekMoE).
ExpertNames llama_expert_names(int l, int e);

// Llama's names for layer l: model.layers.{l}.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj, self_attn.{q,k}_norm, mlp.gate,
// mlp.experts.{e}.*, mlp.shared_experts.*}.
LayerNames llama_layer_names(int l);

// The pre-norm decoder layer in check order: attn_norm; the attention (`attention` when given, else
// q/k/v or fused qkv with their biases and o); o's bias, q/k norms and sandwich norms as the config
// states; ffn_norm; the MLP (dense SwiGLU, or router + experts + shared experts on MoE layers).
LayerPlan decoder_plan(const ModelConfig& c, int l, const LayerNames& n, const LayerPlan* attention = nullptr);

// The checkpoint tensors a plan reads, in check order.
std::vector<WantTensor> plan_tensors(const LayerPlan& plan);
// Whether a slot is a GEMM weight (2-D, not the router or MLA's kv_b, which the forward multiplies
// in fp32): BF16 in Precision::kBf16.
bool slot_is_gemm_weight(const Slot& s);
// The dtype a slot is converted to in precision p.
at::ScalarType slot_dtype(const Slot& s, Precision p);
// Bytes of the LayerWeights a plan fills in precision p.
int64_t plan_bytes(const LayerPlan& plan, Precision p);

// config.json's expert count (key `key`) against the tensors present: an expert numbered past the
// count, or one missing, is a config/weights mismatch named as such.
void check_expert_count(const ModelConfig& c, const std::string& config_path, const TensorIndex& t,
                        const std::string& key, const std::function<ExpertNames(int layer, int expert)>& names);

}  // namespace kvq::detail

namespace kvq::detail {

// The Llama layout as a family's hooks: llama_global_names(), and decoder_plan over
// llama_layer_names(l).
GlobalNames llama_globals(const ModelConfig& c, const TensorIndex& t);
LayerPlan llama_plan(const ModelConfig& c, int l, const TensorIndex& t);

}  // namespace kvq::detail
