// GLM-4-9B in its three checkpoint forms: chatglm (ChatGLM's own keys and names, fused
// query_key_value with bias, fused dense_h_to_4h, base 10000 · rope_ratio over kv_channels / 2
// dims), glm (Llama names, split q/k/v + bias, fused gate_up_proj, partial_rotary_factor) and glm4
// (glm plus the sandwich norms). Tiny BF16 checkpoints written here (sharded), kvq's forward
// against the double-precision reference of hf_reference.hpp (from_glm: the fused tensors split
// by the formulas of ../shared/MODEL-FAMILIES.md, adjacent-pair RoPE over the first rotary dims).
// Tolerance as in test_architectures: max |logit - reference| <= 1e-4 · max |reference logit|.
// Negative controls: the reference with split-half pairs, with rope_ratio ignored, without the
// sandwich norms must miss kvq's logits by far more than the tolerance.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bf16_bound.hpp"
#include "hf_reference.hpp"
#include "hf_tiny.hpp"
#include "kvq/model/model.hpp"
#include "kvq/util/error.hpp"
#include "model_test_util.hpp"

namespace kvq {
namespace {

namespace hf = test::hf;
namespace ref = test::ref;

constexpr double kTol = 1e-4;
constexpr double kControl = 1e-2;

std::vector<int> seeded_ids(int T, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> ids(static_cast<size_t>(T));
  for (int& x : ids) x = int(rng() % uint32_t(vocab));
  return ids;
}

at::Tensor to_tensor(const std::vector<int>& ids) {
  std::vector<int64_t> v(ids.begin(), ids.end());
  return at::tensor(v, at::kLong).view({1, int64_t(v.size())});
}

ref::Vec logits_of(const Model& m, const std::vector<int>& ids) {
  at::Tensor r = m.forward(to_tensor(ids))[0].to(at::kDouble).contiguous();
  return ref::Vec(r.data_ptr<double>(), r.data_ptr<double>() + r.numel());
}

std::vector<int64_t> argmax_rows(const ref::Vec& logits, int V) {
  std::vector<int64_t> out;
  for (size_t t = 0; t * size_t(V) < logits.size(); ++t) {
    auto b = logits.begin() + ptrdiff_t(t * size_t(V));
    out.push_back(std::max_element(b, b + V) - b);
  }
  return out;
}

// GLM-4-9B's proportions, tiny: 8 query heads over 2 KV heads, head_dim 16 of which the first 8
// rotate (4 RoPE blocks, 8 static dims), q/k/v bias; eps as in the 9B configs.
hf::Spec glm_spec(const std::string& family) {
  hf::Spec s;
  s.family = family;
  s.hidden = 32;
  s.layers = 3;
  s.heads = 8;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.inter = 40;
  s.vocab = 64;
  s.eps = 1.5625e-7;
  s.theta = 10000.0;
  s.rope_ratio = 500.0;  // glm-4-9b-chat's
  s.partial_rotary_factor = 0.5;
  s.seed = family == "chatglm" ? 21 : family == "glm" ? 22 : 23;
  if (family != "chatglm") s.theta = 5e6;  // a base far from 10000, so that ignoring it shows
  return s;
}

struct Fixture {
  hf::Spec spec;
  hf::TensorMap weights;
  ref::Model ref;
  test::TempDir dir;
  Model model;

  explicit Fixture(const hf::Spec& s, bool stream = false, Precision p = Precision::kFp32)
      : spec(s), weights(hf::make_weights(s)), ref(ref::from_hf(s, weights)), model(load(s, weights, dir, stream, p)) {}

  static Model load(const hf::Spec& s, const hf::TensorMap& w, const test::TempDir& dir, bool stream, Precision p) {
    hf::write_model(dir.str(), hf::make_config(s), w, 3);
    Model::LoadOptions lo;
    lo.stream = stream;
    lo.precision = p;
    return Model::load(dir.str(), lo);
  }

  // kvq vs the reference `r` (with options o) on a seeded window: max relative difference.
  double diff(const ref::Model& r, const ref::Options& o = {}, const char* what = "", int T = 24, uint32_t seed = 11) const {
    const auto ids = seeded_ids(T, spec.vocab, seed);
    const ref::Vec got = logits_of(model, ids), want = ref::forward(r, ids, o);
    const double d = ref::rel_max_diff(got, want);
    if (*what) std::cout << "[ info ] " << spec.family << " control '" << what << "': max rel diff " << d << "\n";
    return d;
  }

  void expect_matches_reference() const {
    for (uint32_t seed : {11u, 12u}) {
      const auto ids = seeded_ids(24, spec.vocab, seed);
      const ref::Vec got = logits_of(model, ids), want = ref::forward(ref, ids);
      const double d = ref::rel_max_diff(got, want);
      std::cout << "[ info ] " << spec.family << " max rel diff " << d << "\n";
      EXPECT_LT(d, kTol) << "seed " << seed;
      EXPECT_EQ(argmax_rows(got, spec.vocab), argmax_rows(want, spec.vocab)) << "seed " << seed;
    }
  }

  void expect_same_greedy(int prompt_len, int steps) const {
    std::vector<int> a = seeded_ids(prompt_len, spec.vocab, 5), b = a;
    for (int s = 0; s < steps; ++s) {
      const at::Tensor l = model.forward(to_tensor(a));
      a.push_back(int(l[0][int64_t(a.size()) - 1].argmax().item<int64_t>()));
      const ref::Vec r = ref::forward(ref, b);
      const auto last = r.begin() + ptrdiff_t((b.size() - 1) * size_t(spec.vocab));
      b.push_back(int(std::max_element(last, last + spec.vocab) - last));
    }
    EXPECT_EQ(a, b);
  }
};

TEST(Glm, ConfigOfEachForm) {
  {
    Fixture f(glm_spec("chatglm"));
    const ModelConfig& c = f.model.config();
    EXPECT_EQ(c.architecture, "chatglm");
    EXPECT_EQ(c.n_layers, 3);
    EXPECT_EQ(c.n_heads, 8);
    EXPECT_EQ(c.n_kv_heads, 2);  // multi_query_group_num
    EXPECT_EQ(c.head_dim, 16);   // kv_channels
    EXPECT_EQ(c.intermediate_size, 40);  // ffn_hidden_size
    EXPECT_EQ(c.vocab_size, 64);         // padded_vocab_size
    EXPECT_EQ(c.rotary_dim, 8);          // kv_channels / 2
    EXPECT_EQ(c.pairing, RopePairing::kInterleaved);
    EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0 * 500.0);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1.5625e-7);  // layernorm_epsilon
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_FALSE(c.o_bias);
    EXPECT_FALSE(c.sandwich_norm);
    EXPECT_EQ(c.bos_id, -1);
  }
  for (const char* fam : {"glm", "glm4"}) {
    SCOPED_TRACE(fam);
    Fixture f(glm_spec(fam));
    const ModelConfig& c = f.model.config();
    EXPECT_EQ(c.architecture, fam);
    EXPECT_EQ(c.rotary_dim, 8);  // head_dim · partial_rotary_factor
    EXPECT_EQ(c.pairing, RopePairing::kInterleaved);
    EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_FALSE(c.o_bias);
    EXPECT_EQ(c.sandwich_norm, std::string(fam) == "glm4");
  }
}

TEST(Glm, PartialRotaryFactorDefaultsToHalf) {
  hf::Spec s = glm_spec("glm");
  nlohmann::json c = hf::make_config(s);
  c.erase("partial_rotary_factor");
  test::TempDir dir;
  hf::write_model(dir.str(), c, hf::make_weights(s));
  EXPECT_EQ(Model::load(dir.str()).config().rotary_dim, 8);
}

// transformers 5 writes rope_theta and partial_rotary_factor inside rope_parameters.
TEST(Glm, RopeParametersOfTransformers5) {
  hf::Spec s = glm_spec("glm4");
  nlohmann::json c = hf::make_config(s);
  c.erase("partial_rotary_factor");
  c.erase("rope_theta");
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 2e5}, {"partial_rotary_factor", 0.25}};
  test::TempDir dir;
  hf::write_model(dir.str(), c, hf::make_weights(s));
  const ModelConfig cfg = Model::load(dir.str()).config();
  EXPECT_EQ(cfg.rotary_dim, 4);
  EXPECT_DOUBLE_EQ(cfg.rope_theta, 2e5);
  c["rope_parameters"]["partial_rotary_factor"] = "half";
  hf::write_model(dir.str(), c, hf::make_weights(s));
  test::expect_error([&] { Model::load(dir.str()); }, {"config.json", "rope_parameters.partial_rotary_factor", "\"half\""});
}

TEST(Glm, ChatglmMatchesReference) {
  Fixture f(glm_spec("chatglm"));
  f.expect_matches_reference();
  f.expect_same_greedy(6, 6);
  ref::Options split;
  split.flip_pairing = true;
  EXPECT_GT(f.diff(f.ref, split, "split-half pairs"), kControl) << "split-half instead of adjacent pairs must fail";
  ref::Model no_ratio = f.ref;
  no_ratio.inv_freq = ref::default_inv_freq(10000.0, 8);
  EXPECT_GT(f.diff(no_ratio, {}, "rope_ratio ignored"), kControl) << "rope_ratio ignored must fail";
  ref::Model full_rotary = f.ref;
  full_rotary.inv_freq = ref::default_inv_freq(10000.0 * 500.0, 16);
  EXPECT_GT(f.diff(full_rotary, {}, "all dims rotating"), kControl) << "all 16 dims rotating must fail";
}

TEST(Glm, GlmMatchesReference) {
  Fixture f(glm_spec("glm"));
  f.expect_matches_reference();
  f.expect_same_greedy(6, 6);
  ref::Options split;
  split.flip_pairing = true;
  EXPECT_GT(f.diff(f.ref, split, "split-half pairs"), kControl) << "split-half instead of adjacent pairs must fail";
  ref::Model base = f.ref;
  base.inv_freq = ref::default_inv_freq(10000.0, 8);
  EXPECT_GT(f.diff(base, {}, "rope_theta ignored"), kControl) << "rope_theta ignored must fail";
}

TEST(Glm, Glm4SandwichNormsMatchReference) {
  Fixture f(glm_spec("glm4"));
  f.expect_matches_reference();
  f.expect_same_greedy(6, 6);
  ref::Options split;
  split.flip_pairing = true;
  EXPECT_GT(f.diff(f.ref, split, "split-half pairs"), kControl) << "split-half instead of adjacent pairs must fail";
  ref::Options no_sandwich;
  no_sandwich.skip_sandwich_norm = true;
  EXPECT_GT(f.diff(f.ref, no_sandwich, "no sandwich norms"), kControl) << "the sandwich norms must matter";
}

TEST(Glm, OlderConverterFusedQkvProj) {
  hf::Spec s = glm_spec("glm");
  s.fused_qkv = true;
  Fixture f(s);
  f.expect_matches_reference();
}

// The three forms are one set of weights: a chatglm checkpoint renamed into the glm layout (its
// query_key_value split by rows, rope_ratio stated as rope_theta) gives the same logits.
TEST(Glm, ChatglmAndGlmFormsOfOneModelAgree) {
  hf::Spec cs = glm_spec("chatglm");
  Fixture chat(cs);
  hf::Spec gs = cs;
  gs.family = "glm";
  gs.theta = 10000.0 * cs.rope_ratio;
  hf::TensorMap w;
  const int64_t D = cs.hidden, qd = int64_t(cs.heads) * cs.head_dim, kvd = int64_t(cs.kv_heads) * cs.head_dim;
  auto rows = [&](const hf::Tensor& t, int64_t r0, int64_t n, int64_t cols) {
    hf::Tensor o;
    o.shape = cols > 0 ? std::vector<int64_t>{n, cols} : std::vector<int64_t>{n};
    const int64_t c = std::max<int64_t>(cols, 1);
    o.v.assign(t.v.begin() + r0 * c, t.v.begin() + (r0 + n) * c);
    return o;
  };
  const hf::TensorMap& cw = chat.weights;
  w["model.embed_tokens.weight"] = cw.at("transformer.embedding.word_embeddings.weight");
  w["model.norm.weight"] = cw.at("transformer.encoder.final_layernorm.weight");
  w["lm_head.weight"] = cw.at("transformer.output_layer.weight");
  for (int l = 0; l < cs.layers; ++l) {
    const std::string c = "transformer.encoder.layers." + std::to_string(l) + ".", g = "model.layers." + std::to_string(l) + ".";
    w[g + "input_layernorm.weight"] = cw.at(c + "input_layernorm.weight");
    w[g + "post_attention_layernorm.weight"] = cw.at(c + "post_attention_layernorm.weight");
    const hf::Tensor& W = cw.at(c + "self_attention.query_key_value.weight");
    const hf::Tensor& b = cw.at(c + "self_attention.query_key_value.bias");
    w[g + "self_attn.q_proj.weight"] = rows(W, 0, qd, D);
    w[g + "self_attn.k_proj.weight"] = rows(W, qd, kvd, D);
    w[g + "self_attn.v_proj.weight"] = rows(W, qd + kvd, kvd, D);
    w[g + "self_attn.q_proj.bias"] = rows(b, 0, qd, 0);
    w[g + "self_attn.k_proj.bias"] = rows(b, qd, kvd, 0);
    w[g + "self_attn.v_proj.bias"] = rows(b, qd + kvd, kvd, 0);
    w[g + "self_attn.o_proj.weight"] = cw.at(c + "self_attention.dense.weight");
    w[g + "mlp.gate_up_proj.weight"] = cw.at(c + "mlp.dense_h_to_4h.weight");
    w[g + "mlp.down_proj.weight"] = cw.at(c + "mlp.dense_4h_to_h.weight");
  }
  test::TempDir dir;
  hf::write_model(dir.str(), hf::make_config(gs), w, 2);
  const Model glm = Model::load(dir.str());
  const auto ids = seeded_ids(24, cs.vocab, 9);
  EXPECT_LT(ref::rel_max_diff(logits_of(glm, ids), logits_of(chat.model, ids)), 1e-6);
}

TEST(Glm, StreamedForwardEqualsWholeModel) {
  for (const char* fam : {"chatglm", "glm4"}) {
    SCOPED_TRACE(fam);
    const hf::Spec s = glm_spec(fam);
    Fixture whole(s), streamed(s, true);
    ASSERT_TRUE(streamed.model.streamed());
    const auto ids = seeded_ids(16, s.vocab, 3);
    EXPECT_TRUE(at::equal(whole.model.forward(to_tensor(ids)), streamed.model.forward(to_tensor(ids))));
  }
}

// Pre-RoPE q/k as the calibration observer sees them = the reference's (bias included), and
// kvq's apply_rope of the config = the reference's adjacent-pair rotation of the first 8 dims.
class CaptureQk : public CaptureObserver {
 public:
  std::vector<std::vector<float>> q, k;
  void on_layer(const LayerCapture& c) override {
    q.emplace_back(c.q, c.q + size_t(c.batch) * c.seq * c.n_heads * c.head_dim);
    k.emplace_back(c.k, c.k + size_t(c.batch) * c.seq * c.n_kv_heads * c.head_dim);
  }
};

TEST(Glm, CapturedKAndApplyRopeAreTheModels) {
  Fixture f(glm_spec("chatglm"));
  const int T = 12;
  const auto ids = seeded_ids(T, f.spec.vocab, 2);
  CaptureQk cap;
  Model::ForwardOptions o;
  o.observer = &cap;
  o.logits = false;
  f.model.forward(to_tensor(ids), o);
  ref::Trace tr;
  ref::forward(f.ref, ids, {}, &tr);
  ASSERT_EQ(cap.k.size(), size_t(f.spec.layers));
  const int Hk = f.spec.kv_heads, hd = f.spec.head_dim;
  std::vector<int64_t> pos(T);
  for (int t = 0; t < T; ++t) pos[size_t(t)] = t;
  for (int l = 0; l < f.spec.layers; ++l) {
    const ref::Vec k(cap.k[size_t(l)].begin(), cap.k[size_t(l)].end());
    EXPECT_LT(ref::rel_max_diff(k, tr.k[size_t(l)]), kTol) << "layer " << l;
    std::vector<float> rk = cap.k[size_t(l)];
    apply_rope(rk.data(), Hk, T, hd, pos.data(), f.model.config());
    ref::Vec want = tr.k[size_t(l)];
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < Hk; ++h) ref::detail::rope(&want[(size_t(t) * Hk + h) * hd], f.ref.inv_freq, 1.0, t, true);
    EXPECT_LT(ref::rel_max_diff(ref::Vec(rk.begin(), rk.end()), want), kTol) << "layer " << l;
    for (int t = 1; t < T; ++t)  // the static tail passes through
      for (int e = 8; e < hd; ++e) EXPECT_EQ(rk[size_t(t) * Hk * hd + e], cap.k[size_t(l)][size_t(t) * Hk * hd + e]);
  }
}

TEST(Glm, WholeFp32BytesIsTheLoadedElementsTimesFour) {
  for (const char* fam : {"chatglm", "glm", "glm4"}) {
    SCOPED_TRACE(fam);
    const hf::Spec s = glm_spec(fam);
    const hf::TensorMap w = hf::make_weights(s);
    int64_t elems = 0;
    for (const auto& [name, t] : w) {
      if (name == "transformer.rotary_pos_emb.inv_freq") continue;  // never read
      int64_t n = 1;
      for (int64_t x : t.shape) n *= x;
      elems += n;
    }
    test::TempDir dir;
    hf::write_model(dir.str(), hf::make_config(s), w, 2);
    EXPECT_EQ(Model::whole_fp32_bytes(dir.str()), 4 * elems);
  }
}

// ---------------------------------------------------------------- bad inputs, one line each

struct BadCase {
  const char* name;
  const char* family;
  std::function<void(nlohmann::json&, hf::TensorMap&)> edit;
  std::vector<std::string> parts;
};

TEST(BadGlm, Table) {
  const std::string qkv0 = "transformer.encoder.layers.0.self_attention.query_key_value.weight";
  const std::vector<BadCase> cases = {
      {"chatglm without kv_channels", "chatglm", [](nlohmann::json& c, hf::TensorMap&) { c.erase("kv_channels"); },
       {"config.json", "kv_channels", "missing"}},
      {"chatglm kv_channels not a multiple of 4", "chatglm",
       [](nlohmann::json& c, hf::TensorMap&) { c["kv_channels"] = 18; }, {"config.json", "kv_channels", "18"}},
      {"chatglm fused qkv rows do not add up", "chatglm",
       [&](nlohmann::json&, hf::TensorMap& w) {
         hf::Tensor& t = w[qkv0];
         t.shape[0] -= 2;
         t.v.resize(size_t(t.shape[0] * t.shape[1]));
       },
       {qkv0, "rows do not add up", "128 + 32 + 32 = 192", "multi_query_group_num 2", "kv_channels 16"}},
      {"chatglm config states more KV heads than the fused rows hold", "chatglm",
       [](nlohmann::json& c, hf::TensorMap&) { c["multi_query_group_num"] = 4; },
       {"query_key_value.weight", "rows do not add up", "= 256", "multi_query_group_num 4"}},
      {"chatglm fused bias rows do not add up", "chatglm",
       [](nlohmann::json&, hf::TensorMap& w) {
         hf::Tensor& t = w["transformer.encoder.layers.2.self_attention.query_key_value.bias"];
         t.shape[0] = 190;
         t.v.resize(190);
       },
       {"layers.2.self_attention.query_key_value.bias", "190 rows do not add up"}},
      {"glm older fused qkv_proj rows do not add up", "glm",
       [](nlohmann::json& c, hf::TensorMap&) { c["num_key_value_heads"] = 4; },
       {"model.layers.0.self_attn.qkv_proj.weight", "rows do not add up", "num_key_value_heads 4", "head_dim 16"}},
      {"chatglm LayerNorm", "chatglm", [](nlohmann::json& c, hf::TensorMap&) { c["rmsnorm"] = false; },
       {"config.json", "rmsnorm", "LayerNorm"}},
      {"chatglm biased linears", "chatglm", [](nlohmann::json& c, hf::TensorMap&) { c["add_bias_linear"] = true; },
       {"config.json", "add_bias_linear"}},
      {"chatglm post-layernorm residual", "chatglm",
       [](nlohmann::json& c, hf::TensorMap&) { c["apply_residual_connection_post_layernorm"] = true; },
       {"config.json", "apply_residual_connection_post_layernorm"}},
      {"chatglm bad rope_ratio", "chatglm", [](nlohmann::json& c, hf::TensorMap&) { c["rope_ratio"] = -1; },
       {"config.json", "rope_ratio", "-1"}},
      {"chatglm fused gate|up of the wrong width", "chatglm",
       [](nlohmann::json& c, hf::TensorMap&) { c["ffn_hidden_size"] = 41; },
       {"mlp.dense_h_to_4h.weight", "82"}},
      {"glm4 sandwich norm missing", "glm4",
       [](nlohmann::json&, hf::TensorMap& w) { w.erase("model.layers.1.post_mlp_layernorm.weight"); },
       {"model.layers.1.post_mlp_layernorm.weight", "not in weight_map"}},
      {"glm bad partial_rotary_factor", "glm",
       [](nlohmann::json& c, hf::TensorMap&) { c["partial_rotary_factor"] = 0.1; },
       {"config.json", "partial_rotary_factor", "rotary dim 1"}},
  };
  for (const auto& bc : cases) {
    SCOPED_TRACE(bc.name);
    hf::Spec s = glm_spec(bc.family);
    if (std::string(bc.name).find("qkv_proj") != std::string::npos) s.fused_qkv = true;
    hf::TensorMap w = hf::make_weights(s);
    nlohmann::json c = hf::make_config(s);
    bc.edit(c, w);
    test::TempDir dir;
    hf::write_model(dir.str(), c, w, 2);
    test::expect_error([&] { Model::load(dir.str()); }, bc.parts);
  }
}


// ---------------------------------------------------------------- BF16 forward (issue 37)

// Every GLM-4 form in BF16 against the float64 references (bf16_bound.hpp): equal to the emulated
// one, within the roundoff bound of the plain one and above its floor, the greedy continuation equal; streamed BF16 = whole BF16 bit for bit.
TEST(Bf16Forward, GlmFormsWithinTheRoundoffBound) {
  for (const char* fam : {"chatglm", "glm", "glm4"}) {
    SCOPED_TRACE(fam);
    const hf::Spec s = glm_spec(fam);
    Fixture f(s, false, Precision::kBf16), streamed(s, true, Precision::kBf16);
    double worst = 0;
    std::vector<double> emulated;
    for (uint32_t seed : {11u, 12u}) worst = std::max(worst, f.diff(f.ref, {}, "", 24, seed));
    for (uint32_t seed = 100; seed < 106; ++seed) {  // the emulated check on six short prompts
      ref::Bf16Emulation on;
      emulated.push_back(f.diff(f.ref, {}, "", 12, seed));
    }
    std::cout << "[ info ] " << fam << " BF16 vs the plain reference " << worst << " (bound "
              << test::bf16_logit_bound(s.layers) << ")\n";
    test::expect_meets_emulated(emulated, fam);
    EXPECT_GT(worst, test::kBf16Floor);
    EXPECT_LT(worst, test::bf16_logit_bound(s.layers));
    f.expect_same_greedy(6, 6);
    const auto ids = seeded_ids(16, s.vocab, 3);
    EXPECT_TRUE(at::equal(f.model.forward(to_tensor(ids)), streamed.model.forward(to_tensor(ids))));
  }
}

}  // namespace
}  // namespace kvq
