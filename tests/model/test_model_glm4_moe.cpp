// GLM-4.5 / 4.6 / 4.7 (glm4_moe): a tiny BF16 checkpoint written here in the HF layout (sharded,
// with an MTP layer at model.layers.{num_hidden_layers} that must never be read), kvq's forward
// against hf_reference.hpp's float64 forward written from transformers' modeling_glm4_moe.py:
// head_dim from the config, partial rotary 0.5 in split-half pairs over the first half of each
// head, q/k/v biases without an o_proj bias, per-head q/k RMSNorm (use_qk_norm), a dense first
// layer, then the sigmoid noaux_tc router with e_score_correction_bias (used to select only),
// renormalised x routed_scaling_factor, plus a shared expert. Tolerance as the other families:
// max |logit - reference| <= 1e-4 · max |reference logit|. Negative controls (each must miss by
// > 1e-2): adjacent pairs, full rotary, q/k norm skipped, selection by the unbiased score, a
// group scored by its best expert instead of its top-2 sum, routed_scaling_factor ignored, and the
// MTP layer run as a decoder layer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "bf16_bound.hpp"
#include "family_test_util.hpp"
#include "hf_reference.hpp"
#include "hf_tiny.hpp"
#include "kvq/model/model.hpp"
#include "model_test_util.hpp"

namespace kvq {
namespace {

namespace hf = test::hf;
namespace ref = test::ref;
using test::argmax_rows;
using test::kvq_logits;
using test::seeded_ids;
using nlohmann::json;

constexpr double kTol = 1e-4;
constexpr double kControl = 1e-2;

struct Shape {
  int D = 32, layers = 4, H = 4, Hk = 2, hd = 16, I = 48, E = 8, K = 2, Ie = 12, V = 64;
  int n_group = 1, topk_group = 1, first_dense = 1;
  double rsf = 2.5;
};

json config_of(const Shape& s) {
  return {{"architectures", {"Glm4MoeForCausalLM"}},
          {"model_type", "glm4_moe"},
          {"hidden_size", s.D},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.H},
          {"num_key_value_heads", s.Hk},
          {"head_dim", s.hd},  // != hidden / heads = 8: must come from the config
          {"partial_rotary_factor", 0.5},
          {"intermediate_size", s.I},
          {"moe_intermediate_size", s.Ie},
          {"n_routed_experts", s.E},
          {"n_shared_experts", 1},
          {"num_experts_per_tok", s.K},
          {"n_group", s.n_group},
          {"topk_group", s.topk_group},
          {"first_k_dense_replace", s.first_dense},
          {"routed_scaling_factor", s.rsf},
          {"norm_topk_prob", true},
          {"use_qk_norm", true},
          {"attention_bias", true},
          {"num_nextn_predict_layers", 1},
          {"vocab_size", s.V},
          {"max_position_embeddings", 256},
          {"rope_theta", 1e6},
          {"rms_norm_eps", 1e-5},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"}};
}

// Seeded BF16 weights of every layer (and the MTP layer's block and extras), plus the reference.
struct Checkpoint {
  hf::TensorMap w;
  ref::Model m;
  ref::Layer mtp;  // the MTP block as a decoder layer (negative control only)
};

Checkpoint make(const Shape& s, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  Checkpoint ck;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, double scale, double offset = 0.0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    hf::Tensor t;
    t.shape = std::move(shape);
    t.v.resize(size_t(n));
    for (auto& x : t.v) x = hf::bf16_round(offset + scale * g(rng));
    ck.w[name] = t;
    return t.v;
  };
  const int64_t D = s.D, qd = int64_t(s.H) * s.hd, kvd = int64_t(s.Hk) * s.hd;
  auto layer = [&](int l) {
    ref::Layer L;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    L.attn_norm = add(p + "input_layernorm.weight", {D}, 0.1, 1.0);
    L.ffn_norm = add(p + "post_attention_layernorm.weight", {D}, 0.1, 1.0);
    L.wq = add(p + "self_attn.q_proj.weight", {qd, D}, 0.2);
    L.wk = add(p + "self_attn.k_proj.weight", {kvd, D}, 0.2);
    L.wv = add(p + "self_attn.v_proj.weight", {kvd, D}, 0.2);
    L.bq = add(p + "self_attn.q_proj.bias", {qd}, 0.2);
    L.bk = add(p + "self_attn.k_proj.bias", {kvd}, 0.2);
    L.bv = add(p + "self_attn.v_proj.bias", {kvd}, 0.2);
    L.wo = add(p + "self_attn.o_proj.weight", {D, qd}, 0.2);
    L.q_norm = add(p + "self_attn.q_norm.weight", {s.hd}, 0.5, 1.0);
    L.k_norm = add(p + "self_attn.k_norm.weight", {s.hd}, 0.5, 1.0);
    if (l < s.first_dense) {
      L.w_gate = add(p + "mlp.gate_proj.weight", {s.I, D}, 0.2);
      L.w_up = add(p + "mlp.up_proj.weight", {s.I, D}, 0.2);
      L.w_down = add(p + "mlp.down_proj.weight", {D, s.I}, 0.2);
      return L;
    }
    L.router = add(p + "mlp.gate.weight", {s.E, D}, 0.3);
    L.router_bias = add(p + "mlp.gate.e_score_correction_bias", {s.E}, 0.3);
    for (int e = 0; e < s.E; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      ref::Expert ex;
      ex.gate = add(x + "gate_proj.weight", {s.Ie, D}, 0.2);
      ex.up = add(x + "up_proj.weight", {s.Ie, D}, 0.2);
      ex.down = add(x + "down_proj.weight", {D, s.Ie}, 0.2);
      L.experts.push_back(ex);
    }
    L.shared.gate = add(p + "mlp.shared_experts.gate_proj.weight", {s.Ie, D}, 0.2);
    L.shared.up = add(p + "mlp.shared_experts.up_proj.weight", {s.Ie, D}, 0.2);
    L.shared.down = add(p + "mlp.shared_experts.down_proj.weight", {D, s.Ie}, 0.2);
    return L;
  };
  ck.m.D = s.D;
  ck.m.H = s.H;
  ck.m.Hk = s.Hk;
  ck.m.hd = s.hd;
  ck.m.V = s.V;
  ck.m.eps = 1e-5;
  ck.m.inv_freq = ref::default_inv_freq(1e6, s.hd / 2);  // the first half of the head, split-half
  ck.m.top_k = s.K;
  ck.m.norm_topk_prob = true;
  ck.m.sigmoid_router = true;
  ck.m.n_group = s.n_group;
  ck.m.topk_group = s.topk_group;
  ck.m.routed_scaling_factor = s.rsf;
  ck.m.embed = add("model.embed_tokens.weight", {s.V, D}, 1.0);
  for (int l = 0; l < s.layers; ++l) ck.m.layers.push_back(layer(l));
  ck.m.final_norm = add("model.norm.weight", {D}, 0.1, 1.0);
  ck.m.lm_head = add("lm_head.weight", {s.V, D}, 0.2);
  // The MTP module: a full block at index num_hidden_layers plus its own projections and norms.
  ck.mtp = layer(s.layers);
  const std::string mp = "model.layers." + std::to_string(s.layers) + ".";
  add(mp + "eh_proj.weight", {D, 2 * D}, 0.2);
  add(mp + "enorm.weight", {D}, 0.1, 1.0);
  add(mp + "hnorm.weight", {D}, 0.1, 1.0);
  add(mp + "shared_head.norm.weight", {D}, 0.1, 1.0);
  return ck;
}

struct Fixture {
  Shape s;
  Checkpoint ck;
  test::TempDir dir;
  Model model;
  Fixture(const Shape& shape, uint32_t seed, bool stream = false, Precision p = Precision::kFp32)
      : s(shape), ck(make(shape, seed)), model(load(stream, p)) {}
  Model load(bool stream, Precision p) {
    hf::write_model(dir.str(), config_of(s), ck.w, 3);
    Model::LoadOptions lo;
    lo.stream = stream;
    lo.precision = p;
    return Model::load(dir.str(), lo);
  }
  double compare(const std::vector<int>& ids) const { return test::compare_to_reference(model, ck.m, ids, s.V); }
  double control(const std::vector<int>& ids, const ref::Options& off) const { return test::control(ck.m, ids, off); }
  double control(const std::vector<int>& ids, const ref::Model& other) const { return test::control(ck.m, ids, other); }
};

TEST(Glm4Moe, ConfigFields) {
  Fixture f(Shape{}, 1);
  const ModelConfig& c = f.model.config();
  EXPECT_EQ(c.architecture, "glm4_moe");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_EQ(c.pairing, RopePairing::kSplitHalf);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.layer_moe, (std::vector<uint8_t>{0, 1, 1, 1}));
}

TEST(Glm4Moe, ForwardMatchesReference) {
  for (const int n_group : {1, 2}) {
    Shape s;
    s.n_group = n_group;
    Fixture f(s, 7 + uint32_t(n_group));
    const auto ids = seeded_ids(24, s.V, 11);
    const double d = f.compare(ids);
    std::cout << "[ info ] glm4_moe n_group=" << n_group << " max rel diff " << d << "\n";
    EXPECT_LT(d, kTol);
    ref::Options off;
    off.flip_pairing = true;
    EXPECT_GT(f.control(ids, off), kControl) << "adjacent pairs must differ from split-half";
    off = {};
    off.skip_qk_norm = true;
    EXPECT_GT(f.control(ids, off), kControl) << "q/k norm must matter";
    off = {};
    off.select_unbiased = true;
    EXPECT_GT(f.control(ids, off), kControl) << "the correction bias must steer the selection";
    off = {};
    off.ignore_scaling_factor = true;
    EXPECT_GT(f.control(ids, off), kControl) << "routed_scaling_factor must matter";
    if (n_group > 1) {
      off = {};
      off.group_by_max = true;
      EXPECT_GT(f.control(ids, off), kControl) << "groups are scored by their top-2 sum";
    }
    ref::Model full = f.ck.m;
    full.inv_freq = ref::default_inv_freq(1e6, s.hd);
    EXPECT_GT(f.control(ids, full), kControl) << "full rotary must differ from partial";
    ref::Model with_mtp = f.ck.m;
    with_mtp.layers.push_back(f.ck.mtp);
    EXPECT_GT(f.control(ids, with_mtp), kControl) << "running the MTP layer must differ";
  }
}

TEST(Glm4Moe, StreamedEqualsWholeAndGreedyMatches) {
  Shape s;
  Fixture whole(s, 3), streamed(s, 3, true);
  const auto ids = seeded_ids(20, s.V, 5);
  EXPECT_TRUE(at::equal(at::tensor(kvq_logits(whole.model, ids)), at::tensor(kvq_logits(streamed.model, ids))));
  std::vector<int> a = seeded_ids(5, s.V, 9), b = a;
  for (int step = 0; step < 6; ++step) {
    const ref::Vec k = kvq_logits(whole.model, a), r = ref::forward(whole.ck.m, b);
    a.push_back(int(argmax_rows(k, s.V).back()));
    b.push_back(int(argmax_rows(r, s.V).back()));
  }
  EXPECT_EQ(a, b);
}

TEST(Glm4Moe, BadConfigsRefusedInOneLine) {
  Shape s;
  const Checkpoint ck = make(s, 1);
  struct Case {
    json patch;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {{{"num_experts_per_tok", 9}}, {"config.json", "num_experts_per_tok", "9 is above n_routed_experts 8"}},
      {{{"n_group", 3}}, {"config.json", "n_group", "does not divide n_routed_experts"}},
      {{{"n_routed_experts", 6}}, {"config.json", "n_routed_experts", "is 6 but the weights have tensor"}},
      {{{"head_dim", 8}}, {"q_proj.weight", "shape"}},
  };
  for (const Case& c : cases) {
    test::TempDir dir;
    json cfg = config_of(s);
    cfg.update(c.patch);
    hf::write_model(dir.str(), cfg, ck.w, 2);
    test::expect_error([&] { Model::load(dir.str()); }, c.parts);
  }
}


// ---------------------------------------------------------------- BF16 forward (issue 37)

// GLM-4.5 in BF16: equal to the BF16-emulated float64 reference (bf16_bound.hpp); its plain
// difference is printed, not bounded (its sigmoid router picks other experts under BF16-sized
// changes); greedy ids equal; streamed = whole, bit for bit.
TEST(Bf16Forward, Glm4MoeMatchesTheEmulatedReference) {
  Shape s;
  Fixture f(s, 3, false, Precision::kBf16), streamed(s, 3, true, Precision::kBf16);
  double plain = 0;
  std::vector<double> emulated;
  for (uint32_t seed : {11u, 12u}) {
    const auto ids = seeded_ids(24, s.V, seed);
    plain = std::max(plain, ref::rel_max_diff(kvq_logits(f.model, ids), ref::forward(f.ck.m, ids)));
  }
  for (uint32_t seed = 100; seed < 106; ++seed) {  // the emulated check on six short prompts
    const auto ids = seeded_ids(12, s.V, seed);
    const ref::Vec got = kvq_logits(f.model, ids);
    ref::Bf16Emulation on;
    emulated.push_back(ref::rel_max_diff(got, ref::forward(f.ck.m, ids)));
  }
  std::cout << "[ info ] glm4_moe BF16 vs the plain reference " << plain << " (not bounded: sigmoid router)\n";
  test::expect_meets_emulated(emulated, "glm4_moe");
  EXPECT_GT(plain, test::kBf16Floor);
  const auto ids = seeded_ids(20, s.V, 5);
  EXPECT_TRUE(at::equal(at::tensor(kvq_logits(f.model, ids)), at::tensor(kvq_logits(streamed.model, ids))));
  std::vector<int> a = seeded_ids(5, s.V, 9), b = a;
  for (int step = 0; step < 6; ++step) {
    a.push_back(int(argmax_rows(kvq_logits(f.model, a), s.V).back()));
    b.push_back(int(argmax_rows(ref::forward(f.ck.m, b), s.V).back()));
  }
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace kvq
