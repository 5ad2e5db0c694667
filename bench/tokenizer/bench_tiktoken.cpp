// tiktoken ranks-file throughput, one thread, MB/s of UTF-8 input: kvq's reader against npm
// js-tiktoken (OpenAI's tokenizer in JavaScript) on the cl100k_base ranks that js-tiktoken ships,
// written as a ranks file by tests/model/tiktoken_truth.js. Both encode the whole WikiText slice as
// one string; node reports its best of 3.
//   scripts/node-truth && build/bin/bench_tiktoken
// Needs node, ../shared/corpora/wikitext2-train-sample.txt and the npm cache (KVQ_NPM_CACHE,
// default ~/.cache/kvq-npm); without them each benchmark reports an error and is skipped.
#include <benchmark/benchmark.h>
#include <unistd.h>

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
const std::string kCorpus = std::string(KVQ_SHARED_DIR) + "/corpora/wikitext2-train-sample.txt";
const std::string kScript = std::string(KVQ_SOURCE_DIR) + "/tests/model/tiktoken_truth.js";

bool have_inputs() {
  return fs::exists(kCorpus) && fs::exists(npm_cache() + "/node_modules/js-tiktoken/package.json") &&
         std::system("command -v node >/dev/null 2>&1") == 0;
}
std::string node(const std::string& args) {
  return "NODE_PATH='" + npm_cache() + "/node_modules' timeout -k 10 300 node '" + kScript + "' " + args + " </dev/null";
}

// cl100k_base as a ranks file, written once; "" when node fails.
const std::string& ranks_file() {
  static const std::string path = [] {
    const std::string p = (fs::temp_directory_path() / ("kvq_bench_cl100k_" + std::to_string(::getpid()) + ".tiktoken")).string();
    if (std::system((node("--write-ranks '" + p + "'") + " >/dev/null").c_str()) != 0) return std::string();
    return p;
  }();
  return path;
}

void BM_KvqTiktoken(benchmark::State& state) {
  if (!have_inputs() || ranks_file().empty()) {
    state.SkipWithError("needs node, ../shared corpora and scripts/node-truth's cache");
    return;
  }
  const std::string text = kvq::read_file(kCorpus);
  auto tok = kvq::Tokenizer::load(ranks_file());
  size_t n = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text);
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["tokens"] = double(n);
}
BENCHMARK(BM_KvqTiktoken)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// One iteration: node encodes the text 3 times and reports its best time, used as manual time.
void BM_JsTiktokenNode(benchmark::State& state) {
  if (!have_inputs()) {
    state.SkipWithError("needs node, ../shared corpora and scripts/node-truth's cache");
    return;
  }
  const std::string cmd = node("--bench '" + kCorpus + "' 3");
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
BENCHMARK(BM_JsTiktokenNode)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (have_inputs() && !ranks_file().empty()) fs::remove(ranks_file());
  return 0;
}
