// kvq-eval's scoring (sliding_perplexity) on the demo model at --window 256 --stride 128 with a
// 3-bit uniform TQ-MSE cache: plain (no protected tokens) against --sink 4 --recent 128, the
// papers' protected cache. Counters: forwards_per_window (the goal is 1 for both; the multi-forward
// method it replaced made about window/2) and forward_tokens_per_scored_token (2 at stride =
// window/2, whatever the policy). The time ratio protected / plain is the ratio of the two rows'
// times (goal <= 1.5). One intra-op thread (KVQ_BENCH_THREADS overrides), so that CPU time is the
// whole work on a shared machine.
#include <benchmark/benchmark.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <memory>

#include "kvq/alloc/uniform.hpp"
#include "kvq/eval/kv_coder.hpp"
#include "kvq/eval/perplexity.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/atomic_file.hpp"

namespace {

const std::string kDemo = KVQ_SOURCE_DIR "/data/kvq-demo-llama";
const std::string kText = KVQ_SHARED_DIR "/corpora/wikitext2-train-sample.txt";

struct Setup {
  kvq::Model model = kvq::Model::load(kDemo);
  std::unique_ptr<kvq::KvCoder> coder;
  std::vector<int32_t> text;
  Setup() {
    const char* th = std::getenv("KVQ_BENCH_THREADS");
    kvq::set_threads(th ? std::atoi(th) : 1);
    const kvq::ModelConfig& c = model.config();
    kvq::alloc::Shape s{c.n_layers, c.n_kv_heads, c.head_dim};
    auto heads = kvq::alloc::allocate_uniform(s, kvq::Side::kK, 3).heads;
    const auto v = kvq::alloc::allocate_uniform(s, kvq::Side::kV, 3).heads;
    heads.insert(heads.end(), v.begin(), v.end());
    coder = std::make_unique<kvq::KvCoder>(c, heads, "bench");
    // Real text when ../shared has it, else the demo's psalm, repeated to 2048 tokens.
    const auto tok = kvq::Tokenizer::load(kDemo + "/tokenizer.model");
    std::string raw;
    try {
      raw = kvq::read_file(kText).substr(0, 1 << 16);
    } catch (const std::exception&) {
      raw = kvq::read_file(kDemo + "/psalm23.txt");
    }
    const auto ids = tok->encode(raw);
    while (text.size() < 2048) text.push_back(ids[text.size() % ids.size()]);
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

// args: sink, recent. max_batch_tokens = window: one window per forward, so forwards_per_window
// is exactly the forwards each window costs; else kvq-eval's default batching (16384 tokens).
void run(benchmark::State& state, int64_t max_batch_tokens) {
  Setup& s = setup();
  kvq::PplOptions o;
  o.window = 256;
  o.stride = 128;
  o.quiet = true;
  o.max_batch_tokens = max_batch_tokens ? max_batch_tokens : o.window;
  o.policy.sink = int(state.range(0));
  o.policy.recent = int(state.range(1));
  kvq::PplResult r;
  for (auto _ : state) {
    r = kvq::sliding_perplexity(s.model, s.text, o, s.coder.get());
    benchmark::ClobberMemory();  // (DoNotOptimize on a double member garbled it with this GCC)
  }
  state.SetItemsProcessed(state.iterations() * r.tokens);
  state.counters["windows"] = double(r.windows);
  state.counters["forwards_per_window"] = double(r.forwards) / double(r.windows);
  state.counters["forward_tokens_per_scored_token"] = double(r.forward_tokens) / double(r.tokens);
  state.counters["nll"] = r.nll();
  state.counters["threads"] = at::get_num_threads();
}

void BM_KvqEvalDemoWindow256(benchmark::State& s) { run(s, 16384); }
void BM_KvqEvalDemoWindow256OnePerForward(benchmark::State& s) { run(s, 0); }

}  // namespace

BENCHMARK(BM_KvqEvalDemoWindow256)->ArgNames({"sink", "recent"})->Args({0, 0})->Args({4, 128})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_KvqEvalDemoWindow256OnePerForward)->ArgNames({"sink", "recent"})->Args({0, 0})->Args({4, 128})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
