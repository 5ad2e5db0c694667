// Host side of the fused decode attention (kernels in kvq/cuda/attention_kernels.cuh): launches,
// and decode_attention() over host buffers.
#include <algorithm>
#include <cmath>

#include "attention_launch.hpp"
#include "cuda_common.cuh"
#include "kvq/cuda/attention_kernels.cuh"

namespace kvq::cuda {
namespace detail {

int sm_count() {
  static const int n = [] {
    int dev = 0, c = 0;
    KVQ_CUDA_CHECK(cudaGetDevice(&dev));
    KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev));
    return c;
  }();
  return n;
}

void prepare_attention(const AttnPlan& plan) {
  int dev = 0, optin = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&dev));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (plan.smem_partial > static_cast<size_t>(optin))
    throw Error("", "cuda attention: shared memory",
                std::to_string(plan.smem_partial) + " bytes per block needed, the device allows " + std::to_string(optin));
  if (plan.smem_partial > 48 * 1024)
    KVQ_CUDA_CHECK(cudaFuncSetAttribute(attention_partial_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(plan.smem_partial)));
}

void launch_attention(const AttnPlan& plan, const AttnParams& P, float* out, cudaStream_t stream) {
  const unsigned B = static_cast<unsigned>(P.batch);
  if (!P.rope_enabled) {
    attention_query_kernel<<<dim3(static_cast<unsigned>(P.n_q), B), kThreads, plan.smem_query, stream>>>(P);
    KVQ_CUDA_CHECK(cudaGetLastError());
  }
  attention_partial_kernel<<<dim3(static_cast<unsigned>(P.n_splits), static_cast<unsigned>(P.n_kv), B), kThreads,
                             plan.smem_partial, stream>>>(P);
  KVQ_CUDA_CHECK(cudaGetLastError());
  attention_combine_kernel<<<dim3(static_cast<unsigned>(P.n_q), B), kThreads, plan.smem_combine, stream>>>(P, out);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail

using detail::DeviceBuffer;

void decode_attention(const codec::AttentionProblem& p, const std::vector<const DeviceHead*>& k_dev,
                      const std::vector<const DeviceHead*>& v_dev, float* out) {
  detail::require_device();
  codec::validate(p);
  const size_t n_kv = static_cast<size_t>(p.n_kv_heads);
  if (k_dev.size() != n_kv || v_dev.size() != n_kv)
    throw Error("", "cuda attention: device heads", "need one K and one V DeviceHead per KV head");
  std::vector<detail::DevHead> kh(n_kv), vh(n_kv);
  for (size_t i = 0; i < n_kv; ++i) {
    kh[i] = k_dev[i]->impl().view;
    vh[i] = v_dev[i]->impl().view;
  }
  detail::AttnShape sh;
  sh.n_q_heads = p.n_q_heads;
  sh.n_kv_heads = p.n_kv_heads;
  sh.head_dim = p.head_dim;
  sh.batch = 1;
  sh.max_tokens = p.n_tokens;
  sh.window = p.window;
  sh.softmax_scale = p.softmax_scale;
  sh.rope = p.rope;
  const detail::AttnPlan plan = detail::plan_attention(sh, p.k_codecs, kh, vh, detail::sm_count());
  detail::prepare_attention(plan);
  const int T = p.n_tokens, d = p.head_dim;
  const size_t n_q = static_cast<size_t>(p.n_q_heads);

  std::vector<DeviceBuffer> bufs;
  std::vector<const uint8_t*> kptr(n_kv), vptr(n_kv);
  for (size_t i = 0; i < n_kv; ++i) {
    const size_t kb = k_dev[i]->codec().packed_bytes(T), vb = v_dev[i]->codec().packed_bytes(T);
    bufs.emplace_back(kb);
    bufs.back().upload(p.k_packed[i], kb);
    kptr[i] = bufs.back().as<uint8_t>();
    bufs.emplace_back(vb);
    bufs.back().upload(p.v_packed[i], vb);
    vptr[i] = bufs.back().as<uint8_t>();
  }
  DeviceBuffer d_kh = detail::upload_vector(kh), d_vh = detail::upload_vector(vh);
  DeviceBuffer d_kptr = detail::upload_vector(kptr), d_vptr = detail::upload_vector(vptr);
  DeviceBuffer d_q(sizeof(float) * n_q * d);
  d_q.upload(p.q, sizeof(float) * n_q * d);
  DeviceBuffer d_pos, d_freq;
  if (plan.shape.rope_enabled) {
    d_pos.reset(sizeof(int32_t) * static_cast<size_t>(T));
    d_pos.upload(p.positions, sizeof(int32_t) * static_cast<size_t>(T));
    d_freq = detail::upload_vector(plan.inv_freq);
  }
  DeviceBuffer ws_qc(sizeof(float) * plan.ws_qc), ws_m(sizeof(float) * plan.ws_ml), ws_l(sizeof(float) * plan.ws_ml);
  DeviceBuffer ws_acc(sizeof(float) * plan.ws_acc);
  DeviceBuffer d_out(sizeof(float) * n_q * d);
  const detail::AttnParams P = detail::make_attn_params(
      plan, {d_kh.as<detail::DevHead>(), d_vh.as<detail::DevHead>(), d_kptr.as<const uint8_t*>(),
             d_vptr.as<const uint8_t*>(), d_q.as<float>(), nullptr, d_pos.as<int32_t>(), T, d_freq.as<double>(),
             ws_qc.as<float>(), ws_m.as<float>(), ws_l.as<float>(), ws_acc.as<float>()});
  detail::launch_attention(plan, P, d_out.as<float>(), nullptr);
  d_out.download(out, sizeof(float) * n_q * d);
}

void decode_attention(const codec::AttentionProblem& p, float* out) {
  codec::validate(p);
  std::vector<DeviceHead> heads;
  heads.reserve(2 * static_cast<size_t>(p.n_kv_heads));
  std::vector<const DeviceHead*> k, v;
  for (int h = 0; h < p.n_kv_heads; ++h) {
    heads.emplace_back(*p.k_codecs[static_cast<size_t>(h)]);
    k.push_back(&heads.back());
    heads.emplace_back(*p.v_codecs[static_cast<size_t>(h)]);
    v.push_back(&heads.back());
  }
  decode_attention(p, k, v, out);
}

}  // namespace kvq::cuda
