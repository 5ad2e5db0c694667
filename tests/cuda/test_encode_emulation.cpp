// The GPU encoder's own code (kvq/cuda/encode_kernels.cuh) run on CPU threads by
// cuda_emulation.hpp: its bytes must equal the CPU encoder's (codec::HeadCodec::encode, the
// independent implementation every allocation and cache is coded with) bit for bit, on every coding
// kind and awkward shapes, and the device decoder must read them as the CPU decoder does. The GPU
// run of the same kernel is tests/cuda/test_cuda_encode.cpp.
#include "cuda_emulation.hpp"
// clang-format off: the emulation must come before the kernels
#include "kvq/cuda/decode_kernels.cuh"
#include "kvq/cuda/encode_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <fstream>
#include <string>

#include "kvq/codec/codec.hpp"
#include "kvq/codec/minifloat.hpp"
#include "emulation_host_tables.hpp"
#include "test_util.hpp"

namespace kvq::cuda::detail {
namespace {

namespace t = codec::test;
using codec::HeadCodec;

// The encoder kernel on CPU threads. The output starts poisoned: the kernel must write every byte
// (the CPU encoder zero-fills first). `grid` blocks grid-stride over the layout blocks.
std::vector<uint8_t> emu_encode(const DevHead& h, const HeadCodec& c, const std::vector<float>& x, int n,
                                unsigned grid = 2, int threads = kThreads) {
  std::vector<uint8_t> out(c.packed_bytes(n), 0xA5);
  kvq_emu::launch({grid, 1, 1}, threads, 0, [&] { encode_kernel(&h, x.data(), n, out.data()); });
  return out;
}

// Bytes equal; on a mismatch, names the first differing byte and its block, and (when x is given)
// writes the inputs and both encodings to emu_failure_encode.txt (CONVENTIONS 9).
void expect_same_bytes(const HeadCodec& c, const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& emu,
                       const std::string& what, const std::vector<float>* x = nullptr) {
  ASSERT_EQ(cpu.size(), emu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i] != emu[i]) {
      const size_t bb = c.layout().block_bytes;
      ADD_FAILURE() << what << ": byte " << i << " (block " << i / bb << ", offset " << i % bb << ") cpu "
                    << int(cpu[i]) << " gpu-emulated " << int(emu[i]);
      if (x) {
        std::ofstream f("emu_failure_encode.txt", std::ios::app);
        f.precision(9);
        f << what << " " << decision_name(c.decision()) << " d=" << c.head_dim() << "\nx:";
        for (float v : *x) f << " " << v;
        f << "\ncpu:" << std::hex;
        for (uint8_t b : cpu) f << " " << int(b);
        f << "\ngpu-emulated:";
        for (uint8_t b : emu) f << " " << int(b);
        f << std::dec << "\n";
      }
      return;
    }
}

// Rows that probe the quantizers' edges besides Gaussian ones: a zero row, a constant row, an
// integer ramp (KIVI ties at half-integers), a row far beyond fp16 (saturated norms and scales),
// signed zeros, and rows scaled over 2^-20 .. 2^20.
std::vector<float> awkward_rows(int n, int d, uint64_t seed) {
  std::vector<float> x = t::gaussian_rows(n, d, seed, 1.5);
  Rng rng(seed + 99);
  for (int r = 0; r < n; ++r) {
    float* row = x.data() + static_cast<size_t>(r) * d;
    switch (r % 9) {
      case 0: for (int i = 0; i < d; ++i) row[i] = 0.f; break;
      case 1: for (int i = 0; i < d; ++i) row[i] = 0.75f; break;
      case 2: for (int i = 0; i < d; ++i) row[i] = static_cast<float>(i % 17) * 0.5f - 3.f; break;
      case 3: for (int i = 0; i < d; ++i) row[i] *= 3e4f; break;
      case 4: for (int i = 0; i < d; ++i) row[i] = (i % 2) ? -0.f : 0.f; if (d > 2) row[2] = 1.f; break;
      case 5: { const float s = static_cast<float>(std::exp2(40.0 * rng.uniform() - 20.0));
                for (int i = 0; i < d; ++i) row[i] *= s; } break;
      default: break;
    }
  }
  return x;
}

void check_kind(const HeadDecision& dec, int d, int n, const std::string& name, uint64_t seed = 1) {
  SCOPED_TRACE(name + " d=" + std::to_string(d));
  const HeadCodec c(dec, d);
  HostTables tables;
  const DevHead h = tables.head(c);
  const std::vector<float> x = awkward_rows(n, d, seed + static_cast<uint64_t>(d));
  const std::vector<uint8_t> cpu = c.encode(x.data(), n);
  const std::vector<uint8_t> emu = emu_encode(h, c, x, n);
  expect_same_bytes(c, cpu, emu, name, &x);
}

TEST(EncodeEmulation, TqUniformEveryWidthAndDim) {
  for (int d : {8, 64, 96, 128, 256})
    for (int b = 1; b <= 8; ++b) {
      if (d == 256 && b % 2 == 0) continue;  // the widest head: odd widths only (time)
      check_kind(t::tq_uniform(d, b), d, 12, "tq" + std::to_string(b));
    }
}

TEST(EncodeEmulation, TqMixedWidthGroups) {
  for (int d : {8, 64, 96, 128, 256}) {
    check_kind(t::tq_blocks(d, {1, 4, 8, 2}), d, 19, "gtq1482");
    check_kind(t::tq_blocks(d, {3, 5, 6, 7}), d, 10, "gtq3567");
    check_kind(t::rotate_below(t::tq_blocks(d, {1, 4, 8, 2}), 3), d, 10, "gtq_rot3");
    check_kind(t::norm_corrected(t::tq_blocks(d, {2, 3})), d, 10, "gtq23nc");  // encode ignores nc
    check_kind(t::compact_norms(t::tq_blocks(d, {1, 4, 8, 2}), d, 8), d, 19, "gtq_compact8");
    check_kind(t::compact_norms(t::tq_blocks(d, {2, 3, 4}), d, 3), d, 19, "gtq_compact3");
  }
  // Many small groups (one RoPE pair each at d = 64: 32 groups, the layout's maximum).
  std::vector<int> w32(32);
  for (int i = 0; i < 32; ++i) w32[static_cast<size_t>(i)] = 1 + i % 8;
  check_kind(t::tq_blocks(64, w32), 64, 9, "gtq32groups");
  check_kind(t::compact_norms(t::tq_blocks(64, w32), 64, 5), 64, 9, "gtq32groups_compact5");
}

TEST(EncodeEmulation, TqSphereCodebook) {
  for (int d : {8, 64, 128}) {
    HeadDecision dec = t::tq_blocks(d, {2, 4, 3});
    for (TqGroup& g : dec.groups) g.codebook = TqCodebook::kSphere;  // groups of m <= 64 here
    check_kind(dec, d, 12, "gtq_sphere");
  }
}

// Values exactly on a centroid boundary: an unrotated group whose stored norm is exactly 1 and
// whose first coordinate is a threshold (or its float neighbours), so u / rho~ hits the threshold
// and the tie rule (upper cell) decides.
TEST(EncodeEmulation, TqValuesOnThresholds) {
  for (int d : {8, 64})
    for (int b : {1, 2, 3, 5, 8}) {
      HeadDecision dec = t::tq_uniform(d, b);
      dec.groups[0].rotation = TqRotation::kIdentity;
      const HeadCodec c(dec, d);
      const std::vector<float>& th = c.tq_groups()[0].thresholds;
      std::vector<float> x;
      for (float t0 : th) {
        if (!(std::fabs(t0) < 0.99f)) continue;
        for (float v : {t0, std::nextafter(t0, -1.f), std::nextafter(t0, 1.f)}) {
          std::vector<float> row(static_cast<size_t>(d), 0.f);
          row[0] = v;
          row[1] = std::sqrt(1.f - v * v);  // ||x|| within fp16 rounding of 1
          x.insert(x.end(), row.begin(), row.end());
        }
      }
      const int n = static_cast<int>(x.size()) / d;
      ASSERT_GT(n, 0);
      // The construction does hit the thresholds: the stored norm is exactly 1.
      const std::vector<uint8_t> cpu = c.encode(x.data(), n);
      EXPECT_EQ(layout::f16_to_f32(layout::load_u16le(cpu.data())), 1.f);
      HostTables tables;
      expect_same_bytes(c, cpu, emu_encode(tables.head(c), c, x, n), "tq_thresholds b=" + std::to_string(b));
    }
}

TEST(EncodeEmulation, LowRankHadamard) {
  for (int d : {8, 64, 96, 128, 256})
    for (int b : {1, 2, 3, 4, 5, 8}) {
      const int r = b % 2 ? std::max(1, d / 4) : std::max(1, d * 3 / 4 - 1);
      check_kind(t::with_mean(t::lrh(d, r, b)), d, 11, "lrh r" + std::to_string(r) + " b" + std::to_string(b));
    }
  check_kind(t::lrh(128, 128, 6), 128, 9, "lrh full rank");
}

TEST(EncodeEmulation, Kivi) {
  for (int d : {8, 64, 96, 128, 256})
    for (int b = 1; b <= 8; ++b) {
      if (d >= 128 && b % 2 == 0) continue;  // time
      // K: blocks of group_size tokens, the last one partial; V: a last channel group shorter.
      check_kind(t::kivi(Side::kK, b, 4), d, 11, "kiviK g4 b" + std::to_string(b));
      check_kind(t::kivi(Side::kV, b, 24), d, 7, "kiviV g24 b" + std::to_string(b));
    }
  check_kind(t::kivi(Side::kK, 2, 32), 64, 40, "kiviK g32");
  check_kind(t::kivi(Side::kV, 4, 128), 96, 9, "kiviV one group");
}

TEST(EncodeEmulation, Minifloat) {
  for (int d : {8, 64, 96, 128, 256, 24}) {
    HeadDecision fp8;
    fp8.kind = CodingKind::kMinifloat;
    fp8.minifloat = MinifloatFormat::kFp8E4M3;
    fp8.scale = 0.01f;
    check_kind(fp8, d, 13, "fp8");
    HeadDecision nv = fp8;
    nv.minifloat = MinifloatFormat::kNvfp4;
    nv.scale = 0.003f;
    check_kind(nv, d, 13, "nvfp4");
  }
  // Ties: with scale 1, E4M3 midpoints (1 + 1/16, ...) and E2M1 midpoints (1.25, 2.5, 5) round to
  // the even code; values past 448 / 6 * 448 saturate.
  const int d = 32;
  HeadDecision fp8;
  fp8.kind = CodingKind::kMinifloat;
  fp8.scale = 1.f;
  std::vector<float> x(static_cast<size_t>(d) * 2);
  const float ties[] = {1.0625f, 1.1875f, -2.125f, 0.25f + 1.f / 64, 464.f, 500.f, -1e6f, 0x1p-10f, 0x1p-11f};
  for (size_t i = 0; i < x.size(); ++i) x[i] = ties[i % 9] * (i >= static_cast<size_t>(d) ? 6.f : 1.f);
  for (MinifloatFormat f : {MinifloatFormat::kFp8E4M3, MinifloatFormat::kNvfp4}) {
    fp8.minifloat = f;
    const HeadCodec c(fp8, d);
    HostTables tables;
    expect_same_bytes(c, c.encode(x.data(), 2), emu_encode(tables.head(c), c, x, 2), "minifloat ties");
  }
}

// One block of 32 threads (fewer threads than codes, records or ratio codewords) and a grid of one
// block give the same bytes as the real launch shape.
TEST(EncodeEmulation, IndependentOfLaunchShape) {
  const int d = 96;
  for (const HeadDecision& dec : {t::compact_norms(t::tq_blocks(d, {1, 4, 8, 2}), d, 8), t::with_mean(t::lrh(d, 70, 3)),
                                  t::kivi(Side::kK, 3, 5)}) {
    const HeadCodec c(dec, d);
    HostTables tables;
    const DevHead h = tables.head(c);
    const std::vector<float> x = awkward_rows(12, d, 5);
    const std::vector<uint8_t> cpu = c.encode(x.data(), 12);
    expect_same_bytes(c, cpu, emu_encode(h, c, x, 12, 1, 32), decision_name(dec) + " 32 threads");
  }
}

// Ragged lengths up to 1,500 tokens (32 threads per block to keep the emulation quick: the launch
// shape does not change the bytes, IndependentOfLaunchShape).
TEST(EncodeEmulation, RaggedLengths) {
  const int d = 64;
  for (const HeadDecision& dec : {t::compact_norms(t::tq_blocks(d, {1, 3, 4, 6}), d, 7), t::with_mean(t::lrh(d, 24, 5)),
                                  t::kivi(Side::kK, 3, 32)}) {
    const HeadCodec c(dec, d);
    HostTables tables;
    const DevHead h = tables.head(c);
    for (int n : {1, 2, 31, 33, 1500}) {
      const std::vector<float> x = awkward_rows(n, d, 300 + static_cast<uint64_t>(n));
      expect_same_bytes(c, c.encode(x.data(), n), emu_encode(h, c, x, n, 3, 32),
                        decision_name(dec) + " n=" + std::to_string(n), &x);
    }
  }
}

// The device decoder reads the emulated GPU codes as the CPU decoder reads the CPU's: codes
// exactly, values to the tolerances of test_kernel_emulation.cpp.
TEST(EncodeEmulation, DeviceDecodeOfGpuCodes) {
  const int d = 64, n = 21;
  HeadDecision fp8;
  fp8.kind = CodingKind::kMinifloat;
  fp8.scale = 0.02f;
  HeadDecision nv = fp8;
  nv.minifloat = MinifloatFormat::kNvfp4;
  nv.scale = 0.004f;
  for (const HeadDecision& dec : {t::tq_uniform(d, 3), t::norm_corrected(t::compact_norms(t::tq_blocks(d, {1, 4, 8, 2}), d, 3)),
                                  t::with_mean(t::lrh(d, 40, 4)), t::kivi(Side::kK, 2, 8), t::kivi(Side::kV, 5, 16),
                                  fp8, nv}) {
    SCOPED_TRACE(decision_name(dec));
    const HeadCodec c(dec, d);
    HostTables tables;
    const DevHead h = tables.head(c);
    const std::vector<float> x = t::gaussian_rows(n, d, 77, 2.0);
    const std::vector<uint8_t> gpu = emu_encode(h, c, x, n);
    const size_t cd = static_cast<size_t>(c.code_dim());
    std::vector<uint8_t> codes_cpu(n * cd), codes_dev(n * cd);
    std::vector<float> lat_cpu(n * cd), lat_dev(n * cd), x_cpu(static_cast<size_t>(n) * d), x_dev(x_cpu.size());
    const std::vector<uint8_t> cpu = c.encode(x.data(), n);
    c.unpack_codes(cpu.data(), n, codes_cpu.data());
    c.decode_latent(cpu.data(), n, lat_cpu.data());
    c.decode(cpu.data(), n, x_cpu.data());
    kvq_emu::launch({2, 1, 1}, kThreads, 0, [&] { latent_kernel(&h, gpu.data(), n, lat_dev.data(), codes_dev.data()); });
    const int blocks = (n + kDecodeTile - 1) / kDecodeTile;
    kvq_emu::launch({static_cast<unsigned>(blocks), 1, 1}, kThreads, sizeof(float) * kDecodeTile * cd,
                    [&] { decode_kernel(&h, gpu.data(), n, x_dev.data()); });
    EXPECT_EQ(codes_cpu, codes_dev);
    const double lat_tol = dec.norm_correction ? 1e-5 : 1e-6;
    for (size_t i = 0; i < lat_cpu.size(); ++i)
      ASSERT_NEAR(lat_dev[i], lat_cpu[i], lat_tol * (1 + std::fabs(lat_cpu[i]))) << i;
    for (size_t i = 0; i < x_cpu.size(); ++i) ASSERT_NEAR(x_dev[i], x_cpu[i], 1e-4 * (1 + std::fabs(x_cpu[i]))) << i;
  }
}

// Many heads in one launch (encode_batch_kernel, kvq/cuda/encode_batch.hpp): every job's bytes are
// its head's CPU bytes, whatever the kinds mixed in the batch (KIVI K has fewer layout blocks than
// the others: its extra thread blocks stay idle).
TEST(EncodeEmulation, BatchOfMixedKindsInOneLaunch) {
  const int d = 64;
  for (int n : {1, 9}) {
    HeadDecision nv;
    nv.kind = CodingKind::kMinifloat;
    nv.minifloat = MinifloatFormat::kNvfp4;
    nv.scale = 0.004f;
    const std::vector<HeadDecision> decs = {t::tq_uniform(d, 3), t::compact_norms(t::tq_blocks(d, {2, 3, 4}), d, 6),
                                            t::with_mean(t::lrh(d, 16, 4)), t::kivi(Side::kK, 2, 4),
                                            t::kivi(Side::kV, 2, 32), nv};
    std::deque<HeadCodec> codecs;
    HostTables tables;
    std::vector<DevHead> heads;
    std::vector<std::vector<float>> xs;
    std::vector<std::vector<uint8_t>> outs;
    for (size_t i = 0; i < decs.size(); ++i) {
      codecs.emplace_back(decs[i], d);
      heads.push_back(tables.head(codecs.back()));
      xs.push_back(awkward_rows(n, d, 40 + i));
      outs.emplace_back(codecs.back().packed_bytes(n), 0xA5);
    }
    std::vector<EncJob> jobs;
    for (size_t i = 0; i < decs.size(); ++i) jobs.push_back({&heads[i], xs[i].data(), outs[i].data()});
    kvq_emu::launch({3, static_cast<unsigned>(jobs.size()), 1}, kThreads, 0, [&] { encode_batch_kernel(jobs.data(), n); });
    for (size_t i = 0; i < decs.size(); ++i)
      expect_same_bytes(codecs[i], codecs[i].encode(xs[i].data(), n), outs[i],
                        "batch job " + std::to_string(i) + " " + decision_name(decs[i]) + " n=" + std::to_string(n));
  }
}

// KIVI K append (PackedKvCache::append's kivi_k_append_kernel): one token per sequence per step
// into each sequence's open group, the block re-encoded from the group's fp32 rows. After every
// step each sequence's stream must equal the CPU encoder's bytes of all its tokens so far (the
// scales and zeros of a partial group span only the tokens present). Sequences start at different
// lengths (whole groups already in place, as after a load), one fills up and is then left alone.
struct KiviAppendResult {
  int steps_checked = 0;
  int mismatching_steps = 0;
};
KiviAppendResult run_kivi_k_append(int d, int bits, int g, bool stale_rows) {
  const HeadCodec c(t::kivi(Side::kK, bits, g), d);
  HostTables tables;
  const DevHead h = tables.head(c);
  const int B = 3, capacity = 3 * g + 5;
  const std::vector<int32_t> start = {0, g, 2 * g};  // whole groups loaded: no open rows needed
  const int steps = 2 * g + 7;                        // sequences 1 and 2 reach capacity
  const size_t seq_bytes = c.packed_bytes(capacity);
  std::vector<uint8_t> stream(seq_bytes * B, 0);
  std::vector<float> rows(static_cast<size_t>(B) * g * d, 0.f);
  std::vector<int32_t> len = start;
  // Every token each sequence will ever hold: awkward rows (ties, zeros, huge values) and Gaussians.
  std::vector<std::vector<float>> x(B);
  for (int b = 0; b < B; ++b) {
    // The control corrupts an open row by +1: Gaussian rows, so that it moves a record (next to
    // awkward_rows' 3e4-scaled rows, fp16-saturated scales could hide it).
    x[b] = stale_rows ? t::gaussian_rows(capacity, d, 40 + b) : awkward_rows(capacity, d, 40 + b);
    const std::vector<uint8_t> pre = c.encode(x[b].data(), start[b]);
    std::copy(pre.begin(), pre.end(), stream.begin() + static_cast<std::ptrdiff_t>(seq_bytes * b));
  }
  KiviKAppend job{&h, nullptr, rows.data(), stream.data(), seq_bytes};
  std::vector<float> step_x(static_cast<size_t>(B) * d);
  KiviAppendResult r;
  for (int s = 0; s < steps; ++s) {
    for (int b = 0; b < B; ++b) {
      const int tok = std::min(len[b], capacity - 1);  // a full sequence's row is ignored
      std::copy_n(x[b].data() + static_cast<size_t>(tok) * d, d, step_x.data() + static_cast<size_t>(b) * d);
    }
    job.x = step_x.data();
    if (stale_rows && s == g / 2) rows[3] += 1.f;  // the control: an open group's row corrupted
    kvq_emu::launch({static_cast<unsigned>(B), 1, 1}, kThreads, 0,
                    [&] { kivi_k_append_kernel(&job, len.data(), capacity); });
    bool bad = false;
    for (int b = 0; b < B; ++b) {
      len[b] = std::min(len[b] + 1, capacity);  // advance_lengths_kernel
      const std::vector<uint8_t> cpu = c.encode(x[b].data(), len[b]);
      const uint8_t* got = stream.data() + seq_bytes * b;
      if (!std::equal(cpu.begin(), cpu.end(), got)) {
        bad = true;
        if (!stale_rows)
          ADD_FAILURE() << "kivi K append d=" << d << " b=" << bits << " g=" << g << ": sequence " << b
                        << " differs from the CPU encoder after " << len[b] << " tokens";
      }
    }
    r.steps_checked += 1;
    r.mismatching_steps += bad;
  }
  EXPECT_EQ(len[2], capacity) << "the test must fill one sequence";
  return r;
}

TEST(EncodeEmulation, KiviKAppendReencodesTheOpenGroup) {
  // (d, bits, group): every width class, groups shorter and longer than a warp.
  const int shapes[][3] = {{8, 1, 4}, {8, 8, 32}, {64, 2, 32}, {96, 3, 4}, {96, 5, 32}, {128, 4, 64}, {256, 2, 8}};
  for (const auto& s : shapes) {
    const KiviAppendResult r = run_kivi_k_append(s[0], s[1], s[2], false);
    EXPECT_EQ(r.mismatching_steps, 0) << "d=" << s[0] << " bits=" << s[1] << " g=" << s[2];
  }
}

// Negative control: a corrupted fp32 row of an open group shows up as a byte difference (the
// comparison above is not vacuous), until that group closes.
TEST(EncodeEmulation, KiviKAppendNegativeControl) {
  EXPECT_GT(run_kivi_k_append(64, 2, 32, true).mismatching_steps, 0);
}

// Negative control: the comparison sees a one-code difference (a flipped threshold tie), so the
// equalities above are not vacuous.
TEST(EncodeEmulation, NegativeControlDetectsOneCode) {
  const int d = 8;
  HeadDecision dec = t::tq_uniform(d, 3);
  dec.groups[0].rotation = TqRotation::kIdentity;
  const HeadCodec c(dec, d);
  HostTables tables;
  DevHead h = tables.head(c);
  std::vector<float> x(d, 0.f);
  const float t0 = c.tq_groups()[0].thresholds[4];
  x[0] = t0;
  x[1] = std::sqrt(1.f - t0 * t0);
  // Raise this one threshold by one ulp in the device's table: the tie now goes to the lower cell.
  std::vector<float> th(c.tq_groups()[0].thresholds);
  th[4] = std::nextafter(th[4], 1.f);
  th.push_back(INFINITY);
  h.thresholds = th.data();
  const std::vector<uint8_t> cpu = c.encode(x.data(), 1);
  const std::vector<uint8_t> emu = emu_encode(h, c, x, 1);
  EXPECT_NE(cpu, emu);
}

}  // namespace
}  // namespace kvq::cuda::detail
