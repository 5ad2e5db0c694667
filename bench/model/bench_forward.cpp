// Forward throughput (tokens/s) of the two reference models on batches of causal windows, with and
// without a capture observer (which should cost only the observer's own work).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include <ATen/Parallel.h>

#include "kvq/model/model.hpp"

namespace {

const std::string kStories = KVQ_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kDemo = KVQ_SOURCE_DIR "/data/kvq-demo-llama";

const kvq::Model* model(const std::string& path, kvq::Precision p) {
  static std::map<std::pair<std::string, kvq::Precision>, std::unique_ptr<kvq::Model>> cache;
  auto& m = cache[{path, p}];
  kvq::Model::LoadOptions lo;
  lo.precision = p;
  if (!m && std::filesystem::exists(path)) m = std::make_unique<kvq::Model>(kvq::Model::load(path, lo));
  return m.get();
}

at::Tensor random_ids(int64_t B, int64_t T, int vocab) {
  std::mt19937 rng(1);
  std::vector<int64_t> v(size_t(B * T));
  for (auto& x : v) x = int64_t(rng() % uint32_t(vocab));
  return at::tensor(v, at::kLong).view({B, T});
}

struct NullObserver : kvq::CaptureObserver {
  void on_layer(const kvq::LayerCapture& c) override { benchmark::DoNotOptimize(c.k); }
};

// args: batch, seq, logits (0/1), observer (0/1)
void run(benchmark::State& state, const std::string& path, kvq::Precision p = kvq::Precision::kFp32) {
  const kvq::Model* m = model(path, p);
  if (!m) {
    state.SkipWithError(("missing " + path).c_str());
    return;
  }
  const int64_t B = state.range(0), T = state.range(1);
  const at::Tensor ids = random_ids(B, T, m->config().vocab_size);
  NullObserver obs;
  kvq::Model::ForwardOptions opts;
  opts.logits = state.range(2) != 0;
  if (state.range(3)) opts.observer = &obs;
  for (auto _ : state) {
    at::Tensor out = m->forward(ids, opts);
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * B * T);
  state.counters["threads"] = at::get_num_threads();
}

void BM_ForwardStories260K(benchmark::State& s) { run(s, kStories); }
void BM_ForwardDemo(benchmark::State& s) { run(s, kDemo); }
// The BF16 forward (--precision bf16) beside the fp32 one: the ratio of the two in one run.
void BM_ForwardStories260KBf16(benchmark::State& s) { run(s, kStories, kvq::Precision::kBf16); }
void BM_ForwardDemoBf16(benchmark::State& s) { run(s, kDemo, kvq::Precision::kBf16); }

void args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "T", "logits", "observer"});
  b->Args({8, 256, 1, 0})->Args({8, 256, 0, 1})->Args({1, 256, 1, 0})->Args({1, 1, 1, 0});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_ForwardStories260K)->Apply(args);
BENCHMARK(BM_ForwardDemo)->Apply(args);
BENCHMARK(BM_ForwardStories260KBf16)->Apply(args);
BENCHMARK(BM_ForwardDemoBf16)->Apply(args);

}  // namespace

// Threads: KVQ_BENCH_THREADS (default 1, so numbers are comparable on a shared machine), set for
// ATen and OpenBLAS alike through kvq::set_threads.
int main(int argc, char** argv) {
  const char* env = std::getenv("KVQ_BENCH_THREADS");
  kvq::set_threads(env ? std::atoi(env) : 1);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
