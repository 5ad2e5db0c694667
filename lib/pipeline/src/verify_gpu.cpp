#include "verify_gpu.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#if KVQ_HAVE_CUDA
#include "kvq/cuda/cuda.hpp"
#include "kvq/cuda/kv_cache.hpp"
#endif

namespace kvq::pipeline_detail {

std::vector<int> attention_steps(int tokens) {
  std::vector<int> s;
  for (int n = 1; n < tokens; n *= 2) s.push_back(n);
  if (tokens > 0) s.push_back(tokens);
  return s;
}

GpuVerifier::GpuVerifier(bool wanted) {
#if KVQ_HAVE_CUDA
  on_ = wanted && kvq_cuda_available();
  if (on_) g_.device = cuda::device_name();
#else
  (void)wanted;
#endif
  g_.ran = on_;
}

#if KVQ_HAVE_CUDA
namespace {

// Bytes, and the integer codes (both unpacked by the CPU codec), where a differs from b; sizes
// that differ count every byte and code.
void count_mismatches(const codec::HeadCodec& c, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int T,
                      int64_t* bytes, int64_t* codes) {
  const size_t cd = static_cast<size_t>(c.code_dim());
  if (a.size() != b.size()) {
    *bytes += static_cast<int64_t>(std::max(a.size(), b.size()));
    *codes += static_cast<int64_t>(cd) * T;
    return;
  }
  for (size_t i = 0; i < a.size(); ++i) *bytes += a[i] != b[i];
  std::vector<uint8_t> ca(static_cast<size_t>(T) * cd), cb(ca.size());
  c.unpack_codes(a.data(), T, ca.data());
  c.unpack_codes(b.data(), T, cb.data());
  for (size_t i = 0; i < ca.size(); ++i) *codes += ca[i] != cb[i];
}

}  // namespace
#endif

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

void GpuVerifier::cache_layer(const GpuLayer& g) {
#if KVQ_HAVE_CUDA
  const int H = g.n_kv_heads, NH = g.n_q_heads, d = g.head_dim, M = g.windows, T = g.tokens;
  if (!on_ || M < 1 || T < 1 || H < 1) return;
  const std::string where = "layer " + std::to_string(g.layer);
  if (NH % H != 0 || NH / H > cuda::kMaxGqaGroup) {
    g_.notes.push_back(where + ": GQA group " + std::to_string(NH) + "/" + std::to_string(H) +
                       " beyond the fused kernel's " + std::to_string(cuda::kMaxGqaGroup) + ": no cache check");
    return;
  }
  int pre_rope = 0;
  for (const codec::HeadCodec* c : g.k) pre_rope += !c->decision().post_rope;
  if (g.rope.enabled && pre_rope > 0 && pre_rope < H) {
    g_.notes.push_back(where + ": K heads mix pre- and post-RoPE decisions (one kernel mode per layer): no cache check");
    return;
  }
  cuda::KvCacheSpec spec;
  spec.n_q_heads = NH;
  spec.n_kv_heads = H;
  spec.head_dim = d;
  spec.batch = M;
  spec.capacity = T;
  spec.rope = g.rope;
  cuda::KvCacheLayer layer;
  for (int h = 0; h < H; ++h) {
    layer.k.push_back(*g.k[static_cast<size_t>(h)]);
    layer.v.push_back(*g.v[static_cast<size_t>(h)]);
  }
  layer.window = g.window;
  spec.layers.push_back(std::move(layer));
  cuda::PackedKvCache cache(spec);

  // Each (window, KV head)'s rows contiguous [T][d], for the CPU encoder.
  const size_t hd = static_cast<size_t>(H) * d;
  auto head_rows = [&](const float* rows, int m, int h) {
    std::vector<float> r(static_cast<size_t>(T) * d);
    for (int t = 0; t < T; ++t)
      std::copy_n(rows + (static_cast<size_t>(m) * T + t) * hd + static_cast<size_t>(h) * d, d, r.data() + static_cast<size_t>(t) * d);
    return r;
  };
  std::vector<std::vector<float>> kr, vr;  // [m * H + h]
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < H; ++h) {
      kr.push_back(head_rows(g.k_rows, m, h));
      vr.push_back(head_rows(g.v_rows, m, h));
    }
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::iota(pos.begin(), pos.end(), 0);  // the cache's positions: the token index
  const size_t qd = static_cast<size_t>(NH) * d;
  std::vector<float> ks(static_cast<size_t>(M) * hd), vs(ks.size()), qs(static_cast<size_t>(M) * qd), out(qs.size()),
      ref(qd);
  const std::vector<int> steps = attention_steps(T);
  size_t next = 0;
  for (int t = 0; t < T; ++t) {
    for (int m = 0; m < M; ++m) {
      std::copy_n(g.k_rows + (static_cast<size_t>(m) * T + t) * hd, hd, ks.data() + static_cast<size_t>(m) * hd);
      std::copy_n(g.v_rows + (static_cast<size_t>(m) * T + t) * hd, hd, vs.data() + static_cast<size_t>(m) * hd);
    }
    cache.append_host(0, ks.data(), vs.data());
    if (next >= steps.size() || steps[next] != t + 1) continue;
    ++next;
    const int n = t + 1;
    for (int m = 0; m < M; ++m)
      std::copy_n(g.q_rows + (static_cast<size_t>(m) * T + t) * qd, qd, qs.data() + static_cast<size_t>(m) * qd);
    cache.attend_host(0, qs.data(), out.data());
    for (int m = 0; m < M; ++m) {
      // The reference on the CPU encoder's bytes of the same n tokens (a KIVI K head's last group
      // is coded from the tokens present, so the prefix is encoded afresh).
      std::vector<std::vector<uint8_t>> kp, vp;
      codec::AttentionProblem p;
      p.n_q_heads = NH;
      p.n_kv_heads = H;
      p.head_dim = d;
      p.n_tokens = n;
      p.window = g.window;
      p.q = qs.data() + static_cast<size_t>(m) * qd;
      p.positions = pos.data();
      p.rope = g.rope;
      for (int h = 0; h < H; ++h) {
        kp.push_back(g.k[static_cast<size_t>(h)]->encode(kr[static_cast<size_t>(m * H + h)].data(), n));
        vp.push_back(g.v[static_cast<size_t>(h)]->encode(vr[static_cast<size_t>(m * H + h)].data(), n));
      }
      for (int h = 0; h < H; ++h) {
        p.k_codecs.push_back(g.k[static_cast<size_t>(h)]);
        p.v_codecs.push_back(g.v[static_cast<size_t>(h)]);
        p.k_packed.push_back(kp[static_cast<size_t>(h)].data());
        p.v_packed.push_back(vp[static_cast<size_t>(h)].data());
      }
      codec::reference_decode_attention(p, ref.data());
      const float* o = out.data() + static_cast<size_t>(m) * qd;
      double mx = 0, e = 0;
      for (size_t i = 0; i < qd; ++i) {
        mx = std::max(mx, double(std::fabs(ref[i])));
        e = std::max(e, std::fabs(double(ref[i]) - double(o[i])));
      }
      g_.attention_problems += 1;
      g_.attention_max_abs_diff = std::max(g_.attention_max_abs_diff, e);
      g_.attention_max_scaled_diff = std::max(g_.attention_max_scaled_diff, e / (1.0 + mx));
    }
  }
  // The cache's bytes after the last step against the CPU encoder's of the whole window.
  const std::vector<int32_t> lens = cache.lengths(0);
  for (int m = 0; m < M; ++m) {
    for (int h = 0; h < H; ++h)
      for (Side s : {Side::kK, Side::kV}) {
        const codec::HeadCodec& c = *(s == Side::kK ? g.k : g.v)[static_cast<size_t>(h)];
        const std::vector<float>& rows = (s == Side::kK ? kr : vr)[static_cast<size_t>(m * H + h)];
        count_mismatches(c, c.encode(rows.data(), T), cache.packed(0, m, h, s), T, &g_.cache_byte_mismatches,
                         &g_.cache_code_mismatches);
      }
  }
  g_.cache_length_errors += std::count_if(lens.begin(), lens.end(), [T](int32_t l) { return l != T; });
  g_.cache_layers += 1;
  g_.cache_steps += static_cast<int64_t>(M) * T;
#else
  (void)g;
#endif
}

GpuCheck GpuVerifier::finish() const { return g_; }

}  // namespace kvq::pipeline_detail
