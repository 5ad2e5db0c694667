// The GPU encoder on a GPU against the CPU encoder (codec::HeadCodec::encode): bytes equal, bit for
// bit, on every coding kind and awkward shapes; encode_async on a stream and inside a captured CUDA
// graph; the GPU decoder reads the GPU's codes as the CPU decoder reads the CPU's. Every test skips
// without a device (the binary still builds and links). The same kernel's logic is checked on every
// machine by test_encode_emulation.cpp.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "kvq/codec/codec.hpp"
#include "kvq/codec/layout.hpp"
#include "kvq/cuda/cuda.hpp"
#include "kvq/cuda/encode.hpp"
#include "kvq/cuda/encode_batch.hpp"
#include "kvq/util/error.hpp"
#include "test_util.hpp"

namespace kvq::cuda {
namespace {

using codec::HeadCodec;
namespace t = codec::test;

#define REQUIRE_GPU() \
  if (!kvq_cuda_available()) GTEST_SKIP() << "no CUDA device (the encoder still compiled and linked)"

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

HeadDecision minifloat(MinifloatFormat f, float scale) {
  HeadDecision dec;
  dec.kind = CodingKind::kMinifloat;
  dec.minifloat = f;
  dec.scale = scale;
  return dec;
}

std::vector<std::pair<std::string, HeadDecision>> every_kind(int d) {
  std::vector<std::pair<std::string, HeadDecision>> v;
  for (int b = 1; b <= 8; ++b) v.emplace_back("tq" + std::to_string(b), t::tq_uniform(d, b));
  v.emplace_back("gtq1482", t::tq_blocks(d, {1, 4, 8, 2}));
  v.emplace_back("gtq3567_rot4", t::rotate_below(t::tq_blocks(d, {3, 5, 6, 7}), 4));
  v.emplace_back("gtq_compact8", t::compact_norms(t::tq_blocks(d, {1, 4, 8, 2}), d, 8));
  v.emplace_back("gtqnc_compact3", t::norm_corrected(t::compact_norms(t::tq_blocks(d, {2, 3, 4}), d, 3)));
  HeadDecision sphere = t::tq_blocks(d, {2, 4, 3});
  for (TqGroup& g : sphere.groups) g.codebook = TqCodebook::kSphere;
  v.emplace_back("gtq_sphere", sphere);
  for (int b : {1, 3, 4, 8}) v.emplace_back("lrh" + std::to_string(b), t::with_mean(t::lrh(d, std::max(1, d / 2 - 1), b)));
  for (int b : {1, 2, 5, 8}) {
    v.emplace_back("kiviK" + std::to_string(b), t::kivi(Side::kK, b, 32));
    v.emplace_back("kiviV" + std::to_string(b), t::kivi(Side::kV, b, 24));
  }
  v.emplace_back("fp8", minifloat(MinifloatFormat::kFp8E4M3, 0.01f));
  v.emplace_back("nvfp4", minifloat(MinifloatFormat::kNvfp4, 0.003f));
  return v;
}

// Gaussian rows at scales 2^-12 .. 2^12 with zero, constant and saturating rows among them.
std::vector<float> rows(int n, int d, uint64_t seed) {
  std::vector<float> x = t::gaussian_rows(n, d, seed, 1.5);
  Rng rng(seed + 7);
  for (int r = 0; r < n; ++r) {
    float* row = x.data() + static_cast<size_t>(r) * d;
    const float s = r % 7 == 0 ? 0.f : r % 7 == 1 ? 3e4f : static_cast<float>(std::exp2(24.0 * rng.uniform() - 12.0));
    for (int i = 0; i < d; ++i) row[i] = r % 11 == 2 ? 0.5f : row[i] * s;
  }
  return x;
}

// On a mismatch the inputs and both encodings go to cuda_failure_encode_<name>.txt (CONVENTIONS 9).
std::string dump(const std::string& name, const HeadCodec& c, int n, const float* x, const std::vector<uint8_t>& cpu,
                 const std::vector<uint8_t>& gpu) {
  const std::string path = "cuda_failure_encode_" + name + ".txt";
  std::ofstream f(path);
  f << codec::decision_name(c.decision()) << " kind=" << static_cast<int>(c.decision().kind) << " d=" << c.head_dim()
    << " T=" << n << " block_bytes=" << c.layout().block_bytes << "\nx:";
  f.precision(9);
  for (size_t i = 0; i < static_cast<size_t>(n) * c.head_dim(); ++i) f << " " << x[i];
  f << "\ncpu:" << std::hex;
  for (uint8_t b : cpu) f << " " << static_cast<int>(b);
  f << "\ngpu:";
  for (uint8_t b : gpu) f << " " << static_cast<int>(b);
  f << "\n";
  return path;
}

size_t first_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return i;
  return a.size() == b.size() ? SIZE_MAX : std::min(a.size(), b.size());
}

TEST(CudaEncode, BytesEqualCpuEveryKindAndShape) {
  REQUIRE_GPU();
  for (int d : {8, 64, 96, 128, 256})
    for (const auto& [name, dec] : every_kind(d))
      for (int n : {1, 37, 1000}) {
        const HeadCodec c(dec, d);
        const DeviceHead dev(c);
        const std::vector<float> x = rows(n, d, 100 + static_cast<uint64_t>(d) + static_cast<uint64_t>(n));
        const std::vector<uint8_t> cpu = c.encode(x.data(), n);
        std::vector<uint8_t> gpu(cpu.size(), 0xA5);
        dev.encode(x.data(), n, gpu.data());
        const size_t at = first_diff(cpu, gpu);
        if (at != SIZE_MAX)
          ADD_FAILURE() << name << " d=" << d << " n=" << n << ": first differing byte " << at << " (block "
                        << at / c.layout().block_bytes << "), inputs in "
                        << dump(name + "_d" + std::to_string(d), c, n, x.data(), cpu, gpu);
      }
}

// Ragged lengths in one stream: every sequence encoded by encode_async into its own region of one
// device buffer, asynchronously, then compared with the CPU.
TEST(CudaEncode, RaggedLengthsOnAStream) {
  REQUIRE_GPU();
  const int d = 128;
  const std::vector<int> lens = {1, 2, 31, 32, 33, 511, 1024, 5000};
  for (const auto& [name, dec] : every_kind(d)) {
    const HeadCodec c(dec, d);
    const DeviceHead dev(c);
    size_t xs = 0, os = 0;
    for (int n : lens) {
      xs += static_cast<size_t>(n) * d;
      os += c.packed_bytes(n);
    }
    const std::vector<float> x = rows(static_cast<int>(xs / d), d, 5);
    float* dx = nullptr;
    uint8_t* dout = nullptr;
    cudaStream_t st;
    CUDA_OK(cudaMalloc(&dx, xs * sizeof(float)));
    CUDA_OK(cudaMalloc(&dout, os));
    CUDA_OK(cudaStreamCreate(&st));
    CUDA_OK(cudaMemcpy(dx, x.data(), xs * sizeof(float), cudaMemcpyHostToDevice));
    size_t xo = 0, oo = 0;
    for (int n : lens) {
      encode_async(dev, dx + xo, n, dout + oo, st);
      xo += static_cast<size_t>(n) * d;
      oo += c.packed_bytes(n);
    }
    std::vector<uint8_t> gpu(os);
    CUDA_OK(cudaStreamSynchronize(st));
    CUDA_OK(cudaMemcpy(gpu.data(), dout, os, cudaMemcpyDeviceToHost));
    xo = oo = 0;
    for (int n : lens) {
      const std::vector<uint8_t> cpu = c.encode(x.data() + xo, n);
      const std::vector<uint8_t> g(gpu.begin() + static_cast<std::ptrdiff_t>(oo),
                                   gpu.begin() + static_cast<std::ptrdiff_t>(oo + cpu.size()));
      if (first_diff(cpu, g) != SIZE_MAX)
        ADD_FAILURE() << name << " n=" << n << ": inputs in " << dump(name + "_ragged", c, n, x.data() + xo, cpu, g);
      xo += static_cast<size_t>(n) * d;
      oo += cpu.size();
    }
    cudaStreamDestroy(st);
    cudaFree(dx);
    cudaFree(dout);
  }
}

// encode_async captured in a CUDA graph (no allocation, copy or synchronisation inside) and
// replayed on new inputs gives the CPU's bytes for those inputs.
TEST(CudaEncode, CapturedInAGraph) {
  REQUIRE_GPU();
  const int d = 128, n = 1;  // the decode step's append: one token per head
  std::vector<HeadCodec> codecs;
  for (const auto& kv : every_kind(d)) codecs.emplace_back(kv.second, d);
  std::vector<DeviceHead> devs;
  for (const HeadCodec& c : codecs) devs.emplace_back(c);
  const size_t k = codecs.size();
  float* dx = nullptr;
  uint8_t* dout = nullptr;
  size_t os = 0;
  std::vector<size_t> off;
  for (const HeadCodec& c : codecs) {
    off.push_back(os);
    os += c.packed_bytes(n);
  }
  CUDA_OK(cudaMalloc(&dx, k * d * sizeof(float)));
  CUDA_OK(cudaMalloc(&dout, os));
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (size_t h = 0; h < k; ++h) encode_async(devs[h], dx + h * d, n, dout + off[h], st);
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t step = 0; step < 3; ++step) {
    const std::vector<float> x = rows(static_cast<int>(k), d, 900 + step);
    CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    std::vector<uint8_t> gpu(os);
    CUDA_OK(cudaMemcpy(gpu.data(), dout, os, cudaMemcpyDeviceToHost));
    for (size_t h = 0; h < k; ++h) {
      const std::vector<uint8_t> cpu = codecs[h].encode(x.data() + h * d, n);
      EXPECT_TRUE(std::equal(cpu.begin(), cpu.end(), gpu.begin() + static_cast<std::ptrdiff_t>(off[h])))
          << codec::decision_name(codecs[h].decision()) << " step " << step;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  cudaFree(dx);
  cudaFree(dout);
}

// Every (KV head, side) of a layer in one encode_batch_async launch, captured in a graph and
// replayed: each job's bytes are its head's CPU bytes.
TEST(CudaEncode, BatchInOneLaunchInAGraph) {
  REQUIRE_GPU();
  const int d = 128;
  std::vector<HeadCodec> codecs;
  for (const auto& kv : every_kind(d)) codecs.emplace_back(kv.second, d);
  std::vector<DeviceHead> devs;
  for (const HeadCodec& c : codecs) devs.emplace_back(c);
  const size_t k = codecs.size();
  for (int n : {1, 40}) {
    float* dx = nullptr;
    uint8_t* dout = nullptr;
    EncodeJob* djobs = nullptr;
    size_t os = 0;
    std::vector<size_t> off;
    for (const HeadCodec& c : codecs) {
      off.push_back(os);
      os += c.packed_bytes(n);
    }
    CUDA_OK(cudaMalloc(&dx, k * n * d * sizeof(float)));
    CUDA_OK(cudaMalloc(&dout, os));
    CUDA_OK(cudaMalloc(&djobs, k * sizeof(EncodeJob)));
    std::vector<EncodeJob> jobs(k);
    for (size_t h = 0; h < k; ++h) jobs[h] = {device_view(devs[h]), dx + h * n * d, dout + off[h]};
    CUDA_OK(cudaMemcpy(djobs, jobs.data(), k * sizeof(EncodeJob), cudaMemcpyHostToDevice));
    cudaStream_t st;
    CUDA_OK(cudaStreamCreate(&st));
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    encode_batch_async(djobs, static_cast<int>(k), n, st);
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    const std::vector<float> x = rows(static_cast<int>(k) * n, d, 77 + static_cast<uint64_t>(n));
    CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    std::vector<uint8_t> gpu(os);
    CUDA_OK(cudaMemcpy(gpu.data(), dout, os, cudaMemcpyDeviceToHost));
    for (size_t h = 0; h < k; ++h) {
      const std::vector<uint8_t> cpu = codecs[h].encode(x.data() + h * n * d, n);
      EXPECT_TRUE(std::equal(cpu.begin(), cpu.end(), gpu.begin() + static_cast<std::ptrdiff_t>(off[h])))
          << codec::decision_name(codecs[h].decision()) << " n=" << n;
    }
    EXPECT_THROW(encode_batch_async(nullptr, 2, 1, st), Error);
    EXPECT_THROW(encode_batch_async(djobs, -1, 1, st), Error);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
    cudaFree(dx);
    cudaFree(dout);
    cudaFree(djobs);
  }
}

// The GPU decoder on the GPU's codes = the CPU decoder on the CPU's (the codes are the same bytes;
// values to test_cuda_codec.cpp's tolerance).
TEST(CudaEncode, GpuDecodeOfGpuCodes) {
  REQUIRE_GPU();
  const int d = 96, n = 300;
  for (const auto& [name, dec] : every_kind(d)) {
    const HeadCodec c(dec, d);
    const DeviceHead dev(c);
    const std::vector<float> x = t::gaussian_rows(n, d, 31, 2.0);
    std::vector<uint8_t> gpu(c.packed_bytes(n));
    dev.encode(x.data(), n, gpu.data());
    std::vector<float> xg(static_cast<size_t>(n) * d), xc(xg.size());
    dev.decode(gpu.data(), n, xg.data());
    c.decode(c.encode(x.data(), n).data(), n, xc.data());
    for (int tk = 0; tk < n; ++tk) {
      double nrm = 0;
      for (int i = 0; i < d; ++i) nrm += double(xc[size_t(tk) * d + i]) * xc[size_t(tk) * d + i];
      for (int i = 0; i < d; ++i) {
        const size_t j = size_t(tk) * d + i;
        ASSERT_NEAR(xg[j], xc[j], 2e-5 * (1 + std::sqrt(nrm))) << name << " token " << tk << " dim " << i;
      }
    }
  }
}

TEST(CudaEncode, InvalidArgumentsThrow) {
  REQUIRE_GPU();
  const HeadCodec c(t::tq_uniform(64, 3), 64);
  const DeviceHead dev(c);
  uint8_t* out = nullptr;
  CUDA_OK(cudaMalloc(&out, c.packed_bytes(4)));
  EXPECT_THROW(encode_async(dev, nullptr, 4, out), Error);
  EXPECT_THROW(encode_async(dev, reinterpret_cast<const float*>(out), -1, out), Error);
  EXPECT_NO_THROW(encode_async(dev, nullptr, 0, nullptr));  // nothing to do
  std::vector<float> bad(64, 1.f);
  bad[5] = NAN;
  std::vector<uint8_t> packed(c.packed_bytes(1));
  EXPECT_THROW(dev.encode(bad.data(), 1, packed.data()), Error);  // as the CPU encoder
  cudaFree(out);
}

}  // namespace
}  // namespace kvq::cuda
