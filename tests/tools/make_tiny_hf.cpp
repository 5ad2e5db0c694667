// kvq-make-tiny-hf: writes a tiny, untrained HF model directory of one family for the end-to-end
// pipeline tests — config.json in the family's keys, seeded N(0, scale) weights in BF16 over two
// safetensors shards with model.safetensors.index.json, and a tiny byte-level BPE tokenizer.json
// (256 ByteLevel byte symbols + a few dozen merges of common English pairs + the family's special
// tokens; vocab_size matches it). Test data only: built with the tests, never installed.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "hf_tiny.hpp"

namespace {

using nlohmann::json;
namespace hf = kvq::test::hf;

const char* kUsage =
    "usage: kvq-make-tiny-hf --family llama3|qwen2|qwen3|qwen3-moe|mixtral|mistral-swa|chatglm|glm4|deepseek_v2|\n"
    "                                 deepseek_v3-fp8|glm4_moe|gpt_oss|gemma3_text|gemma3|qwen3_5|qwen3_5_moe|\n"
    "                                 qwen3_next\n"
    "                        --out DIR\n"
    "                        [--seed S] [--scale X]\n"
    "                        [--layers N] [--head-dim D] [--kv-heads H]\n"
    "  Writes a tiny untrained model directory in the Hugging Face layout (test data).\n"
    "  --family  llama3: Llama with rope_scaling llama3 (factor 8, original 64), BOS template;\n"
    "            qwen2: q/k/v projection biases, Qwen tokenizer (NFC, no BOS);\n"
    "            qwen3: q/k norm, explicit head_dim, tied embeddings, Qwen tokenizer (NFC, no BOS);\n"
    "            qwen3-moe: Qwen3-MoE, 8 experts top-2, norm_topk_prob, layer 1 dense;\n"
    "            mixtral: 4 experts top-2; mistral-swa: Mistral with sliding_window 32;\n"
    "            chatglm: GLM-4-9B's own layout (fused query_key_value + bias, rope_ratio 500), head_dim\n"
    "            128 of which 64 rotate in adjacent pairs; glm4: the same in the Glm4ForCausalLM layout\n"
    "            (split q/k/v, fused gate_up_proj, sandwich norms); both with the Qwen tokenizer and\n"
    "            the q/k rows of the static dims (64..127) scaled by 3, so that the static blocks'\n"
    "            energy is ~9x the rotating ones' and Block-GTQ has a contrast to follow;\n"
    "            deepseek_v2: DeepSeek-V2-Lite's form (MLA: q_proj, kv_lora_rank 32, qk_nope 16, qk_rope 16,\n"
    "            v 16, so the served cache row is 16 rotating + 32 latent dims; layer 0 dense, then\n"
    "            DeepSeekMoE: 8 routed experts top-2 + 2 shared; YaRN factor 40 over 64 positions,\n"
    "            mscale = mscale_all_dim = 0.707), Llama-3-style tokenizer with BOS;\n"
    "            deepseek_v3-fp8: the same MLA shape as DeepSeek-V3 ships it: q-LoRA 48, the sigmoid noaux_tc\n"
    "            router (2 groups, top-1 group, x 2.5), 1 shared expert, an MTP layer, every projection in\n"
    "            FP8 E4M3 with 32x24 block scales (weight_scale_inv; partial edge blocks);\n"
    "            glm4_moe: GLM-4.5's layout (head_dim 32 from the config, half of it rotating split-half,\n"
    "            q/k/v biases, q/k norm, layer 0 dense, 8 experts top-2 with correction bias x 2.5,\n"
    "            1 shared expert, an MTP layer), Qwen-style tokenizer;\n"
    "            gpt_oss: gpt-oss's layout (attention sinks, q/k/v/o biases, even layers sliding over 16\n"
    "            tokens, YaRN factor 32 without truncation, 4 experts top-2 with router and expert\n"
    "            biases, interleaved gate/up, clamped SwiGLU, experts in MXFP4), Qwen-style tokenizer;\n"
    "            gemma3_text: Gemma 3 1B's layout (7 layers: 0-4 and 6 sliding over 16 tokens, 5 full;\n"
    "            head_dim 32, query_pre_attn_scalar 48, local RoPE 1e4 / global 1e6, (1 + w) norms, four per\n"
    "            layer, q/k norms, GeGLU, embedding x bf16(sqrt(hidden)), tied head); gemma3: the same\n"
    "            inside the multimodal wrapper (text_config, language_model.model. tensors, dummy vision\n"
    "            tensors) with linear RoPE scaling x8 on the full layers; both with the Llama-3-style\n"
    "            tokenizer, which prepends BOS (Gemma needs it);\n"
    "            qwen3_5: Qwen3.5's hybrid in its multimodal layout (text_config, model.language_model.\n"
    "            tensors, dummy model.visual.* and mtp.* tensors): 8 layers, full attention at 3 and 7 by\n"
    "            the default rule (no layer_types), Gated DeltaNet elsewhere (2 q/k heads of 16 serving 4\n"
    "            value heads of 16, conv kernel 4); gated attention with head_dim 64 of which 16 rotate\n"
    "            (rope_parameters, theta 1e7), (1 + w) norms, tied head; qwen3_5_moe: the same with 8\n"
    "            experts top-2 (fused gate_up_proj / down_proj) and a gated shared expert, untied;\n"
    "            both with the Qwen tokenizer (no BOS). --layers keeps the default rule (interval 4);\n"
    "            qwen3_next: Qwen3-Next's text-only layout (top-level config, model. tensors, mtp.* to\n"
    "            ignore) of qwen3_5_moe's shape, the DeltaNet projections fused and grouped per key head\n"
    "            (in_proj_qkvz, in_proj_ba), per-expert keys, norm_topk_prob, layer 1 dense\n"
    "            (mlp_only_layers [1], intermediate_size 128), untied, rope_theta 1e7 as a top-level key\n"
    "  --out     directory to create (must not exist or be empty)\n"
    "  --seed    weight seed (default 0)\n"
    "  --scale   std of the weights (default 0.02)\n"
    "  --layers, --head-dim, --kv-heads  override the family's shape (query heads = 2 x KV heads),\n"
    "            e.g. a real model's layer and head count with a tiny hidden size (deepseek_v2: --layers\n"
    "            only; its one latent KV head has no head-dim or KV-head count to set)\n";

// GPT-2 / HF ByteLevel: the printable bytes map to themselves, the other 68 to U+0100 + n. The
// vocabulary ids follow the same order (printable bytes first), as in GPT-2-derived vocabularies.
std::vector<std::string> byte_level_symbols() {
  std::vector<int> bs;
  for (int b = 0x21; b <= 0x7E; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  const std::set<int> printable(bs.begin(), bs.end());
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (!printable.count(b)) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) {
      s += char(cp);
    } else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
    return s;
  };
  std::vector<std::string> out;
  for (int c : cs) out.push_back(utf8(c));
  return out;
}

// "Ġ" is the ByteLevel symbol of a space, "Ċ" of a newline.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"Ġ", "t"},  {"h", "e"},   {"Ġ", "a"},  {"i", "n"},    {"Ġt", "he"}, {"e", "r"},   {"o", "n"},
    {"Ġ", "s"},  {"e", "d"},   {"Ġ", "w"},  {"o", "u"},    {"a", "n"},   {"r", "e"},   {"Ġ", "o"},
    {"i", "s"},  {"e", "n"},   {"Ġ", "b"},  {"Ġ", "c"},    {"n", "d"},   {"i", "t"},   {"Ġ", "f"},
    {"Ġ", "h"},  {"Ġ", "m"},   {"o", "r"},  {"in", "g"},   {"Ġa", "nd"}, {"Ġ", "d"},   {"a", "t"},
    {"e", "s"},  {"Ġ", "l"},   {"Ġ", "p"},  {"l", "l"},    {"Ġo", "f"},  {"Ġ", "G"},   {"o", "d"},
    {"ĠG", "od"}, {"Ġt", "h"}, {"Ġth", "at"}, {"Ġ", "L"},  {"Ġ", "u"},   {"Ġ", "i"},   {"Ġi", "n"},
    {"Ġ", "n"},  {"a", "s"},   {"Ċ", "Ċ"},  {"Ġ", "Ġ"},    {"Ġs", "a"},  {"i", "d"}};

const char* kLlama3Regex =
    R"RE((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)RE";
const char* kQwenRegex =
    R"RE((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)RE";

struct Tok {
  json tokenizer, tokenizer_config;
  int vocab_size = 0;
  int bos = -1, eos = -1;
};

Tok make_tokenizer(bool qwen) {
  json vocab = json::object();
  std::vector<std::string> syms = byte_level_symbols();
  std::set<std::string> have(syms.begin(), syms.end());
  for (size_t i = 0; i < syms.size(); ++i) vocab[syms[i]] = int(i);
  json merges = json::array();
  for (const auto& [a, b] : kMerges) {
    if (!have.count(a) || !have.count(b) || have.count(a + b)) {
      std::cerr << "kvq-make-tiny-hf: internal: bad merge '" << a << " " << b << "'\n";
      std::abort();
    }
    have.insert(a + b);
    vocab[a + b] = int(vocab.size());
    if (qwen)
      merges.push_back(json::array({a, b}));  // the newer ["a", "b"] form
    else
      merges.push_back(a + " " + b);          // the classic "a b" form
  }
  const std::vector<std::string> specials =
      qwen ? std::vector<std::string>{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
           : std::vector<std::string>{"<|begin_of_text|>", "<|end_of_text|>"};
  json added = json::array();
  const int base = int(vocab.size());
  for (size_t i = 0; i < specials.size(); ++i)
    added.push_back({{"id", base + int(i)}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  Tok t;
  t.vocab_size = base + int(specials.size());
  t.bos = qwen ? base : base;  // Qwen: config bos_token_id is <|endoftext|>, never prepended
  t.eos = qwen ? base : base + 1;
  const json split = {{"type", "Split"}, {"pattern", {{"Regex", qwen ? kQwenRegex : kLlama3Regex}}},
                      {"behavior", "Isolated"}, {"invert", false}};
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  json post;
  if (qwen) {
    post = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  } else {
    const json bos = {{"SpecialToken", {{"id", specials[0]}, {"type_id", 0}}}};
    post = {{"type", "TemplateProcessing"},
            {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                      {{"SpecialToken", {{"id", specials[0]}, {"type_id", 1}}}},
                      {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
            {"special_tokens", {{specials[0], {{"id", specials[0]}, {"ids", {base}}, {"tokens", {specials[0]}}}}}}};
  }
  t.tokenizer = {{"version", "1.0"},
                 {"truncation", nullptr},
                 {"padding", nullptr},
                 {"added_tokens", added},
                 {"normalizer", qwen ? json{{"type", "NFC"}} : json(nullptr)},
                 {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
                 {"post_processor", post},
                 {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                 {"model",
                  {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr},
                   {"end_of_word_suffix", nullptr},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"ignore_merges", !qwen},
                   {"vocab", vocab},
                   {"merges", merges}}}};
  if (qwen)
    t.tokenizer_config = {{"bos_token", nullptr}, {"eos_token", "<|endoftext|>"}, {"pad_token", "<|endoftext|>"},
                          {"add_prefix_space", false}, {"model_max_length", 512}, {"tokenizer_class", "Qwen2Tokenizer"}};
  else
    t.tokenizer_config = {{"bos_token", specials[0]}, {"eos_token", specials[1]}, {"model_max_length", 512},
                          {"tokenizer_class", "PreTrainedTokenizerFast"}};
  return t;
}

// deepseek_v3-fp8's weight_block_size (DeepSeek-V3 ships [128, 128]; at the tiny shape [32, 24]
// leaves partial blocks at the edges of every projection whose in-dim is 64).
constexpr int64_t kFp8Block[2] = {32, 24};

hf::Spec spec_for(const std::string& family, uint32_t seed, double scale) {
  hf::Spec s;
  s.hidden = 64;
  s.layers = 2;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.inter = 128;
  s.max_pos = 512;
  s.eps = 1e-5;
  s.seed = seed;
  s.scale = scale;
  s.embed_scale = scale;
  s.norm_jitter = 0.0;
  s.qk_norm_jitter = 0.0;
  s.router_scale = 0.5;  // decisive routing: top-k does not flip on tiny perturbations
  if (family == "llama3") {
    s.family = "llama";
    s.theta = 500000.0;
    s.extra["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  } else if (family == "qwen2") {
    s.family = "qwen2";
    s.theta = 1e6;
    s.eps = 1e-6;
  } else if (family == "qwen3") {
    s.family = "qwen3";
    s.head_dim = 32;  // explicit, != hidden / heads
    s.tied = true;
    s.theta = 1e6;
    s.eps = 1e-6;
  } else if (family == "qwen3-moe") {
    s.family = "qwen3_moe";
    s.layers = 3;
    s.experts = 8;
    s.top_k = 2;
    s.moe_inter = 32;
    s.norm_topk_prob = true;
    s.mlp_only_layers = {1};
    s.theta = 1e6;
    s.eps = 1e-6;
  } else if (family == "mixtral") {
    s.family = "mixtral";
    s.experts = 4;
    s.top_k = 2;
    s.inter = 64;
    s.theta = 1e6;
  } else if (family == "mistral-swa") {
    s.family = "mistral";
    s.sliding_window = 32;
  } else if (family == "chatglm" || family == "glm4") {
    s.family = family;
    s.head_dim = 128;  // GLM-4-9B's: 32 RoPE blocks and 64 static dims
    s.eps = 1.5625e-7;
    s.rope_ratio = 500.0;
    s.theta = 5e6;  // glm4: the base stated as rope_theta
    s.partial_rotary_factor = 0.5;
  } else if (family == "deepseek_v2") {
    s.family = family;
    s.layers = 3;
    s.kv_lora_rank = 32;
    s.qk_nope_head_dim = 16;
    s.qk_rope_head_dim = 16;
    s.v_head_dim = 16;
    s.experts = 8;
    s.top_k = 2;
    s.moe_inter = 32;
    s.n_shared_experts = 2;
    s.first_k_dense_replace = 1;
    s.norm_topk_prob = false;
    s.routed_scaling_factor = 1.0;
    s.eps = 1e-6;
    s.max_pos = 2560;
    s.extra["rope_scaling"] = {{"type", "yarn"},  {"factor", 40},         {"original_max_position_embeddings", 64},
                               {"beta_fast", 32}, {"beta_slow", 1},       {"mscale", 0.707},
                               {"mscale_all_dim", 0.707}};
  } else if (family == "deepseek_v3-fp8") {
    s = spec_for("deepseek_v2", seed, scale);
    s.family = "deepseek_v3";
    s.q_lora_rank = 48;
    s.topk_method = "noaux_tc";
    s.n_group = 2;
    s.topk_group = 1;
    s.norm_topk_prob = true;
    s.routed_scaling_factor = 2.5;
    s.n_shared_experts = 1;
    s.mtp = true;
    s.extra["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                      {"weight_block_size", {kFp8Block[0], kFp8Block[1]}}};
  } else if (family == "glm4_moe") {
    s.family = family;
    s.layers = 3;
    s.head_dim = 32;  // != hidden / heads: from the config
    s.partial_rotary_factor = 0.5;
    s.experts = 8;
    s.top_k = 2;
    s.moe_inter = 32;
    s.n_shared_experts = 1;
    s.first_k_dense_replace = 1;
    s.n_group = 1;
    s.topk_group = 1;
    s.norm_topk_prob = true;
    s.routed_scaling_factor = 2.5;
    s.mtp = true;
    s.theta = 1e6;
  } else if (family == "gpt_oss") {
    s.family = family;
    s.layers = 2;
    s.inter = 64;  // each expert's width; MXFP4 groups of 32 along hidden (64) and inter
    s.experts = 4;
    s.top_k = 2;
    s.sliding_window = 16;
    s.theta = 150000.0;
    s.yarn_factor = 32.0;
    s.yarn_original = 4096;
    s.max_pos = 131072;
    s.gate_up_scale = scale;
    s.bias_scale = scale;
  } else if (family == "gemma3_text" || family == "gemma3") {
    s.family = family;
    s.layers = 7;
    s.head_dim = 32;  // != hidden / heads
    s.query_pre_attn_scalar = 48;
    s.sliding_window = 16;
    s.theta = 1e6;
    s.rope_local_theta = 1e4;
    s.rope_linear_factor = family == "gemma3" ? 8.0 : 0.0;
    s.max_pos = 32768;
    s.eps = 1e-6;
    s.tied = true;
  } else if (family == "qwen3_5" || family == "qwen3_5_moe") {
    s.family = family;
    s.layers = 8;
    s.head_dim = 64;  // != hidden / heads
    s.partial_rotary_factor = 0.25;
    s.write_layer_types = false;
    s.lin_k_heads = 2;
    s.lin_v_heads = 4;
    s.lin_k_dim = 16;
    s.lin_v_dim = 16;
    s.theta = 1e7;
    s.max_pos = 262144;
    s.eps = 1e-6;
    s.tied = family == "qwen3_5";
    s.experts = 8;
    s.top_k = 2;
    s.moe_inter = 32;
    s.shared_inter = 32;
    s.lin_norm_jitter = 0.0;
  } else if (family == "qwen3_next") {
    s = spec_for("qwen3_5_moe", seed, scale);
    s.family = family;
    s.tied = false;
    s.norm_topk_prob = true;
    s.decoder_sparse_step = 1;
    s.mlp_only_layers = {1};
  } else {
    throw std::invalid_argument("--family: unknown '" + family +
                                "' (llama3, qwen2, qwen3, qwen3-moe, mixtral, mistral-swa, chatglm, glm4, deepseek_v2, "
                                "deepseek_v3-fp8, glm4_moe, gpt_oss, gemma3_text, gemma3, qwen3_5, qwen3_5_moe, "
                                "qwen3_next)");
  }
  return s;
}

// GLM: multiplies the q and k rows (weights and biases) of every head's static dims
// [head_dim * partial, head_dim) by `gain` (values stay BF16: rounded again).
void scale_static_qk(const hf::Spec& s, hf::TensorMap* w, double gain) {
  const int64_t hd = s.head_dim, rd = s.family == "chatglm" ? hd / 2 : int64_t(hd * s.partial_rotary_factor);
  const int64_t q_heads = s.heads, qk_heads = int64_t(s.heads) + s.kv_heads;
  for (int l = 0; l < s.layers; ++l) {
    // (tensor, first row of its q/k heads, number of q/k heads in it)
    std::vector<std::tuple<std::string, int64_t, int64_t>> parts;
    if (s.family == "chatglm") {
      const std::string p = "transformer.encoder.layers." + std::to_string(l) + ".self_attention.query_key_value.";
      parts = {{p + "weight", 0, qk_heads}, {p + "bias", 0, qk_heads}};
    } else {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      parts = {{p + "q_proj.weight", 0, q_heads}, {p + "q_proj.bias", 0, q_heads},
               {p + "k_proj.weight", 0, s.kv_heads}, {p + "k_proj.bias", 0, s.kv_heads}};
    }
    for (const auto& [name, row0, n_heads] : parts) {
      hf::Tensor& t = w->at(name);
      const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
      for (int64_t h = 0; h < n_heads; ++h)
        for (int64_t e = rd; e < hd; ++e) {
          const int64_t row = row0 + h * hd + e;
          for (int64_t c = 0; c < cols; ++c) {
            double& x = t.v[size_t(row * cols + c)];
            x = hf::bf16_round(x * gain);
          }
        }
    }
  }
}

int run(int argc, char** argv) {
  std::string family, out;
  uint32_t seed = 0;
  double scale = 0.02;
  int layers = 0, head_dim = 0, kv_heads = 0;  // 0 = the family's
  auto count = [](const std::string& flag, const std::string& v, int hi) {
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end || x < 1 || x > hi)
      throw std::invalid_argument(flag + ": expected an integer in 1.." + std::to_string(hi) + ", found '" + v + "'");
    return int(x);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (i + 1 >= argc) throw std::invalid_argument(a + ": missing value");
    const std::string v = argv[++i];
    if (a == "--family") {
      family = v;
    } else if (a == "--out") {
      out = v;
    } else if (a == "--seed") {
      char* end = nullptr;
      const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end || x > 0xFFFFFFFFull) throw std::invalid_argument("--seed: expected an integer in [0, 2^32), found '" + v + "'");
      seed = uint32_t(x);
    } else if (a == "--scale") {
      char* end = nullptr;
      scale = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(scale > 0 && scale < 10)) throw std::invalid_argument("--scale: expected a number in (0, 10), found '" + v + "'");
    } else if (a == "--layers") {
      layers = count(a, v, 128);
    } else if (a == "--head-dim") {
      head_dim = count(a, v, 256);
      if (head_dim % 2) throw std::invalid_argument("--head-dim: must be even (RoPE pairs), found " + v);
    } else if (a == "--kv-heads") {
      kv_heads = count(a, v, 64);
    } else {
      throw std::invalid_argument("unknown flag '" + a + "'");
    }
  }
  if (family.empty() || out.empty()) throw std::invalid_argument("--family and --out are required");
  hf::Spec s = spec_for(family, seed, scale);
  if (s.deepseek() && (head_dim || kv_heads))
    throw std::invalid_argument("--head-dim/--kv-heads: not settable for deepseek_v2 (one latent KV head)");
  if (layers) s.layers = layers;
  if (head_dim) s.head_dim = head_dim;
  if (kv_heads) {
    s.kv_heads = kv_heads;
    s.heads = 2 * kv_heads;
  }
  if (s.hybrid() && s.layers < s.full_attention_interval)
    throw std::invalid_argument("--layers: " + family + " needs at least " + std::to_string(s.full_attention_interval) +
                                " (full attention on every " + std::to_string(s.full_attention_interval) + "th layer)");
  if (s.hybrid() && int(s.head_dim * s.partial_rotary_factor) % 2)
    throw std::invalid_argument("--head-dim: " + family +
                                " rotates head_dim / 4 dims in pairs; a multiple of 8 is needed");
  // GLM-4's own tokenizer is a tiktoken rank file; these tiny models carry the Qwen-style
  // byte-level BPE tokenizer.json (no BOS), which the GLM-4 -hf repos also ship.
  // gpt-oss's own tokenizer (o200k_harmony) prepends no BOS either. Gemma 3's own tokenizer is
  // SentencePiece (<bos> = 2, prepended); its tiny models carry the Llama-3-style tokenizer.json,
  // whose template prepends BOS too (the BOS/EOS ids are that tokenizer's).
  const bool qwen = s.family == "qwen2" || s.family == "qwen3" || s.family == "qwen3_moe" || s.glm() || s.glm4_moe() ||
                    s.gpt_oss() || s.hybrid();
  const Tok tok = make_tokenizer(qwen);
  s.vocab = tok.vocab_size;
  s.bos_id = tok.bos;
  s.eos_id = tok.eos;
  namespace fs = std::filesystem;
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out)))
    throw std::invalid_argument("--out: '" + out + "' exists and is not an empty directory");
  fs::create_directories(out);
  hf::TensorMap w = hf::make_weights(s);
  if (s.glm()) scale_static_qk(s, &w, 3.0);
  if (s.extra.contains("quantization_config")) {  // DeepSeek-V3's FP8: every projection, not the router
    hf::quantize_fp8_blocks(w, kFp8Block[0], kFp8Block[1], [](const std::string& n) {
      for (const std::string tail : {"_proj.weight", "_proj_with_mqa.weight"})
        if (n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0) return true;
      return false;
    });
  }
  hf::write_model(out, hf::make_config(s), w, 2);
  hf::write_file(out + "/tokenizer.json", tok.tokenizer.dump(2));
  hf::write_file(out + "/tokenizer_config.json", tok.tokenizer_config.dump(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kvq-make-tiny-hf: " << e.what() << "\n";
    return 2;
  }
}
