// Qwen3 (q/k norm, explicit head_dim, tied embeddings), Qwen3-MoE and Mixtral (router, top-k,
// norm_topk_prob, dense/sparse layers), Mistral / Qwen2 sliding-window attention: tiny BF16
// checkpoints written here in the HF layout (sharded), kvq's forward against the double-precision
// reference of hf_reference.hpp. Tolerance: max |logit - reference| <= 1e-4 · max |reference
// logit| (kvq runs fp32; the tiny models keep fp32 rounding near 1e-6). Every feature also has a
// negative control: the reference with that feature off must miss by far more than the tolerance.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <fstream>

#include "kvq/util/error.hpp"

#include "bf16_bound.hpp"
#include "hf_reference.hpp"
#include "hf_tiny.hpp"
#include "kvq/model/model.hpp"
#include "model_test_util.hpp"

namespace kvq {
namespace {

namespace hf = test::hf;
namespace ref = test::ref;

constexpr double kTol = 1e-4;
constexpr double kControl = 1e-2;  // a feature left out must change the logits by at least this

std::vector<int> seeded_ids(int T, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> ids(static_cast<size_t>(T));
  for (int& x : ids) x = int(rng() % uint32_t(vocab));
  return ids;
}

at::Tensor to_tensor(const std::vector<std::vector<int>>& rows) {
  std::vector<int64_t> v;
  for (const auto& r : rows) v.insert(v.end(), r.begin(), r.end());
  return at::tensor(v, at::kLong).view({int64_t(rows.size()), int64_t(rows[0].size())});
}

ref::Vec row_logits(const at::Tensor& logits, int64_t b) {
  at::Tensor r = logits[b].to(at::kDouble).contiguous();
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

// Writes the spec's checkpoint (3 shards), loads it with kvq.
struct Fixture {
  hf::Spec spec;
  hf::TensorMap weights;
  ref::Model ref;
  test::TempDir dir;
  Model model;

  explicit Fixture(const hf::Spec& s, Precision p = Precision::kFp32)
      : spec(s), weights(hf::make_weights(s)), ref(ref::from_hf(s, weights)), model(load(s, weights, dir, p)) {}

  static Model load(const hf::Spec& s, const hf::TensorMap& w, const test::TempDir& dir, Precision p) {
    hf::write_model(dir.str(), hf::make_config(s), w, 3);
    Model::LoadOptions lo;
    lo.precision = p;
    return Model::load(dir.str(), lo);
  }

  // The BF16 forward (bf16_bound.hpp) on B windows of T seeded tokens: meets the emulated
  // reference, and lies between the floor and the roundoff bound of the plain one.
  void compare_bf16(int T, int B = 2, uint32_t seed = 11) {
    std::vector<std::vector<int>> rows;
    for (int b = 0; b < B; ++b) rows.push_back(seeded_ids(T, spec.vocab, seed + uint32_t(b)));
    const at::Tensor logits = model.forward(to_tensor(rows));
    double plain = 0;
    for (int b = 0; b < B; ++b)
      plain = std::max(plain, ref::rel_max_diff(row_logits(logits, b), ref::forward(ref, rows[size_t(b)])));
    // The emulated check on six short prompts (bf16_bound.hpp).
    std::vector<double> emulated;
    for (uint32_t p = 0; p < 6; ++p) {
      const std::vector<int> ids = seeded_ids(12, spec.vocab, 100 + p);
      const ref::Vec got = row_logits(model.forward(to_tensor({ids})), 0);
      ref::Bf16Emulation on;
      emulated.push_back(ref::rel_max_diff(got, ref::forward(ref, ids)));
    }
    const double bound = test::bf16_logit_bound(spec.layers);
    std::cout << "[ info ] " << spec.family << " BF16 vs the plain reference " << plain << " (bound " << bound << " = "
              << test::bf16_roundings(spec.layers) << " u)\n";
    test::expect_meets_emulated(emulated, spec.family);
    EXPECT_LT(plain, bound);
    EXPECT_GT(plain, test::kBf16Floor) << "BF16 is not in effect";
  }

  // kvq vs the reference on B windows of T seeded tokens; returns the worst relative difference and
  // checks the per-position argmax.
  double compare(int T, int B = 1, uint32_t seed = 11) {
    std::vector<std::vector<int>> rows;
    for (int b = 0; b < B; ++b) rows.push_back(seeded_ids(T, spec.vocab, seed + uint32_t(b)));
    const at::Tensor logits = model.forward(to_tensor(rows));
    double worst = 0;
    for (int b = 0; b < B; ++b) {
      const ref::Vec want = ref::forward(ref, rows[size_t(b)]);
      const ref::Vec got = row_logits(logits, b);
      worst = std::max(worst, ref::rel_max_diff(got, want));
      EXPECT_EQ(argmax_rows(got, spec.vocab), argmax_rows(want, spec.vocab)) << "window " << b;
    }
    return worst;
  }

  // The reference with `off` against the reference as is, on the same window.
  double control(int T, const ref::Options& off, uint32_t seed = 11) const {
    const auto ids = seeded_ids(T, spec.vocab, seed);
    return ref::rel_max_diff(ref::forward(ref, ids, off), ref::forward(ref, ids));
  }

  // Greedy continuation, recomputing the window each step, by kvq and by the reference.
  void expect_same_greedy(int prompt_len, int steps) {
    std::vector<int> a = seeded_ids(prompt_len, spec.vocab, 5), b = a;
    for (int s = 0; s < steps; ++s) {
      const at::Tensor l = model.forward(to_tensor({a}));
      a.push_back(int(l[0][int64_t(a.size()) - 1].argmax().item<int64_t>()));
      const ref::Vec r = ref::forward(ref, b);
      const auto last = r.begin() + ptrdiff_t((b.size() - 1) * size_t(spec.vocab));
      b.push_back(int(std::max_element(last, last + spec.vocab) - last));
    }
    EXPECT_EQ(a, b);
  }
};

hf::Spec qwen3_spec() {
  hf::Spec s;
  s.family = "qwen3";
  s.hidden = 32;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;  // explicit, != hidden / heads = 8
  s.tied = true;
  s.theta = 1e6;
  s.seed = 3;
  return s;
}

hf::Spec qwen3_moe_spec() {
  hf::Spec s;
  s.family = "qwen3_moe";
  s.layers = 4;
  s.experts = 6;
  s.top_k = 2;
  s.moe_inter = 20;
  s.norm_topk_prob = false;  // the Qwen3MoeConfig default
  s.mlp_only_layers = {2};   // dense layer 2 (intermediate_size), MoE 0, 1, 3
  s.seed = 4;
  return s;
}

hf::Spec mixtral_spec() {
  hf::Spec s;
  s.family = "mixtral";
  s.experts = 4;
  s.top_k = 2;
  s.inter = 24;
  s.seed = 5;
  return s;
}

TEST(Qwen3, ConfigFields) {
  Fixture f(qwen3_spec());
  const ModelConfig& c = f.model.config();
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.n_experts, 0);
  EXPECT_TRUE(c.layer_window.empty());
}

TEST(Qwen3, ForwardMatchesReference) {
  Fixture f(qwen3_spec());
  const double d = f.compare(20, 2);
  std::cout << "[ info ] qwen3 max rel diff " << d << "\n";
  EXPECT_LT(d, kTol);
  f.expect_same_greedy(6, 6);
  ref::Options off;
  off.skip_qk_norm = true;
  EXPECT_GT(f.control(20, off), kControl) << "q/k norm must matter";
}

class CaptureK : public CaptureObserver {
 public:
  std::vector<std::vector<float>> q, k;
  void on_layer(const LayerCapture& c) override {
    q.emplace_back(c.q, c.q + size_t(c.batch) * c.seq * c.n_heads * c.head_dim);
    k.emplace_back(c.k, c.k + size_t(c.batch) * c.seq * c.n_kv_heads * c.head_dim);
  }
};

TEST(Qwen3, CapturedPreRopeQkAreTheNormOutputs) {
  Fixture f(qwen3_spec());
  const auto ids = seeded_ids(12, f.spec.vocab, 2);
  CaptureK cap;
  Model::ForwardOptions o;
  o.observer = &cap;
  o.logits = false;
  f.model.forward(to_tensor({ids}), o);
  ref::Trace tr, raw;
  ref::forward(f.ref, ids, {}, &tr);
  ref::Options off;
  off.skip_qk_norm = true;
  ref::forward(f.ref, ids, off, &raw);
  ASSERT_EQ(cap.k.size(), size_t(f.spec.layers));
  for (int l = 0; l < f.spec.layers; ++l) {
    const ref::Vec k(cap.k[size_t(l)].begin(), cap.k[size_t(l)].end());
    const ref::Vec q(cap.q[size_t(l)].begin(), cap.q[size_t(l)].end());
    EXPECT_LT(ref::rel_max_diff(k, tr.k[size_t(l)]), kTol) << "layer " << l;
    EXPECT_LT(ref::rel_max_diff(q, tr.q[size_t(l)]), kTol) << "layer " << l;
    EXPECT_GT(ref::rel_max_diff(k, raw.k[size_t(l)]), kControl) << "layer " << l << ": k must be the normed one";
  }
}

TEST(Qwen3MoE, ConfigFields) {
  hf::Spec s = qwen3_moe_spec();
  Fixture f(s);
  const ModelConfig& c = f.model.config();
  EXPECT_EQ(c.architecture, "qwen3_moe");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.n_experts, 6);
  EXPECT_EQ(c.n_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 20);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.layer_moe, (std::vector<uint8_t>{1, 1, 0, 1}));
}

TEST(Qwen3MoE, DecoderSparseStep) {
  hf::Spec s = qwen3_moe_spec();
  s.decoder_sparse_step = 2;
  s.mlp_only_layers = {3};
  Fixture f(s);
  // (l + 1) % 2 != 0 -> dense: layers 0, 2; layer 3 is listed dense.
  EXPECT_EQ(f.model.config().layer_moe, (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_LT(f.compare(16), kTol);
}

TEST(Qwen3MoE, ForwardMatchesReference) {
  for (bool norm : {false, true}) {
    hf::Spec s = qwen3_moe_spec();
    s.norm_topk_prob = norm;
    Fixture f(s);
    const double d = f.compare(24, 2);
    std::cout << "[ info ] qwen3_moe norm_topk_prob=" << norm << " max rel diff " << d << "\n";
    EXPECT_LT(d, kTol);
    f.expect_same_greedy(5, 6);
    ref::Options off;
    off.flip_norm_topk_prob = true;
    EXPECT_GT(f.control(24, off), kControl) << "norm_topk_prob must matter";
    off = {};
    off.skip_qk_norm = true;
    EXPECT_GT(f.control(24, off), kControl);
  }
}

TEST(Mixtral, ForwardMatchesReference) {
  Fixture f(mixtral_spec());
  const ModelConfig& c = f.model.config();
  EXPECT_EQ(c.architecture, "mixtral");
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_intermediate_size, 24);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.layer_window.empty());  // sliding_window null
  const double d = f.compare(24, 2);
  std::cout << "[ info ] mixtral max rel diff " << d << "\n";
  EXPECT_LT(d, kTol);
  f.expect_same_greedy(5, 6);
  ref::Options off;
  off.flip_norm_topk_prob = true;
  EXPECT_GT(f.control(24, off), kControl);
}

TEST(Mixtral, TopKOfAllExpertsIsTheDenseMixture) {
  hf::Spec s = mixtral_spec();
  s.top_k = s.experts;  // every expert kept: order and selection cannot matter
  Fixture f(s);
  EXPECT_LT(f.compare(10), kTol);
}

// Mistral with a window shorter than the sequence: query i sees keys i - W < j <= i
// (transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window). T = 150 spans three
// query blocks of the forward, so windows reaching back into earlier blocks are covered; W = 80 is
// longer than a block.
TEST(MistralSlidingWindow, ForwardMatchesReference) {
  for (int W : {1, 5, 80}) {
    hf::Spec s;
    s.family = "mistral";
    s.sliding_window = W;
    s.hidden = 40;
    s.heads = 4;
    s.head_dim = 16;  // explicit, != 40 / 4 (Mistral-Nemo)
    s.layers = 2;
    s.seed = 8 + uint32_t(W);
    Fixture f(s);
    EXPECT_EQ(f.model.config().layer_window, (std::vector<int>{W, W}));
    EXPECT_EQ(f.model.config().head_dim, 16);
    for (int T : {W, 150}) {
      if (T < 2) continue;
      const double d = f.compare(T, 2);
      std::cout << "[ info ] mistral W=" << W << " T=" << T << " max rel diff " << d << "\n";
      EXPECT_LT(d, kTol) << "W " << W << " T " << T;
    }
    ref::Options off;
    off.ignore_window = true;
    EXPECT_GT(f.control(150, off), kControl) << "the window must matter, W " << W;
  }
}

TEST(MistralSlidingWindow, WindowOfExactlyTMinusOneCutsOnlyTheFirstKey) {
  hf::Spec s;
  s.family = "mistral";
  s.sliding_window = 9;
  s.layers = 1;
  Fixture f(s);
  EXPECT_LT(f.compare(10), kTol);  // only the last query loses key 0
  ref::Options off;
  off.ignore_window = true;
  const auto ids = seeded_ids(10, s.vocab, 11);
  const ref::Vec a = ref::forward(f.ref, ids), b = ref::forward(f.ref, ids, off);
  // Positions 0..8 are unaffected; position 9 differs.
  EXPECT_LT(ref::rel_max_diff(ref::Vec(a.begin(), a.begin() + 9 * s.vocab), ref::Vec(b.begin(), b.begin() + 9 * s.vocab)), 1e-12);
  EXPECT_GT(ref::rel_max_diff(a, b), 1e-6);
}

TEST(MistralSlidingWindow, AbsentKeyIsTransformersDefault4096NullIsNone) {
  hf::Spec s;
  s.family = "mistral";
  test::TempDir dir;
  nlohmann::json c = hf::make_config(s);
  c.erase("sliding_window");
  hf::write_model(dir.str(), c, hf::make_weights(s));
  EXPECT_EQ(Model::load(dir.str()).config().sliding_window, 4096);
  c["sliding_window"] = nullptr;
  hf::write_model(dir.str(), c, hf::make_weights(s));
  EXPECT_TRUE(Model::load(dir.str()).config().layer_window.empty());
}

TEST(Qwen2SlidingWindow, OnlyLayersFromMaxWindowLayers) {
  hf::Spec s;
  s.family = "qwen2";
  s.use_sliding_window = true;
  s.sliding_window = 6;
  s.max_window_layers = 1;
  s.seed = 21;
  Fixture f(s);
  EXPECT_EQ(f.model.config().layer_window, (std::vector<int>{0, 6, 6}));
  EXPECT_LT(f.compare(30, 2), kTol);
  ref::Options off;
  off.ignore_window = true;
  EXPECT_GT(f.control(30, off), kControl);

  hf::Spec no = s;
  no.use_sliding_window = false;  // sliding_window stays in the file; it is ignored
  Fixture g(no);
  EXPECT_TRUE(g.model.config().layer_window.empty());
  EXPECT_LT(g.compare(30), kTol);
}

TEST(Qwen3SlidingWindow, LayerTypesWinOverMaxWindowLayers) {
  hf::Spec s = qwen3_spec();
  s.use_sliding_window = true;
  s.sliding_window = 4;
  s.max_window_layers = 0;
  test::TempDir dir;
  nlohmann::json c = hf::make_config(s);
  c["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  hf::write_model(dir.str(), c, hf::make_weights(s));
  EXPECT_EQ(Model::load(dir.str()).config().layer_window, (std::vector<int>{0, 4, 0}));
}

TEST(Qwen3SlidingWindow, ForwardMatchesReference) {
  hf::Spec s = qwen3_spec();
  s.use_sliding_window = true;
  s.sliding_window = 7;
  s.max_window_layers = 2;
  Fixture f(s);
  EXPECT_EQ(f.model.config().layer_window, (std::vector<int>{0, 0, 7}));
  EXPECT_LT(f.compare(40), kTol);
  ref::Options off;
  off.ignore_window = true;
  EXPECT_GT(f.control(40, off), kControl);
}

// A KV transform sees the normed pre-RoPE K of Qwen3 too: zeroing V must zero the attention output
// without touching the shapes; here we check it is called with the same K the observer captures.
class KCheck : public KvTransform {
 public:
  std::vector<std::vector<float>> k;
  void apply(LayerKv& kv) override {
    k.emplace_back(kv.k, kv.k + size_t(kv.batch) * kv.seq * kv.n_kv_heads * kv.head_dim);
  }
};

TEST(Qwen3, KvTransformSeesNormedK) {
  Fixture f(qwen3_spec());
  const auto ids = seeded_ids(9, f.spec.vocab, 4);
  KCheck t;
  CaptureK cap;
  Model::ForwardOptions o;
  o.kv_transform = &t;
  o.observer = &cap;
  f.model.forward(to_tensor({ids}), o);
  ASSERT_EQ(t.k.size(), cap.k.size());
  for (size_t l = 0; l < t.k.size(); ++l) EXPECT_EQ(t.k[l], cap.k[l]);
}

// ---------------------------------------------------------------- bad configs and weights

struct BadCase {
  const char* name;
  std::function<void(hf::Spec&, nlohmann::json&, hf::TensorMap&)> edit;
  std::vector<std::string> parts;
};

TEST(BadArchitecture, Table) {
  const std::vector<BadCase> cases = {
      {"qwen3_moe expert missing",
       [](hf::Spec& s, nlohmann::json&, hf::TensorMap& w) {
         for (const auto& n : hf::expert_tensor_names(s, 1, s.experts - 1)) w.erase(n);
       },
       {"config.json", "num_experts", "is 6", "model.layers.1.mlp.experts.5.gate_proj.weight", "missing"}},
      {"qwen3_moe config says more experts",
       [](hf::Spec&, nlohmann::json& c, hf::TensorMap&) { c["num_experts"] = 8; },
       {"config.json", "num_experts", "is 8", "experts.6.", "missing"}},
      {"qwen3_moe extra expert tensors",
       [](hf::Spec&, nlohmann::json& c, hf::TensorMap&) { c["num_experts"] = 5; },
       {"config.json", "num_experts", "is 5", "experts.5.", "safetensors"}},
      {"qwen3_moe top-k above expert count",
       [](hf::Spec&, nlohmann::json& c, hf::TensorMap&) { c["num_experts_per_tok"] = 7; },
       {"config.json", "num_experts_per_tok", "7", "num_experts 6"}},
      {"qwen3_moe bad mlp_only_layers",
       [](hf::Spec&, nlohmann::json& c, hf::TensorMap&) { c["mlp_only_layers"] = {9}; },
       {"config.json", "mlp_only_layers", "[9]"}},
      {"qwen3_moe k_norm missing",
       [](hf::Spec&, nlohmann::json&, hf::TensorMap& w) { w.erase("model.layers.0.self_attn.k_norm.weight"); },
       {"model.layers.0.self_attn.k_norm.weight", "not in weight_map"}},
  };
  for (const auto& bc : cases) {
    SCOPED_TRACE(bc.name);
    hf::Spec s = qwen3_moe_spec();
    hf::TensorMap w = hf::make_weights(s);
    nlohmann::json c = hf::make_config(s);
    bc.edit(s, c, w);
    test::TempDir dir;
    hf::write_model(dir.str(), c, w, 2);
    test::expect_error([&] { Model::load(dir.str()); }, bc.parts);
  }
}

TEST(BadArchitecture, MixtralExpertCount) {
  hf::Spec s = mixtral_spec();
  hf::TensorMap w = hf::make_weights(s);
  nlohmann::json c = hf::make_config(s);
  for (const auto& n : hf::expert_tensor_names(s, 2, 3)) w.erase(n);
  test::TempDir dir;
  hf::write_model(dir.str(), c, w, 2);
  test::expect_error([&] { Model::load(dir.str()); },
                     {"config.json", "num_local_experts", "is 4", "block_sparse_moe.experts.3.w1.weight", "missing"});
}

TEST(BadArchitecture, RefusedModelTypesSayWhy) {
  const std::vector<std::pair<nlohmann::json, std::vector<std::string>>> cases = {
      // deepseek_v2 is opened (test_model_deepseek): a Llama config called so lacks its MLA keys.
      {{{"model_type", "deepseek_v2"}}, {"config.json", "kv_lora_rank", "missing"}},
      // deepseek_v3 and glm4_moe are opened too: a Llama config called so lacks their keys.
      {{{"model_type", "deepseek_v3"}}, {"config.json", "kv_lora_rank", "missing"}},
      {{{"model_type", "glm4_moe"}}, {"config.json", "n_routed_experts", "is 128 but tensor", "missing"}},
      {{{"model_type", "deepseek_v32"}}, {"model_type", "'deepseek_v32'", "indexer"}},
      {{{"model_type", "deepseek_v4"}}, {"model_type", "'deepseek_v4'", "not implemented"}},
      {{{"model_type", "gemma"}}, {"model_type", "'gemma'", "(1 + w)", "GeGLU"}},
      {{{"model_type", "gemma2"}}, {"model_type", "'gemma2'", "softcapping"}},
      // gemma3 is opened (test_model_gemma3): a Llama config called so lacks its text_config.
      {{{"model_type", "gemma3"}}, {"config.json", "text_config", "missing"}},
      {{{"model_type", "gemma4_text"}}, {"model_type", "'gemma4_text'", "attention_k_eq_v"}},
      // qwen3_5 and qwen3_next are opened (test_model_qwen3_5 / _next): a Llama config called so has no
      // full_attention layer among its 3.
      {{{"model_type", "qwen3_5"}}, {"config.json", "full_attention_interval", "no full_attention layer"}},
      {{{"model_type", "qwen3_next"}}, {"config.json", "full_attention_interval", "no full_attention layer"}},
      {{{"model_type", "phi3"}}, {"model_type", "'phi3'", "LongRoPE", "fused"}},
      {{{"model_type", "falcon"}}, {"model_type", "unsupported architecture 'falcon'", "supported: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, chatglm, glm, glm4"}},
      {{{"architectures", {"DeepseekV2ForCausalLM"}}}, {"config.json", "kv_lora_rank", "missing"}},
      {{{"architectures", {"DeepseekV3ForCausalLM"}}}, {"config.json", "kv_lora_rank", "missing"}},
      {{{"architectures", {"DeepseekV32ForCausalLM"}}}, {"architectures", "'DeepseekV32ForCausalLM'", "indexer"}},
      {{{"architectures", {"BertModel"}}}, {"architectures", "'BertModel'", "supported:"}},
  };
  for (const auto& [cfg, parts] : cases) {
    test::TempDir dir;
    nlohmann::json c = hf::make_config(hf::Spec{});
    c.erase("model_type");
    c.erase("architectures");
    for (auto it = cfg.begin(); it != cfg.end(); ++it) c[it.key()] = it.value();
    hf::write_model(dir.str(), c, hf::make_weights(hf::Spec{}));
    test::expect_error([&] { Model::load(dir.str()); }, parts);
  }
}

TEST(Architectures, ClassNamesWithoutModelType) {
  for (const char* fam : {"qwen3", "qwen3_moe", "mixtral"}) {
    hf::Spec s = std::string(fam) == "qwen3" ? qwen3_spec() : std::string(fam) == "mixtral" ? mixtral_spec() : qwen3_moe_spec();
    nlohmann::json c = hf::make_config(s);
    c.erase("model_type");
    test::TempDir dir;
    hf::write_model(dir.str(), c, hf::make_weights(s));
    EXPECT_EQ(Model::load(dir.str()).config().architecture, fam);
  }
}

// Model::whole_fp32_bytes (kvq-generate's memory check) from config.json alone = 4 bytes per
// element of every tensor the checkpoint holds (a tied lm_head is the embedding's storage, and the
// checkpoint holds it once), for every family: dense, q/k norm + tied, MoE with a dense layer,
// Mixtral, Qwen2 biases; and for the committed fp32 demo checkpoint, its safetensors header's sum.
TEST(Architectures, WholeFp32BytesIsTheCheckpointsElementsTimesFour) {
  hf::Spec qwen2 = qwen3_spec();
  qwen2.family = "qwen2";
  qwen2.tied = false;
  for (const hf::Spec& s : {qwen3_spec(), qwen3_moe_spec(), mixtral_spec(), qwen2}) {
    SCOPED_TRACE(s.family);
    const hf::TensorMap w = hf::make_weights(s);
    int64_t elems = 0;
    for (const auto& [name, t] : w) {
      int64_t n = 1;
      for (int64_t x : t.shape) n *= x;
      elems += n;
    }
    test::TempDir dir;
    hf::write_model(dir.str(), hf::make_config(s), w, 3);
    EXPECT_EQ(Model::whole_fp32_bytes(dir.str()), 4 * elems);
    EXPECT_EQ(Model::whole_fp32_bytes(dir.str() + "/config.json"), 4 * elems);
  }
  const std::string demo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";
  std::ifstream f(demo + "/model.safetensors", std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  int64_t bytes = 0;
  const nlohmann::json tensors = nlohmann::json::parse(header);
  for (const auto& [name, t] : tensors.items()) {
    if (name == "__metadata__") continue;
    ASSERT_EQ(t["dtype"], "F32") << name;
    bytes += t["data_offsets"][1].get<int64_t>() - t["data_offsets"][0].get<int64_t>();
  }
  EXPECT_EQ(Model::whole_fp32_bytes(demo), bytes);
  EXPECT_THROW(Model::whole_fp32_bytes(demo + "/nope"), Error);
}

// ---------------------------------------------------------------- BF16 forward (issue 37)

// Every family of this file in BF16 against its float64 reference: within the bound of
// bf16_bound.hpp, above its floor, and the greedy continuation equal to the reference's.
TEST(Bf16Forward, FamiliesWithinTheRoundoffBound) {
  hf::Spec swa;
  swa.family = "mistral";
  swa.sliding_window = 5;
  swa.hidden = 40;
  swa.head_dim = 16;
  swa.layers = 2;
  swa.seed = 13;
  hf::Spec qwen2 = qwen3_spec();
  qwen2.family = "qwen2";  // q/k/v biases (fp32, added to the widened BF16 product)
  qwen2.tied = false;
  for (const hf::Spec& s : {qwen3_spec(), qwen3_moe_spec(), mixtral_spec(), swa, qwen2}) {
    SCOPED_TRACE(s.family);
    Fixture f(s, Precision::kBf16);
    EXPECT_EQ(f.model.precision(), Precision::kBf16);
    f.compare_bf16(s.family == "mistral" ? 40 : 20);
    f.expect_same_greedy(6, 6);
  }
  // Negative controls: the emulation without the inputs' rounding, or without the products', is
  // met by no prompt (the check sees where kvq rounds, not only how much).
  Fixture f(qwen3_spec(), Precision::kBf16);
  for (const bool input : {true, false}) {
    double best = 1;
    for (uint32_t p = 0; p < 6; ++p) {
      const std::vector<int> ids = seeded_ids(12, f.spec.vocab, 100 + p);
      const ref::Vec got = row_logits(f.model.forward(to_tensor({ids})), 0);
      ref::Bf16Emulation on;
      ref::bf16_control() = {input, !input};
      best = std::min(best, ref::rel_max_diff(got, ref::forward(f.ref, ids)));
      ref::bf16_control() = {};
    }
    std::cout << "[ info ] control: emulation without the " << (input ? "inputs'" : "products'")
              << " rounding, best prompt " << best << "\n";
    EXPECT_GT(best, 10 * test::kBf16EmulatedTol);
  }
}

// BF16 keeps 2 bytes per GEMM weight: every 2-D tensor of the checkpoint except the MoE router
// (which stays fp32); norms and biases 4 bytes.
TEST(Bf16Forward, WholeBytesHalveTheGemmWeights) {
  for (const hf::Spec& s : {qwen3_spec(), qwen3_moe_spec(), mixtral_spec()}) {
    SCOPED_TRACE(s.family);
    const hf::TensorMap w = hf::make_weights(s);
    int64_t bytes = 0, fp32 = 0;
    for (const auto& [name, t] : w) {
      int64_t n = 1;
      for (int64_t x : t.shape) n *= x;
      const bool router = name.size() > 12 && name.compare(name.size() - 12, 12, ".gate.weight") == 0;
      bytes += (t.shape.size() == 2 && !router ? 2 : 4) * n;
      fp32 += 4 * n;
    }
    test::TempDir dir;
    hf::write_model(dir.str(), hf::make_config(s), w, 3);
    EXPECT_EQ(Model::whole_bytes(dir.str(), Precision::kBf16), bytes);
    EXPECT_EQ(Model::whole_bytes(dir.str(), Precision::kFp32), fp32);
  }
}

}  // namespace
}  // namespace kvq
