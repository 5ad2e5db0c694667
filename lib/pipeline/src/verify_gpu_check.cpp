// The GPU cache check's logic (verify_gpu.hpp: check_cache_layer), free of CUDA: kvq-verify runs
// it against kvq::cuda::PackedKvCache (verify_gpu.cpp), tests/cuda/test_verify_gpu_emulation.cpp
// against the kernels' CPU emulation, which compiles this file into the test.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "verify_gpu.hpp"

namespace kvq::pipeline_detail {

std::vector<int> attention_steps(int tokens) {
  std::vector<int> s;
  for (int n = 1; n < tokens; n *= 2) s.push_back(n);
  if (tokens > 0) s.push_back(tokens);
  return s;
}

std::string cache_unsupported(const GpuLayer& g, int max_gqa_group) {
  const int H = g.n_kv_heads, NH = g.n_q_heads;
  const std::string where = "layer " + std::to_string(g.layer);
  if (H < 1 || NH % H != 0 || NH / H > max_gqa_group)
    return where + ": GQA group " + std::to_string(NH) + "/" + std::to_string(H) + " beyond the fused kernel's " +
           std::to_string(max_gqa_group) + ": no cache check";
  int pre_rope = 0;
  for (const codec::HeadCodec* c : g.k) pre_rope += !c->decision().post_rope;
  if (g.rope.enabled && pre_rope > 0 && pre_rope < H)
    return where + ": K heads mix pre- and post-RoPE decisions (one kernel mode per layer): no cache check";
  return "";
}

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

void check_cache_layer(const GpuLayer& g, CacheUnderTest& cache, GpuCheck& out) {
  const int H = g.n_kv_heads, NH = g.n_q_heads, d = g.head_dim, M = g.windows, T = g.tokens;
  if (M < 1 || T < 1 || H < 1) return;
  // Each (window, KV head)'s rows contiguous [T][d], for the CPU encoder.
  const size_t hd = static_cast<size_t>(H) * d;
  auto head_rows = [&](const float* rows, int m, int h) {
    std::vector<float> r(static_cast<size_t>(T) * d);
    for (int t = 0; t < T; ++t)
      std::copy_n(rows + (static_cast<size_t>(m) * T + t) * hd + static_cast<size_t>(h) * d, d,
                  r.data() + static_cast<size_t>(t) * d);
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
  std::vector<float> ks(static_cast<size_t>(M) * hd), vs(ks.size()), qs(static_cast<size_t>(M) * qd), o(qs.size()),
      ref(qd);
  const std::vector<int> steps = attention_steps(T);
  size_t next = 0;
  for (int t = 0; t < T; ++t) {
    for (int m = 0; m < M; ++m) {
      std::copy_n(g.k_rows + (static_cast<size_t>(m) * T + t) * hd, hd, ks.data() + static_cast<size_t>(m) * hd);
      std::copy_n(g.v_rows + (static_cast<size_t>(m) * T + t) * hd, hd, vs.data() + static_cast<size_t>(m) * hd);
    }
    cache.append(ks.data(), vs.data());
    if (next >= steps.size() || steps[next] != t + 1) continue;
    ++next;
    const int n = t + 1;
    for (int m = 0; m < M; ++m)
      std::copy_n(g.q_rows + (static_cast<size_t>(m) * T + t) * qd, qd, qs.data() + static_cast<size_t>(m) * qd);
    cache.attend(qs.data(), o.data());
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
      const float* om = o.data() + static_cast<size_t>(m) * qd;
      double mx = 0, e = 0;
      for (size_t i = 0; i < qd; ++i) {
        mx = std::max(mx, double(std::fabs(ref[i])));
        const double di = std::fabs(double(ref[i]) - double(om[i]));
        e = std::isnan(di) ? INFINITY : std::max(e, di);  // a NaN output must fail, not vanish in max
      }
      out.attention_problems += 1;
      out.attention_max_abs_diff = std::max(out.attention_max_abs_diff, e);
      out.attention_max_scaled_diff = std::max(out.attention_max_scaled_diff, e / (1.0 + mx));
    }
  }
  // The cache's bytes after the last step against the CPU encoder's of the whole window.
  const std::vector<int32_t> lens = cache.lengths();
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < H; ++h)
      for (Side s : {Side::kK, Side::kV}) {
        const codec::HeadCodec& c = *(s == Side::kK ? g.k : g.v)[static_cast<size_t>(h)];
        const std::vector<float>& rows = (s == Side::kK ? kr : vr)[static_cast<size_t>(m * H + h)];
        count_mismatches(c, c.encode(rows.data(), T), cache.packed(m, h, s), T, &out.cache_byte_mismatches,
                         &out.cache_code_mismatches);
      }
  out.cache_length_errors += std::count_if(lens.begin(), lens.end(), [T](int32_t l) { return l != T; });
  out.cache_layers += 1;
  out.cache_steps += static_cast<int64_t>(M) * T;
}

}  // namespace kvq::pipeline_detail
