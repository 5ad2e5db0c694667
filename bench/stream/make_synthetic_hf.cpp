// bench-make-hf: writes a synthetic Hugging Face checkpoint of a real model's shape — config.json
// of Llama-3.2-1B, Llama-3.1-8B or Llama-3.1-70B (with their llama3 RoPE scaling), random BF16
// weights (N(0, 0.02)-like, norms 1) over 5 GiB safetensors shards with an index, and the demo
// model's tokenizer (so the vocabulary is the demo's 1024 tokens; every other shape is the real
// model's). Benchmark data: generated on demand, never committed. --layers N writes only the first
// N decoder layers (a 70B layer for per-layer figures without 140 GB of disk). --shape v2-lite:
// DeepSeek-V2-Lite's (deepseek_v2: MLA with kv_lora_rank 512, layer 0 dense, 26 layers of 64 routed
// experts top-6 + 2 shared, DeepSeek YaRN factor 40), about 31 GB of BF16 at 27 layers. --shape v3:
// DeepSeek-V3's as it ships (FP8 E4M3 projections with 128x128 block scales, 256 experts top-8 by
// the noaux_tc router; ~11.5 GB a MoE layer): --layers 3 is the 1 dense + 2 MoE layer slice.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Shape {
  int hidden, layers, heads, kv_heads, inter;
  double rope_factor;
  int original_max;
  bool tied;
};

enum class Dtype { kBF16, kF8, kF32 };

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  bool ones;  // norm weights
  Dtype dtype = Dtype::kBF16;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t bytes() const { return numel() * (dtype == Dtype::kF8 ? 1 : dtype == Dtype::kF32 ? 4 : 2); }
  const char* dtype_name() const { return dtype == Dtype::kF8 ? "F8_E4M3" : dtype == Dtype::kF32 ? "F32" : "BF16"; }
};

uint16_t bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// DeepSeek-V2-Lite's config.json (the real one's values, the demo vocabulary) and tensors.
json v2_lite_config(int layers, int V) {
  return {{"architectures", {"DeepseekV2ForCausalLM"}},
          {"model_type", "deepseek_v2"},
          {"hidden_act", "silu"},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"hidden_size", 2048},
          {"num_hidden_layers", layers},
          {"num_attention_heads", 16},
          {"num_key_value_heads", 16},
          {"q_lora_rank", nullptr},
          {"kv_lora_rank", 512},
          {"qk_nope_head_dim", 128},
          {"qk_rope_head_dim", 64},
          {"v_head_dim", 128},
          {"intermediate_size", 10944},
          {"moe_intermediate_size", 1408},
          {"n_routed_experts", 64},
          {"num_experts_per_tok", 6},
          {"n_shared_experts", 2},
          {"first_k_dense_replace", 1},
          {"moe_layer_freq", 1},
          {"routed_scaling_factor", 1.0},
          {"norm_topk_prob", false},
          {"topk_method", "greedy"},
          {"n_group", 1},
          {"topk_group", 1},
          {"scoring_func", "softmax"},
          {"attention_bias", false},
          {"vocab_size", V},
          {"rope_theta", 10000.0},
          {"rope_scaling",
           {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096}, {"beta_fast", 32},
            {"beta_slow", 1}, {"mscale", 0.707}, {"mscale_all_dim", 0.707}}},
          {"rms_norm_eps", 1e-6},
          {"max_position_embeddings", 163840}};
}

void v2_lite_layer(int l, std::vector<Tensor>* all) {
  const int64_t D = 2048, H = 16, R = 512, rope = 64, nope = 128, v = 128, I = 10944, Ie = 1408, E = 64;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  all->push_back({p + "input_layernorm.weight", {D}, true});
  all->push_back({p + "self_attn.q_proj.weight", {H * (nope + rope), D}, false});
  all->push_back({p + "self_attn.kv_a_proj_with_mqa.weight", {R + rope, D}, false});
  all->push_back({p + "self_attn.kv_a_layernorm.weight", {R}, true});
  all->push_back({p + "self_attn.kv_b_proj.weight", {H * (nope + v), R}, false});
  all->push_back({p + "self_attn.o_proj.weight", {D, H * v}, false});
  all->push_back({p + "post_attention_layernorm.weight", {D}, true});
  auto swiglu = [&](const std::string& q, int64_t width) {
    all->push_back({q + "gate_proj.weight", {width, D}, false});
    all->push_back({q + "up_proj.weight", {width, D}, false});
    all->push_back({q + "down_proj.weight", {D, width}, false});
  };
  if (l == 0) {
    swiglu(p + "mlp.", I);
    return;
  }
  all->push_back({p + "mlp.gate.weight", {E, D}, false});
  for (int e = 0; e < E; ++e) swiglu(p + "mlp.experts." + std::to_string(e) + ".", Ie);
  swiglu(p + "mlp.shared_experts.", 2 * Ie);
}

// DeepSeek-V3's config.json (the real one's values, the demo vocabulary): MLA with q-LoRA 1536, 256
// routed experts of 2048 top-8 in 8 groups (top-4 groups) by the sigmoid noaux_tc router, one
// shared expert, FP8 E4M3 projections with 128x128 block scales. first_k_dense_replace is the real
// 3 at 61 layers; a slice of 3 layers has 1 dense + 2 MoE layers.
json v3_config(int layers, int V) {
  return {{"architectures", {"DeepseekV3ForCausalLM"}},
          {"model_type", "deepseek_v3"},
          {"hidden_act", "silu"},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"hidden_size", 7168},
          {"num_hidden_layers", layers},
          {"num_attention_heads", 128},
          {"num_key_value_heads", 128},
          {"q_lora_rank", 1536},
          {"kv_lora_rank", 512},
          {"qk_nope_head_dim", 128},
          {"qk_rope_head_dim", 64},
          {"v_head_dim", 128},
          {"intermediate_size", 18432},
          {"moe_intermediate_size", 2048},
          {"n_routed_experts", 256},
          {"num_experts_per_tok", 8},
          {"n_shared_experts", 1},
          {"first_k_dense_replace", layers > 3 ? 3 : 1},
          {"moe_layer_freq", 1},
          {"routed_scaling_factor", 2.5},
          {"norm_topk_prob", true},
          {"topk_method", "noaux_tc"},
          {"n_group", 8},
          {"topk_group", 4},
          {"scoring_func", "sigmoid"},
          {"num_nextn_predict_layers", 0},
          {"attention_bias", false},
          {"vocab_size", V},
          {"rope_theta", 10000.0},
          {"rope_scaling",
           {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096}, {"beta_fast", 32},
            {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
          {"rms_norm_eps", 1e-6},
          {"max_position_embeddings", 163840},
          {"quantization_config",
           {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}}}};
}

void v3_layer(int l, int dense_layers, std::vector<Tensor>* all) {
  const int64_t D = 7168, H = 128, QR = 1536, R = 512, rope = 64, nope = 128, v = 128, I = 18432, Ie = 2048, E = 256;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  auto fp8 = [&](const std::string& name, int64_t out, int64_t in) {
    all->push_back({name, {out, in}, false, Dtype::kF8});
    all->push_back({name + "_scale_inv", {(out + 127) / 128, (in + 127) / 128}, false, Dtype::kF32});
  };
  all->push_back({p + "input_layernorm.weight", {D}, true});
  fp8(p + "self_attn.q_a_proj.weight", QR, D);
  all->push_back({p + "self_attn.q_a_layernorm.weight", {QR}, true});
  fp8(p + "self_attn.q_b_proj.weight", H * (nope + rope), QR);
  fp8(p + "self_attn.kv_a_proj_with_mqa.weight", R + rope, D);
  all->push_back({p + "self_attn.kv_a_layernorm.weight", {R}, true});
  fp8(p + "self_attn.kv_b_proj.weight", H * (nope + v), R);
  fp8(p + "self_attn.o_proj.weight", D, H * v);
  all->push_back({p + "post_attention_layernorm.weight", {D}, true});
  auto swiglu = [&](const std::string& q, int64_t width) {
    fp8(q + "gate_proj.weight", width, D);
    fp8(q + "up_proj.weight", width, D);
    fp8(q + "down_proj.weight", D, width);
  };
  if (l < dense_layers) {
    swiglu(p + "mlp.", I);
    return;
  }
  all->push_back({p + "mlp.gate.weight", {E, D}, false});
  all->push_back({p + "mlp.gate.e_score_correction_bias", {E}, false, Dtype::kF32});
  for (int e = 0; e < E; ++e) swiglu(p + "mlp.experts." + std::to_string(e) + ".", Ie);
  swiglu(p + "mlp.shared_experts.", Ie);
}

// FP8 E4M3 codes of weights of a realistic magnitude under a block scale of 0.02: random sign,
// exponent 4..8 and mantissa, so |w| = 0.02 · (1 + m/8) · 2^(e-7) lies in [0.0025, 0.075].
void fill_fp8(std::vector<uint8_t>& buf, int64_t n, uint64_t& state) {
  buf.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    const uint32_t r = uint32_t(state >> 24);
    buf[size_t(i)] = uint8_t((r & 0x80) | ((4 + (r >> 8) % 5) << 3) | (r & 7));
  }
}

// Fills n BF16 values: 1.0 for norms, else a sum of two uniforms scaled to std 0.02 (triangular,
// cheap, and random enough for activations of realistic magnitude).
void fill(std::vector<uint16_t>& buf, int64_t n, bool ones, uint64_t& state) {
  buf.resize(size_t(n));
  if (ones) {
    std::fill(buf.begin(), buf.end(), bf16(1.0f));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    const float a = float(uint32_t(state) >> 8) * (1.0f / 16777216.0f), b = float(state >> 40) * (1.0f / 16777216.0f);
    buf[size_t(i)] = bf16((a + b - 1.0f) * 0.049f);  // triangular on (-1, 1) has std 1/sqrt(6)
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string which, out;
  int only_layers = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--shape" && i + 1 < argc) which = argv[++i];
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--layers" && i + 1 < argc) only_layers = std::atoi(argv[++i]);
    else {
      std::cerr << "usage: bench-make-hf --shape 1b|8b|70b|v2-lite|v3 --out DIR [--layers N]\n";
      return 2;
    }
  }
  Shape s{};
  if (which == "1b") s = {2048, 16, 32, 8, 8192, 32.0, 8192, true};
  else if (which == "8b") s = {4096, 32, 32, 8, 14336, 8.0, 8192, false};
  else if (which == "70b") s = {8192, 80, 64, 8, 28672, 8.0, 8192, false};
  else if (which == "v2-lite") s = {2048, 27, 16, 1, 10944, 40.0, 4096, false};
  else if (which == "v3") s = {7168, 61, 128, 1, 18432, 40.0, 4096, false};
  else {
    std::cerr << "bench-make-hf: --shape must be 1b, 8b, 70b, v2-lite or v3\n";
    return 2;
  }
  if (out.empty()) {
    std::cerr << "bench-make-hf: --out is required\n";
    return 2;
  }
  if (only_layers > 0 && only_layers < s.layers) s.layers = only_layers;
  const fs::path tok = fs::path(KVQ_SHARED_DIR) / "models/kvq-demo-llama/tokenizer.model";
  if (!fs::exists(tok)) {
    std::cerr << "bench-make-hf: needs the demo tokenizer at " << tok << "\n";
    return 2;
  }
  fs::create_directories(out);
  const int V = 1024, d = s.hidden / s.heads;
  json cfg = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_act", "silu"},
              {"bos_token_id", 1},
              {"eos_token_id", 2},
              {"tie_word_embeddings", s.tied},
              {"torch_dtype", "bfloat16"},
              {"hidden_size", s.hidden},
              {"num_hidden_layers", s.layers},
              {"num_attention_heads", s.heads},
              {"num_key_value_heads", s.kv_heads},
              {"head_dim", d},
              {"intermediate_size", s.inter},
              {"vocab_size", V},
              {"rope_theta", 500000.0},
              {"rope_scaling",
               {{"rope_type", "llama3"},
                {"factor", s.rope_factor},
                {"low_freq_factor", 1.0},
                {"high_freq_factor", 4.0},
                {"original_max_position_embeddings", s.original_max}}},
              {"rms_norm_eps", 1e-5},
              {"max_position_embeddings", 131072}};
  if (which == "v2-lite") cfg = v2_lite_config(s.layers, V);
  if (which == "v3") cfg = v3_config(s.layers, V);
  std::ofstream(fs::path(out) / "config.json") << cfg.dump(2) << "\n";
  fs::copy_file(tok, fs::path(out) / "tokenizer.model", fs::copy_options::overwrite_existing);

  const int64_t D = s.hidden, qd = int64_t(s.heads) * d, kvd = int64_t(s.kv_heads) * d, I = s.inter;
  std::vector<Tensor> all = {{"model.embed_tokens.weight", {V, D}, false}};
  for (int l = 0; l < s.layers; ++l) {
    if (which == "v2-lite") {
      v2_lite_layer(l, &all);
      continue;
    }
    if (which == "v3") {
      v3_layer(l, cfg["first_k_dense_replace"].get<int>(), &all);
      continue;
    }
    const std::string p = "model.layers." + std::to_string(l) + ".";
    all.push_back({p + "input_layernorm.weight", {D}, true});
    all.push_back({p + "self_attn.q_proj.weight", {qd, D}, false});
    all.push_back({p + "self_attn.k_proj.weight", {kvd, D}, false});
    all.push_back({p + "self_attn.v_proj.weight", {kvd, D}, false});
    all.push_back({p + "self_attn.o_proj.weight", {D, qd}, false});
    all.push_back({p + "post_attention_layernorm.weight", {D}, true});
    all.push_back({p + "mlp.gate_proj.weight", {I, D}, false});
    all.push_back({p + "mlp.up_proj.weight", {I, D}, false});
    all.push_back({p + "mlp.down_proj.weight", {D, I}, false});
  }
  all.push_back({"model.norm.weight", {D}, true});
  if (!s.tied) all.push_back({"lm_head.weight", {V, D}, false});

  // Shards of at most 5 GiB, tensors in order.
  const int64_t kShard = int64_t(5) << 30;
  std::vector<std::vector<size_t>> shards(1);
  int64_t bytes = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const int64_t b = all[i].bytes();
    if (bytes > 0 && bytes + b > kShard) shards.emplace_back(), bytes = 0;
    shards.back().push_back(i);
    bytes += b;
  }
  json weight_map = json::object();
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  std::vector<uint16_t> buf;
  std::vector<uint8_t> codes;
  std::vector<float> floats;
  int64_t total = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    json header = json::object();
    uint64_t off = 0;
    for (size_t i : shards[k]) {
      const uint64_t b = uint64_t(all[i].bytes());
      header[all[i].name] = {{"dtype", all[i].dtype_name()}, {"shape", all[i].shape}, {"data_offsets", {off, off + b}}};
      off += b;
      weight_map[all[i].name] = name;
    }
    std::string h = header.dump();
    while (h.size() % 8) h += ' ';
    std::ofstream f(fs::path(out) / name, std::ios::binary);
    const uint64_t hl = h.size();
    f.write(reinterpret_cast<const char*>(&hl), 8);
    f.write(h.data(), std::streamsize(h.size()));
    for (size_t i : shards[k]) {
      const Tensor& t = all[i];
      if (t.dtype == Dtype::kF8) {
        fill_fp8(codes, t.numel(), state);
        f.write(reinterpret_cast<const char*>(codes.data()), std::streamsize(codes.size()));
      } else if (t.dtype == Dtype::kF32) {  // block scales 0.02; the router's correction bias 0
        const float x = t.name.find("_scale_inv") != std::string::npos ? 0.02f : 0.0f;
        floats.assign(size_t(t.numel()), x);
        f.write(reinterpret_cast<const char*>(floats.data()), std::streamsize(floats.size() * 4));
      } else {
        fill(buf, t.numel(), t.ones, state);
        f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size() * 2));
      }
      total += t.bytes();
    }
    if (!f) {
      std::cerr << "bench-make-hf: cannot write " << (fs::path(out) / name) << "\n";
      return 1;
    }
    std::fprintf(stderr, "wrote %s\n", name);
  }
  std::ofstream(fs::path(out) / "model.safetensors.index.json")
      << json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(1) << "\n";
  std::fprintf(stderr, "%s: %s shape, %d layers, %.2f GB of weights in %zu shard(s)\n", out.c_str(), which.c_str(),
               s.layers, double(total) / 1e9, shards.size());
  return 0;
}
