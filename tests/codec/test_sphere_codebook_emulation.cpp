// The CUDA decoder (kvq/cuda/decode_kernels.cuh, run on CPU threads by tests/cuda/cuda_emulation.hpp)
// on exact-codebook decisions (TqGroup::codebook = kSphere): the kernels take the host's per-group
// centroids (HeadCodec::tq_groups()[g].centroids), so no kernel change; checked here like
// tests/cuda/test_kernel_emulation.cpp checks the Gaussian ones: codes bit for bit, latents and
// decoded values within that file's tolerances, with and without norm correction and rotation.
#include "cuda_emulation.hpp"
// clang-format off: the emulation must come before the kernels
#include "kvq/cuda/decode_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <deque>

#include "kvq/codec/codebook.hpp"
#include "kvq/codec/codec.hpp"
#include "emulation_host_tables.hpp"
#include "test_util.hpp"

namespace kvq::cuda::detail {
namespace {

namespace t = codec::test;
using codec::HeadCodec;

HeadDecision exact(HeadDecision dec) {
  for (TqGroup& g : dec.groups)
    if (g.dims.size() >= 2 && g.dims.size() <= static_cast<size_t>(kTqSphereMaxM)) g.codebook = TqCodebook::kSphere;
  return dec;
}

TEST(SphereCodebookEmulation, DecodersMatchCpuReference) {
  for (int d : {8, 64, 96}) {
    const std::vector<std::pair<const char*, HeadDecision>> decs = {
        {"tq3x", exact(t::tq_uniform(d, 3))},
        {"tq1x_nc", exact(t::norm_corrected(t::tq_uniform(d, 1)))},
        {"gtqx", exact(t::tq_blocks(d, {1, 4, 8, 2}))},
        {"gtqx_nc", exact(t::norm_corrected(t::tq_blocks(d, {1, 4, 8, 2})))},
        {"gtqx_nc_rot3", exact(t::rotate_below(t::norm_corrected(t::tq_blocks(d, {1, 4, 8, 2})), 3))},
    };
    for (const auto& [name, dec] : decs) {
      const HeadCodec c(dec, d);
      // The decision really codes sphere tables where it can (d = 96: uniform stays Gaussian).
      size_t n_exact = 0;
      for (size_t g = 0; g < dec.groups.size(); ++g)
        if (dec.groups[g].codebook == TqCodebook::kSphere) {
          ++n_exact;
          const auto& ref = codec::lloyd_max_sphere(dec.groups[g].bits, static_cast<int>(dec.groups[g].dims.size()));
          ASSERT_EQ(c.tq_groups()[g].centroids.size(), ref.centroids.size());
          for (size_t k = 0; k < ref.centroids.size(); ++k)
            EXPECT_EQ(c.tq_groups()[g].centroids[k], static_cast<float>(ref.centroids[k]));
        }
      if (std::string(name).rfind("gtq", 0) == 0) {
        EXPECT_EQ(n_exact, dec.groups.size()) << name;
      }
      HostTables tables;
      const DevHead h = make_dev_head(c, [&tables](const auto& v) { return tables.up(v); });
      const int n = 37;
      const std::vector<float> x = t::gaussian_rows(n, d, 11 + d, 2.0);
      const std::vector<uint8_t> packed = c.encode(x.data(), n);
      const size_t cd = static_cast<size_t>(c.code_dim());

      std::vector<uint8_t> codes_cpu(n * cd), codes_emu(n * cd);
      std::vector<float> lat_cpu(n * cd), lat_emu(n * cd);
      c.unpack_codes(packed.data(), n, codes_cpu.data());
      c.decode_latent(packed.data(), n, lat_cpu.data());
      kvq_emu::launch({3, 1, 1}, kThreads, 0, [&] { latent_kernel(&h, packed.data(), n, lat_emu.data(), codes_emu.data()); });
      EXPECT_EQ(codes_cpu, codes_emu) << name << " d=" << d;
      const double lat_tol = dec.norm_correction ? 1e-5 : 1e-6;
      for (size_t i = 0; i < lat_cpu.size(); ++i)
        ASSERT_NEAR(lat_emu[i], lat_cpu[i], lat_tol * (1 + std::fabs(lat_cpu[i]))) << name << " d=" << d << " i=" << i;
      if (dec.norm_correction) {
        std::vector<float> tile(static_cast<size_t>(kDecodeTile) * cd, NAN);
        const int nt = std::min(n, kDecodeTile);
        kvq_emu::launch({1, 1, 1}, kThreads, 0,
                        [&] { decode_latent_tile(h, packed.data(), 0, nt, tile.data(), static_cast<int>(cd)); });
        for (size_t i = 0; i < static_cast<size_t>(nt) * cd; ++i)
          ASSERT_NEAR(tile[i], lat_cpu[i], lat_tol * (1 + std::fabs(lat_cpu[i]))) << name << " tile d=" << d << " i=" << i;
      }
      std::vector<float> y_cpu(static_cast<size_t>(n) * d), y_emu(y_cpu.size(), NAN);
      c.decode(packed.data(), n, y_cpu.data());
      kvq_emu::launch({static_cast<unsigned>((n + kDecodeTile - 1) / kDecodeTile), 1, 1}, kThreads,
                      sizeof(float) * kDecodeTile * cd, [&] { decode_kernel(&h, packed.data(), n, y_emu.data()); });
      for (int tok = 0; tok < n; ++tok) {
        double nrm = 0;
        for (int i = 0; i < d; ++i) nrm += double(y_cpu[size_t(tok) * d + i]) * y_cpu[size_t(tok) * d + i];
        for (int i = 0; i < d; ++i) {
          const size_t k = size_t(tok) * d + i;
          ASSERT_NEAR(y_emu[k], y_cpu[k], 2e-5 * (1 + std::sqrt(nrm))) << name << " d=" << d << " t=" << tok << " i=" << i;
        }
      }
      // Same bits as the Gaussian decision: the codebook costs nothing in the layout.
      HeadDecision gauss = dec;
      for (TqGroup& g : gauss.groups) g.codebook = TqCodebook::kGaussian;
      EXPECT_EQ(HeadCodec(gauss, d).packed_bytes(n), c.packed_bytes(n)) << name;
    }
  }
}

}  // namespace
}  // namespace kvq::cuda::detail
