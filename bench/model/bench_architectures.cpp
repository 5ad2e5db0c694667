// Forward throughput (tokens/s) of each architecture on one shape (the demo model's: D 256, 4
// layers, 4/2 heads of 64, vocab 1024), from seeded untrained checkpoints written at start-up:
// llama (dense baseline, intermediate 512), qwen3 (+ q/k norm), qwen3_moe and mixtral (8 experts,
// top-2 of width 256: the same active MLP FLOPs as the baseline), mistral with a 64-token sliding
// window, GLM-4 in its chatglm (fused query_key_value) and glm4 (sandwich norms) forms (half of
// each head rotating, adjacent pairs), and DeepSeek-V2 (deepseek_v2: MLA served in the absorbed
// form, kv_lora_rank 128, qk_nope 32 + qk_rope 32 = the others' 64 per head, v 64, one 160-dim
// latent KV row per token; layer 0 dense, then 8 experts top-2 of width 256 plus one shared expert
// of width 256; YaRN factor 40), DeepSeek-V3 (the same with q-LoRA 128 and the noaux_tc router;
// also streamed, BF16 and FP8 blocks: the cost of converting each layer, and each routed expert,
// per forward) and GLM-4.5 (glm4_moe), gpt-oss, Gemma 3 and Qwen3.5 (dense and MoE: three Gated
// DeltaNet layers, then one gated-attention layer with the only KV cache), with and without a capture
// observer.
#include <benchmark/benchmark.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include "hf_tiny.hpp"
#include "kvq/model/model.hpp"

namespace {

namespace hf = kvq::test::hf;

hf::Spec spec(const std::string& family) {
  hf::Spec s;
  s.family = family;
  s.hidden = 256;
  s.layers = 4;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.inter = 512;
  s.vocab = 1024;
  s.scale = 0.05;
  if (family == "qwen3_moe" || family == "mixtral") {
    s.experts = 8;
    s.top_k = 2;
    s.moe_inter = 256;
    if (family == "mixtral") s.inter = 256;
  }
  if (family == "mistral") s.sliding_window = 64;
  if (family == "gemma3_text") {  // 5 local (64-token window, own RoPE) per global layer: 6 layers
    s.layers = 6;
    s.sliding_window = 64;
  }
  if (family == "gpt_oss") {  // MXFP4 experts (8, top-2, width 256), sinks, 64-token windows on even layers
    s.experts = 8;
    s.top_k = 2;
    s.inter = 256;
    s.sliding_window = 64;
    s.max_pos = 131072;
    s.gate_up_scale = 0.05;
  }
  if (family == "qwen3_5" || family == "qwen3_5_moe") {  // layers 0-2 Gated DeltaNet, 3 gated attention
    s.partial_rotary_factor = 0.25;
    s.lin_k_heads = 2;
    s.lin_v_heads = 4;
    s.lin_k_dim = 64;
    s.lin_v_dim = 64;
    s.lin_qk_overlap = 0.8;
    if (family == "qwen3_5_moe") {  // 8 experts top-2 of width 256 and a shared expert of 256
      s.experts = 8;
      s.top_k = 2;
      s.moe_inter = 256;
      s.shared_inter = 256;
    }
  }
  if (family == "glm4_moe") {  // head_dim 64, half rotating split-half, q/k norm, the noaux router
    s.experts = 8;
    s.top_k = 2;
    s.moe_inter = 256;
    s.n_shared_experts = 1;
    s.first_k_dense_replace = 1;
    s.mtp = true;
  }
  if (family == "deepseek_v2" || family == "deepseek_v3") {
    s.kv_lora_rank = 128;
    s.qk_nope_head_dim = 32;
    s.qk_rope_head_dim = 32;
    s.v_head_dim = 64;
    s.experts = 8;
    s.top_k = 2;
    s.moe_inter = 256;
    s.n_shared_experts = 1;
    s.first_k_dense_replace = 1;
    s.max_pos = 163840;
    s.extra["rope_scaling"] = {{"type", "yarn"},  {"factor", 40},    {"original_max_position_embeddings", 4096},
                               {"mscale", 0.707}, {"mscale_all_dim", 0.707}};
    if (family == "deepseek_v3") {  // the noaux_tc router in 4 groups (top-2), x 2.5, an MTP layer
      s.q_lora_rank = 128;
      s.topk_method = "noaux_tc";
      s.n_group = 4;
      s.topk_group = 2;
      s.norm_topk_prob = true;
      s.routed_scaling_factor = 2.5;
      s.mtp = true;
    }
  }
  return s;
}

// Every projection of a DeepSeek-V3 checkpoint in FP8 E4M3 with 128x128 block scales, as it ships.
bool is_projection(const std::string& n) {
  for (const std::string tail : {"_proj.weight", "_proj_with_mqa.weight"})
    if (n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0) return true;
  return false;
}

// family, or family + ":fp8" (FP8 blocks) and/or ":stream" (layers converted per forward; a MoE
// layer's routed experts one at a time, when routed to).
const kvq::Model* model(const std::string& key) {
  static std::map<std::string, std::unique_ptr<kvq::Model>> cache;
  auto& m = cache[key];
  if (!m) {
    const std::string family = key.substr(0, key.find(':'));
    const bool fp8 = key.find(":fp8") != std::string::npos, stream = key.find(":stream") != std::string::npos;
    std::string name = key;
    for (char& c : name) c = c == ':' ? '_' : c;
    const std::string dir = (std::filesystem::temp_directory_path() / ("kvq_bench_arch_" + name)).string();
    std::filesystem::remove_all(dir);
    hf::Spec s = spec(family);
    if (fp8)
      s.extra["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
    hf::TensorMap w = hf::make_weights(s);
    if (fp8) hf::quantize_fp8_blocks(w, 128, 128, is_projection);
    hf::write_model(dir, hf::make_config(s), w, 2);
    kvq::Model::LoadOptions lo;
    lo.stream = stream;
    m = std::make_unique<kvq::Model>(kvq::Model::load(dir, lo));
    std::filesystem::remove_all(dir);  // a streamed model keeps its files mapped
  }
  return m.get();
}

struct NullObserver : kvq::CaptureObserver {
  void on_layer(const kvq::LayerCapture& c) override { benchmark::DoNotOptimize(c.k); }
};

// args: batch, seq, observer (0/1)
void run(benchmark::State& state, const std::string& family) {
  const kvq::Model* m = model(family);
  const int64_t B = state.range(0), T = state.range(1);
  std::mt19937 rng(1);
  std::vector<int64_t> v(static_cast<size_t>(B * T));
  for (auto& x : v) x = int64_t(rng() % uint32_t(m->config().vocab_size));
  const at::Tensor ids = at::tensor(v, at::kLong).view({B, T});
  NullObserver obs;
  kvq::Model::ForwardOptions opts;
  if (state.range(2)) opts.observer = &obs;
  for (auto _ : state) {
    at::Tensor out = m->forward(ids, opts);
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * B * T);
  state.counters["threads"] = at::get_num_threads();
}

void args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "T", "observer"});
  b->Args({8, 256, 0})->Args({8, 256, 1})->Args({1, 1024, 0});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
void BM_Llama(benchmark::State& s) { run(s, "llama"); }
void BM_Qwen3(benchmark::State& s) { run(s, "qwen3"); }
void BM_Qwen3Moe(benchmark::State& s) { run(s, "qwen3_moe"); }
void BM_Mixtral(benchmark::State& s) { run(s, "mixtral"); }
void BM_MistralSwa64(benchmark::State& s) { run(s, "mistral"); }
void BM_Chatglm(benchmark::State& s) { run(s, "chatglm"); }
void BM_Glm4(benchmark::State& s) { run(s, "glm4"); }
void BM_DeepseekV2(benchmark::State& s) { run(s, "deepseek_v2"); }
void BM_DeepseekV3(benchmark::State& s) { run(s, "deepseek_v3"); }
void BM_DeepseekV3Stream(benchmark::State& s) { run(s, "deepseek_v3:stream"); }
void BM_DeepseekV3Fp8Stream(benchmark::State& s) { run(s, "deepseek_v3:fp8:stream"); }
void BM_Glm4Moe(benchmark::State& s) { run(s, "glm4_moe"); }
void BM_GptOss(benchmark::State& s) { run(s, "gpt_oss"); }
void BM_Gemma3(benchmark::State& s) { run(s, "gemma3_text"); }
void BM_GptOssStream(benchmark::State& s) { run(s, "gpt_oss:stream"); }
void BM_Qwen3_5(benchmark::State& s) { run(s, "qwen3_5"); }
void BM_Qwen3_5Moe(benchmark::State& s) { run(s, "qwen3_5_moe"); }
BENCHMARK(BM_Llama)->Apply(args);
BENCHMARK(BM_Qwen3)->Apply(args);
BENCHMARK(BM_Qwen3Moe)->Apply(args);
BENCHMARK(BM_Mixtral)->Apply(args);
BENCHMARK(BM_MistralSwa64)->Apply(args);
BENCHMARK(BM_Chatglm)->Apply(args);
BENCHMARK(BM_Glm4)->Apply(args);
BENCHMARK(BM_DeepseekV2)->Apply(args);
BENCHMARK(BM_DeepseekV3)->Apply(args);
BENCHMARK(BM_DeepseekV3Stream)->Apply(args);
BENCHMARK(BM_DeepseekV3Fp8Stream)->Apply(args);
BENCHMARK(BM_Glm4Moe)->Apply(args);
BENCHMARK(BM_GptOss)->Apply(args);
BENCHMARK(BM_Gemma3)->Apply(args);
BENCHMARK(BM_GptOssStream)->Apply(args);
BENCHMARK(BM_Qwen3_5)->Apply(args);
BENCHMARK(BM_Qwen3_5Moe)->Apply(args);

}  // namespace

// Threads: KVQ_BENCH_THREADS (default 1), as bench_model_forward.
int main(int argc, char** argv) {
  const char* env = std::getenv("KVQ_BENCH_THREADS");
  kvq::set_threads(env ? std::atoi(env) : 1);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
