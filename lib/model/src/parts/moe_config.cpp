#include "moe_config.hpp"

namespace kvq::detail {

void read_group_limits(const ConfigReader& r, int n_group_default, int topk_group_default, ModelConfig* c) {
  const std::string& path = r.path();
  c->n_group = n_group_default > 0 ? r.positive_int("n_group", n_group_default) : r.positive_int("n_group");
  c->topk_group = topk_group_default > 0 ? r.positive_int("topk_group", topk_group_default) : r.positive_int("topk_group");
  if (c->n_experts % c->n_group != 0)
    throw Error(path, "n_group", std::to_string(c->n_group) + " does not divide n_routed_experts " +
                                     std::to_string(c->n_experts));
  if (c->topk_group > c->n_group)
    throw Error(path, "topk_group", std::to_string(c->topk_group) + " is above n_group " + std::to_string(c->n_group));
  if (c->n_experts_per_tok > c->topk_group * (c->n_experts / c->n_group))
    throw Error(path, "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above the " +
                                                 std::to_string(c->topk_group * (c->n_experts / c->n_group)) +
                                                 " experts of topk_group groups");
}

void read_dense_layers(const ConfigReader& r, int first_dense_default, bool freq, ModelConfig* c) {
  const std::string& path = r.path();
  int first_dense = first_dense_default;
  if (r.has("first_k_dense_replace")) {
    const json& v = r.raw("first_k_dense_replace");
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30))
      throw Error(path, "first_k_dense_replace", "expected a layer count, found " + v.dump());
    first_dense = int(v.get<int64_t>());
  }
  const int every = freq ? r.positive_int("moe_layer_freq", 1) : 1;
  c->layer_moe.assign(size_t(c->n_layers), 0);
  for (int l = 0; l < c->n_layers; ++l) c->layer_moe[size_t(l)] = l >= first_dense && l % every == 0;
}

}  // namespace kvq::detail
