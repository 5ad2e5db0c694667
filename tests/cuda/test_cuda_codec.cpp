// CUDA decoder and fused attention against the CPU reference (CONVENTIONS 9):
//  - integer codes: exact;
//  - latents (per-token values before the back-transform): |gpu - cpu| <= 1e-6 * (1 + |cpu|)
//    (same formulas, same rounding; the slack only covers a compiler contracting to FMA);
//    TQ with norm correction 1e-5 * (1 + |cpu|): the GPU sums ||c||^2 of a group in float, the
//    CPU in double (m <= 256 positive terms: relative error <= 255 * 2^-24 = 1.5e-5 on the sum,
//    half that on the norm);
//  - decoded x: |gpu - cpu| <= 2e-5 * (1 + ||x_t||) per element (summation order differs);
//  - attention outputs: |gpu - cpu| <= 2e-4 * (1 + max |out|) (float accumulation and softmax
//    vs the CPU's double; RoPE angles in double on both sides, the kernel's sine and cosine in
//    float after a double range reduction: a few 1e-7).
// On a mismatch the inputs are written to cuda_failure_<test>.txt in the working directory.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/codec/layout.hpp"
#include "kvq/cuda/cuda.hpp"
#include "kvq/util/error.hpp"
#include "test_util.hpp"

namespace kvq::cuda {
namespace {

using codec::HeadCodec;
namespace t = codec::test;

#define REQUIRE_GPU() \
  if (!kvq_cuda_available()) GTEST_SKIP() << "no CUDA device (the kernels still compiled and linked)"

std::string dump(const std::string& name, const std::string& what, const HeadCodec& c, int n,
                 const std::vector<float>& x, const std::vector<uint8_t>& packed) {
  const std::string path = "cuda_failure_" + name + ".txt";
  std::ofstream f(path);
  f << what << "\n" << codec::decision_name(c.decision()) << " kind=" << static_cast<int>(c.decision().kind)
    << " d=" << c.head_dim() << " T=" << n << " block_bytes=" << c.layout().block_bytes << "\n";
  f << "x:";
  for (float v : x) f << " " << v;
  f << "\npacked:" << std::hex;
  for (uint8_t b : packed) f << " " << static_cast<int>(b);
  f << "\n";
  return path;
}

TEST(Cuda, AvailabilityIsConsistent) {
  const bool a = kvq_cuda_available();
  EXPECT_EQ(a, kvq_cuda_available());
  if (!a) {
    HeadCodec c(t::tq_uniform(8, 3), 8);
    EXPECT_THROW(DeviceHead{c}, Error);
  }
}

std::vector<std::pair<std::string, HeadDecision>> decisions(int d) {
  std::vector<std::pair<std::string, HeadDecision>> v;
  for (int b : {1, 2, 3, 4, 5, 8}) {
    v.emplace_back("tq_b" + std::to_string(b), t::tq_uniform(d, b));
    v.emplace_back("lrh_b" + std::to_string(b), t::with_mean(t::lrh(d, std::max(1, d * 3 / 4 - 1), b)));
    v.emplace_back("kiviK_b" + std::to_string(b), t::kivi(Side::kK, b));
    v.emplace_back("kiviV_b" + std::to_string(b), t::kivi(Side::kV, b));
  }
  v.emplace_back("gtq", t::tq_blocks(d, {1, 2, 3, 4, 5, 6, 7, 8}));
  // Norm correction (allocation version 2): same codes, rescaled latents.
  for (int b : {1, 2, 3, 4, 8}) v.emplace_back("tq_nc_b" + std::to_string(b), t::norm_corrected(t::tq_uniform(d, b)));
  v.emplace_back("gtq_nc", t::norm_corrected(t::tq_blocks(d, {1, 2, 3, 4, 5, 6, 7, 8})));
  v.emplace_back("gtq_nc_rot3", t::rotate_below(t::norm_corrected(t::tq_blocks(d, {1, 2, 3, 4, 5, 6, 7, 8})), 3));
  // Compact group norms (allocation version 4): one record, the norm levels and ratios uploaded.
  v.emplace_back("gtq_compact8", t::compact_norms(t::tq_blocks(d, {1, 2, 3, 4, 5, 6, 7, 8}), d, 8));
  v.emplace_back("gtq_nc_compact4", t::norm_corrected(t::compact_norms(t::tq_blocks(d, {1, 2, 3, 4, 5, 6, 7, 8}), d, 4)));
  v.emplace_back("lrh_full", t::lrh(d, d, 4));
  v.emplace_back("lrh_r1", t::lrh(d, 1, 3));
  return v;
}

TEST(Cuda, DecoderMatchesCpuReference) {
  REQUIRE_GPU();
  for (int d : {8, 64, 96, 128, 256}) {
    for (const auto& [name, dec] : decisions(d)) {
      HeadCodec c(dec, d);
      DeviceHead dev(c);
      const int n = 77;
      const std::vector<float> x = t::gaussian_rows(n, d, 31 + d, 2.0);
      const std::vector<uint8_t> packed = c.encode(x.data(), n);
      const std::string id = name + "_d" + std::to_string(d);
      const size_t cd = static_cast<size_t>(c.code_dim());

      std::vector<uint8_t> codes_cpu(n * cd), codes_gpu(n * cd);
      c.unpack_codes(packed.data(), n, codes_cpu.data());
      dev.unpack_codes(packed.data(), n, codes_gpu.data());
      if (codes_cpu != codes_gpu) ADD_FAILURE() << id << ": codes differ; inputs in " << dump(id, "codes", c, n, x, packed);

      std::vector<float> lat_cpu(n * cd), lat_gpu(n * cd);
      c.decode_latent(packed.data(), n, lat_cpu.data());
      dev.decode_latent(packed.data(), n, lat_gpu.data());
      const float lat_tol = c.decision().norm_correction ? 1e-5f : 1e-6f;
      for (size_t i = 0; i < lat_cpu.size(); ++i)
        if (std::fabs(lat_cpu[i] - lat_gpu[i]) > lat_tol * (1 + std::fabs(lat_cpu[i]))) {
          ADD_FAILURE() << id << ": latent " << i << " cpu " << lat_cpu[i] << " gpu " << lat_gpu[i]
                        << "; inputs in " << dump(id, "latent", c, n, x, packed);
          break;
        }

      std::vector<float> y_cpu(static_cast<size_t>(n) * d), y_gpu(y_cpu.size());
      c.decode(packed.data(), n, y_cpu.data());
      dev.decode(packed.data(), n, y_gpu.data());
      bool ok = true;
      for (int tok = 0; tok < n && ok; ++tok) {
        double nrm = 0;
        for (int i = 0; i < d; ++i) nrm += double(y_cpu[static_cast<size_t>(tok) * d + i]) * y_cpu[static_cast<size_t>(tok) * d + i];
        const double tol = 2e-5 * (1 + std::sqrt(nrm));
        for (int i = 0; i < d && ok; ++i) {
          const size_t k = static_cast<size_t>(tok) * d + i;
          if (std::fabs(y_cpu[k] - y_gpu[k]) > tol) {
            ok = false;
            ADD_FAILURE() << id << ": x[" << tok << "][" << i << "] cpu " << y_cpu[k] << " gpu " << y_gpu[k]
                          << "; inputs in " << dump(id, "decode", c, n, x, packed);
          }
        }
      }
    }
  }
}

struct AttnCase {
  std::string name;
  int d, n_q, n_kv, T;
  std::function<HeadDecision(int h)> k, v;
  bool rope = false;
  bool interleaved = false;
};

void run_attention_case(const AttnCase& ac) {
  const int d = ac.d;
  std::vector<std::unique_ptr<HeadCodec>> kc, vc;
  std::vector<std::vector<uint8_t>> kp, vp;
  codec::AttentionProblem p;
  p.n_q_heads = ac.n_q, p.n_kv_heads = ac.n_kv, p.head_dim = d, p.n_tokens = ac.T;
  const std::vector<float> q = t::gaussian_rows(ac.n_q, d, 5, 1.5);
  p.q = q.data();
  std::vector<int32_t> pos(static_cast<size_t>(ac.T));
  for (int i = 0; i < ac.T; ++i) pos[static_cast<size_t>(i)] = 7 + 2 * i;
  p.positions = pos.data();
  p.rope = codec::RopeSpec{ac.rope, 10000.0, 0, ac.interleaved ? RopePairing::kInterleaved : RopePairing::kSplitHalf, {}, 1.0};
  for (int h = 0; h < ac.n_kv; ++h) {
    kc.push_back(std::make_unique<HeadCodec>(ac.k(h), d));
    vc.push_back(std::make_unique<HeadCodec>(ac.v(h), d));
    const std::vector<float> k = t::gaussian_rows(ac.T, d, 100 + h), v = t::gaussian_rows(ac.T, d, 200 + h);
    kp.push_back(kc.back()->encode(k.data(), ac.T));
    vp.push_back(vc.back()->encode(v.data(), ac.T));
  }
  for (int h = 0; h < ac.n_kv; ++h) {
    p.k_codecs.push_back(kc[static_cast<size_t>(h)].get());
    p.v_codecs.push_back(vc[static_cast<size_t>(h)].get());
    p.k_packed.push_back(kp[static_cast<size_t>(h)].data());
    p.v_packed.push_back(vp[static_cast<size_t>(h)].data());
  }
  std::vector<float> cpu(static_cast<size_t>(ac.n_q) * d), gpu(cpu.size());
  codec::reference_decode_attention(p, cpu.data());
  decode_attention(p, gpu.data());
  float mx = 0;
  for (float v : cpu) mx = std::max(mx, std::fabs(v));
  const double tol = 2e-4 * (1 + mx);
  for (size_t i = 0; i < cpu.size(); ++i)
    if (std::fabs(cpu[i] - gpu[i]) > tol) {
      const std::string path = "cuda_failure_attention_" + ac.name + ".txt";
      std::ofstream f(path);
      f << ac.name << " d=" << d << " n_q=" << ac.n_q << " n_kv=" << ac.n_kv << " T=" << ac.T << "\nq:";
      for (float v : q) f << " " << v;
      for (int h = 0; h < ac.n_kv; ++h) {
        f << "\nK" << h << ":" << std::hex;
        for (uint8_t b : kp[static_cast<size_t>(h)]) f << " " << static_cast<int>(b);
        f << "\nV" << h << ":";
        for (uint8_t b : vp[static_cast<size_t>(h)]) f << " " << static_cast<int>(b);
        f << std::dec;
      }
      f << "\n";
      ADD_FAILURE() << ac.name << ": out[" << i << "] cpu " << cpu[i] << " gpu " << gpu[i] << "; inputs in " << path;
      return;
    }
}

TEST(Cuda, FusedAttentionMatchesCpuReference) {
  REQUIRE_GPU();
  std::vector<AttnCase> cases = {
      {"tq_k_kivi_v", 128, 8, 2, 300, [](int) { return t::tq_uniform(128, 3); }, [](int) { return t::kivi(Side::kV, 4); }},
      {"gtq_k_tq_v", 64, 4, 4, 1000, [](int) { return t::tq_blocks(64, {2, 3, 4}); }, [](int h) { return t::tq_uniform(64, 3, 9 + h, Side::kV); }},
      {"lrh_pre_rope_split", 128, 16, 2, 513,
       [](int h) { HeadDecision x = t::with_mean(t::lrh(128, 30 + 36 * h, 3, 4 + h)); x.post_rope = false; return x; },
       [](int h) { return t::with_mean(t::lrh(128, 96 - 40 * h, 4, 8 + h, Side::kV)); }, true, false},
      {"lrh_k_latent_scores_with_mean", 128, 8, 1, 700, [](int) { return t::with_mean(t::lrh(128, 40, 4, 2)); },
       [](int) { return t::with_mean(t::lrh(128, 64, 3, 5, Side::kV), -0.4f); }},
      {"tq_pre_rope_interleaved", 96, 6, 3, 33,
       [](int) { HeadDecision x = t::tq_uniform(96, 4); x.post_rope = false; return x; },
       [](int) { return t::kivi(Side::kV, 2); }, true, true},
      {"kivi_both_T1", 64, 2, 1, 1, [](int) { return t::kivi(Side::kK, 2); }, [](int) { return t::kivi(Side::kV, 2); }},
      {"kivi_k_partial_block", 256, 4, 1, 70, [](int) { return t::kivi(Side::kK, 3); }, [](int) { return t::tq_uniform(256, 2, 3, Side::kV); }},
      {"gtq_nc_k_tq_nc_v", 64, 4, 2, 600, [](int) { return t::norm_corrected(t::tq_blocks(64, {2, 3, 4})); },
       [](int h) { return t::norm_corrected(t::tq_uniform(64, 3, 9 + h, Side::kV)); }},
      {"tq_nc_pre_rope", 128, 8, 2, 200,
       [](int) { HeadDecision x = t::norm_corrected(t::tq_uniform(128, 2)); x.post_rope = false; return x; },
       [](int) { return t::norm_corrected(t::tq_uniform(128, 4, 3, Side::kV)); }, true, false},
      {"gtq_compact_k_tq_nc_v", 64, 4, 2, 600,
       [](int h) { return t::norm_corrected(t::compact_norms(t::tq_blocks(64, {2, 3, 4}), 64, 8, 3 + h)); },
       [](int h) { return t::norm_corrected(t::tq_uniform(64, 3, 9 + h, Side::kV)); }},
      {"d8_mha", 8, 4, 4, 40, [](int) { return t::tq_uniform(8, 5); }, [](int) { return t::lrh(8, 6, 5, 1, Side::kV); }},
  };
  for (const AttnCase& c : cases) run_attention_case(c);
}

TEST(Cuda, RejectsShapesBeyondKernelLimits) {
  REQUIRE_GPU();
  HeadCodec big(t::tq_uniform(512, 3), 512);
  EXPECT_THROW(DeviceHead{big}, Error);
}

}  // namespace
}  // namespace kvq::cuda
