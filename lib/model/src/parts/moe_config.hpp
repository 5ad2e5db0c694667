#pragma once
// DeepSeekMoE's config keys, shared by the families that route this way (DeepSeek-V2/V3, Kimi-K2,
// GLM-4.5): the expert groups and the dense first layers. Internal to kvq_model.
#include "config_reader.hpp"

namespace kvq::detail {

// n_group and topk_group (0 as a default: the key is required), checked against n_routed_experts
// and num_experts_per_tok (c->n_experts and c->n_experts_per_tok set).
void read_group_limits(const ConfigReader& r, int n_group_default, int topk_group_default, ModelConfig* c);

// c->layer_moe: layer l is MoE iff l >= first_k_dense_replace (default first_dense_default) and,
// with `freq`, l % moe_layer_freq == 0 (default 1).
void read_dense_layers(const ConfigReader& r, int first_dense_default, bool freq, ModelConfig* c);

}  // namespace kvq::detail
