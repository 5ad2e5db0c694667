#include "verify_gpu.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#if KVQ_HAVE_CUDA
#include "kvq/cuda/cuda.hpp"
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

void GpuVerifier::check_side(const codec::HeadCodec& c, const float* rows, int T, std::vector<uint8_t>& gpu_packed) {
#if KVQ_HAVE_CUDA
  if (!on_ || T <= 0) return;
  const int d = c.head_dim();
  const size_t cd = static_cast<size_t>(c.code_dim());
  const std::vector<uint8_t> cpu_packed = c.encode(rows, T);
  const cuda::DeviceHead dev(c);
  gpu_packed.assign(cpu_packed.size(), 0);
  dev.encode(rows, T, gpu_packed.data());
  for (size_t i = 0; i < cpu_packed.size(); ++i) g_.byte_mismatches += cpu_packed[i] != gpu_packed[i];
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
  (void)c, (void)rows, (void)T, (void)gpu_packed;
#endif
}

void GpuVerifier::attention(const codec::AttentionProblem& p) {
#if KVQ_HAVE_CUDA
  // Beyond the kernel's GQA limit there is no GPU attention to check (attention_problems shows it).
  if (!on_ || p.n_kv_heads <= 0 || p.n_q_heads / p.n_kv_heads > cuda::kMaxGqaGroup) return;
  const size_t n = static_cast<size_t>(p.n_q_heads) * static_cast<size_t>(p.head_dim);
  std::vector<float> cpu(n), gpu(n);
  codec::reference_decode_attention(p, cpu.data());
  cuda::decode_attention(p, gpu.data());
  double mx = 0, e = 0;
  for (size_t i = 0; i < n; ++i) {
    mx = std::max(mx, double(std::fabs(cpu[i])));
    e = std::max(e, double(std::fabs(cpu[i] - gpu[i])));
  }
  g_.attention_problems += 1;
  g_.attention_max_abs_diff = std::max(g_.attention_max_abs_diff, e);
  g_.attention_max_scaled_diff = std::max(g_.attention_max_scaled_diff, e / (1.0 + mx));
#else
  (void)p;
#endif
}

GpuCheck GpuVerifier::finish() const { return g_; }

}  // namespace kvq::pipeline_detail
