#pragma once
// The pre-norm decoder layer every family kvq opens computes today (x += attention(norm(x));
// x += mlp(norm(x))), with the pieces a config switches on: q/k/v biases, per-head q/k norms, MLA's
// absorbed projection, sandwich norms, dense or MoE MLP. A family whose layer differs brings its
// own function of this signature (Family::layer). Internal to kvq_model.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "forward_kernels.hpp"
#include "kvq/model/config.hpp"
#include "kvq/model/model.hpp"
#include "weights.hpp"

namespace kvq::detail {

// One batch's state through the layers: positions, RoPE table and the residual stream x [N, D].
struct Pass {
  int64_t B = 0, T = 0;
  std::vector<int64_t> positions;
  RopeTable rope;
  RopeTable rope_local;  // Gemma 3's local (sliding) layers' RoPE (ModelConfig::rope_local_theta)
  at::Tensor x;
  const RopeTable& rope_of(const ModelConfig& c, int layer) const { return c.local_rope(layer) ? rope_local : rope; }
};

// Layer l of the model on one batch: reads and updates p.x, calls opts' observer and K/V hooks.
using LayerFn = void (*)(const ModelConfig& c, const LayerWeights& L, int l, Workspace& ws, Pass& p,
                         const Model::ForwardOptions& opts);

void decoder_layer(const ModelConfig& c, const LayerWeights& L, int l, Workspace& ws, Pass& p,
                   const Model::ForwardOptions& opts);
// Its two halves: x += attention(norm(x)) of decoder layer l (KV layer c.kv_index(l): what the
// observer and the hooks are told, whose window and RoPE it uses), and x += mlp(norm(x)).
void attention_block(const ModelConfig& c, const LayerWeights& L, int l, Workspace& ws, Pass& p,
                     const Model::ForwardOptions& opts);
void mlp_block(const ModelConfig& c, const LayerWeights& L, Workspace& ws, Pass& p);

}  // namespace kvq::detail
