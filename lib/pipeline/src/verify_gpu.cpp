#include "verify_gpu.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#if KVQ_HAVE_CUDA
#include "kvq/cuda/cuda.hpp"
#include "kvq/cuda/kv_cache.hpp"
#endif

namespace kvq::pipeline_detail {

GpuVerifier::GpuVerifier(bool wanted) {
#if KVQ_HAVE_CUDA
  on_ = wanted && kvq_cuda_available();
  if (on_) g_.device = cuda::device_name();
#else
  (void)wanted;
#endif
  g_.ran = on_;
}

void GpuVerifier::limit_dims(int d, int dv) {
#if KVQ_HAVE_CUDA
  if (!on_ || std::max(d, dv) <= cuda::kMaxHeadDim) return;
  on_ = false;
  g_.ran = false;
  g_.skipped = "not run on " + g_.device + ": head dims K " + std::to_string(d) + ", V " + std::to_string(dv) +
               " are above the GPU kernels' " + std::to_string(cuda::kMaxHeadDim) + "; CPU reference only";
#else
  (void)d;
  (void)dv;
#endif
}

void GpuVerifier::note(std::string text) { g_.notes.push_back(std::move(text)); }

void GpuVerifier::check_side(const codec::HeadCodec& c, const float* rows, int T) {
#if KVQ_HAVE_CUDA
  if (!on_ || T <= 0) return;
  const int d = c.head_dim();
  const std::vector<uint8_t> cpu_packed = c.encode(rows, T);
  const cuda::DeviceHead dev(c);
  std::vector<uint8_t> gpu_packed(cpu_packed.size(), 0);
  dev.encode(rows, T, gpu_packed.data());
  for (size_t i = 0; i < cpu_packed.size(); ++i) g_.byte_mismatches += cpu_packed[i] != gpu_packed[i];
  // Codes as each side's own unpacker reads them.
  const size_t cd = static_cast<size_t>(c.code_dim());
  std::vector<uint8_t> cc(static_cast<size_t>(T) * cd), gc(cc.size());
  c.unpack_codes(cpu_packed.data(), T, cc.data());
  dev.unpack_codes(gpu_packed.data(), T, gc.data());
  for (size_t i = 0; i < cc.size(); ++i) g_.code_mismatches += cc[i] != gc[i];
  std::vector<float> xc(static_cast<size_t>(T) * d), xg(xc.size());
  c.decode(cpu_packed.data(), T, xc.data());
  dev.decode(gpu_packed.data(), T, xg.data());
  for (int t = 0; t < T; ++t) {
    const float* a = xc.data() + static_cast<size_t>(t) * d;
    const float* b = xg.data() + static_cast<size_t>(t) * d;
    double n2 = 0;
    for (int i = 0; i < d; ++i) n2 += double(a[i]) * a[i];
    const double scale = 1.0 + std::sqrt(n2);
    for (int i = 0; i < d; ++i) {
      const double e = std::fabs(double(a[i]) - double(b[i]));
      g_.max_abs_diff = std::max(g_.max_abs_diff, e);
      g_.max_scaled_diff = std::max(g_.max_scaled_diff, e / scale);
    }
  }
  (c.decision().side == Side::kK ? g_.k_head_windows : g_.v_head_windows) += 1;
  g_.tokens += T;
#else
  (void)c, (void)rows, (void)T;
#endif
}

#if KVQ_HAVE_CUDA
namespace {

// PackedKvCache of one layer on the GPU, host buffers in and out.
class GpuCache final : public CacheUnderTest {
 public:
  explicit GpuCache(const GpuLayer& g) : cache_(spec(g)) {}
  void append(const float* k, const float* v) override { cache_.append_host(0, k, v); }
  void attend(const float* q, float* out) override { cache_.attend_host(0, q, out); }
  std::vector<int32_t> lengths() override { return cache_.lengths(0); }
  std::vector<uint8_t> packed(int seq, int kv_head, Side side) override { return cache_.packed(0, seq, kv_head, side); }

 private:
  static cuda::KvCacheSpec spec(const GpuLayer& g) {
    cuda::KvCacheSpec s;
    s.n_q_heads = g.n_q_heads;
    s.n_kv_heads = g.n_kv_heads;
    s.head_dim = g.head_dim;
    s.batch = g.windows;
    s.capacity = g.tokens;
    s.rope = g.rope;
    cuda::KvCacheLayer layer;
    for (size_t h = 0; h < g.k.size(); ++h) {
      layer.k.push_back(*g.k[h]);
      layer.v.push_back(*g.v[h]);
    }
    layer.window = g.window;
    s.layers.push_back(std::move(layer));
    return s;
  }
  cuda::PackedKvCache cache_;
};

}  // namespace
#endif

void GpuVerifier::cache_layer(const GpuLayer& g) {
#if KVQ_HAVE_CUDA
  if (!on_ || g.windows < 1 || g.tokens < 1) return;
  const std::string why = cache_unsupported(g, cuda::kMaxGqaGroup);
  if (!why.empty()) {
    g_.notes.push_back(why);
    return;
  }
  GpuCache cache(g);
  check_cache_layer(g, cache, g_);
#else
  (void)g;
#endif
}

GpuCheck GpuVerifier::finish() const { return g_; }

}  // namespace kvq::pipeline_detail
