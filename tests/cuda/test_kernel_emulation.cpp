// The CUDA decoder kernels' own code (kvq/cuda/decode_kernels.cuh) run on CPU threads by
// cuda_emulation.hpp, against the CPU reference, on every machine (CI has no GPU); the attention
// kernels have their own file, test_attention_emulation.cpp. Same tolerances as
// test_cuda_codec.cpp; the GPU run of that file remains the real check.
#include "cuda_emulation.hpp"
// clang-format off: the emulation must come before the kernels
#include "kvq/cuda/decode_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <functional>
#include <memory>

#include "kvq/codec/codec.hpp"
#include "emulation_host_tables.hpp"
#include "test_util.hpp"

namespace kvq::cuda::detail {
namespace {

namespace t = codec::test;
using codec::HeadCodec;

TEST(KernelEmulation, DecodersMatchCpuReference) {
  for (int d : {8, 64, 96, 256}) {
    const std::vector<std::pair<const char*, HeadDecision>> decs = {
        {"tq3", t::tq_uniform(d, 3)},
        {"gtq", t::tq_blocks(d, {1, 4, 8, 2})},
        {"lrh", t::with_mean(t::lrh(d, std::max(1, d * 3 / 4 - 1), 5))},
        {"kiviK", t::kivi(Side::kK, 3)},
        {"kiviV", t::kivi(Side::kV, 7)},
        {"tq1nc", t::norm_corrected(t::tq_uniform(d, 1))},
        {"tq3nc", t::norm_corrected(t::tq_uniform(d, 3))},
        {"gtqnc", t::norm_corrected(t::tq_blocks(d, {1, 4, 8, 2}))},
        {"gtqnc_rot3", t::rotate_below(t::norm_corrected(t::tq_blocks(d, {1, 4, 8, 2})), 3)},
        // Compact group norms (one 16-bit record: head norm level + ratio index), both decoders.
        {"gtq_compact8", t::compact_norms(t::tq_blocks(d, {1, 4, 8, 2}), d, 8)},
        {"gtqnc_compact3", t::norm_corrected(t::compact_norms(t::tq_blocks(d, {1, 4, 8, 2}), d, 3))},
    };
    for (const auto& [name, dec] : decs) {
      HeadCodec c(dec, d);
      HostTables tables;
      const DevHead h = tables.head(c);
      const int n = 37;
      const std::vector<float> x = t::gaussian_rows(n, d, 11 + d, 2.0);
      const std::vector<uint8_t> packed = c.encode(x.data(), n);
      const size_t cd = static_cast<size_t>(c.code_dim());

      std::vector<uint8_t> codes_cpu(n * cd), codes_emu(n * cd);
      std::vector<float> lat_cpu(n * cd), lat_emu(n * cd);
      c.unpack_codes(packed.data(), n, codes_cpu.data());
      c.decode_latent(packed.data(), n, lat_cpu.data());
      kvq_emu::launch({3, 1, 1}, kThreads, 0, [&] {
        latent_kernel(&h, packed.data(), n, lat_emu.data(), codes_emu.data());
      });
      EXPECT_EQ(codes_cpu, codes_emu) << name << " d=" << d;
      // Norm correction: ||c||^2 in float here, in double on the CPU (see test_cuda_codec.cpp).
      const double lat_tol = dec.norm_correction ? 1e-5 : 1e-6;
      for (size_t i = 0; i < lat_cpu.size(); ++i)
        ASSERT_NEAR(lat_emu[i], lat_cpu[i], lat_tol * (1 + std::fabs(lat_cpu[i]))) << name << " d=" << d << " i=" << i;
      // The decode_kernel path (decode_latent_tile: one warp per token and group) gives the same
      // latents as latent_value's per-element path.
      if (dec.norm_correction) {
        std::vector<float> tile(static_cast<size_t>(kDecodeTile) * cd, NAN);
        const int nt = std::min(n, kDecodeTile);
        kvq_emu::launch({1, 1, 1}, kThreads, 0,
                        [&] { decode_latent_tile(h, packed.data(), 0, nt, tile.data(), static_cast<int>(cd)); });
        for (size_t i = 0; i < static_cast<size_t>(nt) * cd; ++i)
          ASSERT_NEAR(tile[i], lat_cpu[i], lat_tol * (1 + std::fabs(lat_cpu[i]))) << name << " tile d=" << d << " i=" << i;
        // Codes do not depend on the setting: the same input encodes to the same bytes.
        HeadDecision plain = dec;
        plain.norm_correction = false;
        EXPECT_EQ(HeadCodec(plain, d).encode(x.data(), n), packed) << name << " d=" << d;
      }

      std::vector<float> y_cpu(static_cast<size_t>(n) * d), y_emu(y_cpu.size(), NAN);
      c.decode(packed.data(), n, y_cpu.data());
      kvq_emu::launch({static_cast<unsigned>((n + kDecodeTile - 1) / kDecodeTile), 1, 1}, kThreads,
                      sizeof(float) * kDecodeTile * cd,
                      [&] { decode_kernel(&h, packed.data(), n, y_emu.data()); });
      for (int tok = 0; tok < n; ++tok) {
        double nrm = 0;
        for (int i = 0; i < d; ++i) nrm += double(y_cpu[static_cast<size_t>(tok) * d + i]) * y_cpu[static_cast<size_t>(tok) * d + i];
        for (int i = 0; i < d; ++i) {
          const size_t k = static_cast<size_t>(tok) * d + i;
          ASSERT_NEAR(y_emu[k], y_cpu[k], 2e-5 * (1 + std::sqrt(nrm))) << name << " d=" << d << " t=" << tok << " i=" << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvq::cuda::detail
