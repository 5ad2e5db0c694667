// PackedKvCache::append: the new tokens coded on the GPU (encode_async, kvq/cuda/encode.hpp) into
// the cache's scratch, then appended as append_packed does; KIVI K heads re-encode their open
// group instead (kivi_k_append_kernel). In its own file so that only binaries
// calling append link the encoder.
#include "kv_cache_impl.hpp"
#include "kvq/cuda/encode.hpp"

namespace kvq::cuda {

void PackedKvCache::append(int layer, const float* k_dev, const float* v_dev, void* stream) {
  const detail::CacheLayer& L = impl_->layer(layer);
  for (size_t b = 0; b < L.kivi_open_unknown.size(); ++b)
    if (L.kivi_open_unknown[b])
      throw Error("", "kv cache: append layer " + std::to_string(layer) + " sequence " + std::to_string(b),
                  "a load left a partial KIVI K group whose rows the cache does not hold: load whole groups");
  Impl& I = *impl_;
  const KvCacheSpec& s = I.spec;
  const int B = s.batch, n_kv = s.n_kv_heads, d = s.head_dim;
  float* x = I.x_scratch.as<float>();
  uint8_t* codes = I.code_scratch.as<uint8_t>();
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  detail::launch_gather_tokens(k_dev, v_dev, x, B, n_kv, d, st);
  for (int side = 0; side < 2; ++side) {
    size_t off = side ? L.step_bytes[0] : 0;
    for (int h = 0; h < n_kv; ++h) {
      const DeviceHead& dh = (side ? L.vdev : L.kdev)[static_cast<size_t>(h)];
      if (dh.codec().layout().tokens_per_block > 1) continue;  // KIVI K: re-encoded in launch_append
      encode_async(dh, x + (static_cast<size_t>(side) * n_kv + h) * static_cast<size_t>(B) * d, B, codes + off, stream);
      off += dh.codec().packed_bytes(B);
    }
  }
  I.launch_append(layer, codes, codes + L.step_bytes[0], st);
}

void PackedKvCache::append_host(int layer, const float* k_host, const float* v_host) {
  const KvCacheSpec& s = impl_->spec;
  const size_t bytes = sizeof(float) * static_cast<size_t>(s.batch) * s.n_kv_heads * s.head_dim;
  impl_->host_k.upload(k_host, bytes);
  impl_->host_v.upload(v_host, bytes);
  append(layer, impl_->host_k.as<float>(), impl_->host_v.as<float>(), nullptr);
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace kvq::cuda
