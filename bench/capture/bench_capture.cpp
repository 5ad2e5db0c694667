// Capture overhead: forward with the statistics observer vs the bare forward, same model, same
// windows, same process. Report the ratio of tokens/s (goal: capture >= bare / 1.10). The
// *_amax runs also take the activation maxima (post-RoPE K and Q, V; calibration format 3).
#include <benchmark/benchmark.h>

#include <filesystem>
#include <random>

#include "kvq/model/model.hpp"
#include "kvq/stats/moments.hpp"

namespace {

class Accumulate : public kvq::CaptureObserver {
 public:
  explicit Accumulate(kvq::Moments& m) : m_(m) {}
  void on_layer(const kvq::LayerCapture& c) override { m_.accumulate(c); }

 private:
  kvq::Moments& m_;
};

at::Tensor windows(const kvq::Model& m, int B, int T) {
  std::mt19937 g(1);
  std::uniform_int_distribution<int> tok(3, m.config().vocab_size - 1);
  at::Tensor ids = at::empty({B, T}, at::kLong);
  for (int i = 0; i < B * T; ++i) ids.data_ptr<int64_t>()[i] = i % T == 0 ? 1 : tok(g);
  return ids;
}

void run(benchmark::State& st, const std::string& path, bool capture, bool logits, bool amax = false) {
  if (!std::filesystem::exists(path)) {
    st.SkipWithError(("missing " + path).c_str());
    return;
  }
  kvq::set_threads(1);
  kvq::Model m = kvq::Model::load(path);
  const auto& c = m.config();
  kvq::Moments mom(kvq::MomentShape{c.n_layers, c.n_kv_heads, c.n_heads, c.head_dim});
  if (amax) {
    const kvq::RopeParams rp = kvq::rope_params(c, 256);
    mom.set_amax_rope(c.pairing, c.rotary_dim, rp.inv_freq, rp.attention_factor);
  }
  Accumulate obs(mom);
  at::Tensor ids = windows(m, 4, 256);
  kvq::Model::ForwardOptions fo;
  fo.observer = capture ? &obs : nullptr;
  fo.logits = logits;
  for (auto _ : st) benchmark::DoNotOptimize(m.forward(ids, fo));
  st.SetItemsProcessed(st.iterations() * ids.numel());
}

const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";
const std::string kStories = std::string(KVQ_SHARED_DIR) + "/models/stories260K/stories260K.bin";

}  // namespace

// "bare" is the plain forward with logits (what a user's forward costs); capture runs skip the
// lm_head as calib-capture does, so the ratio is capture tokens/s over bare tokens/s.
BENCHMARK_CAPTURE(run, demo_bare, kDemo, false, true)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(run, demo_capture, kDemo, true, false)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(run, demo_capture_amax, kDemo, true, false, true)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(run, demo_capture_with_logits, kDemo, true, true)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(run, stories_bare, kStories, false, true)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(run, stories_capture, kStories, true, false)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(run, stories_capture_amax, kStories, true, false, true)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(run, stories_capture_with_logits, kStories, true, true)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_MAIN();
