// PackedKvCache::append: the new tokens coded on the GPU (encode_async, kvq/cuda/encode.hpp) into
// the cache's scratch, then appended as append_packed does. In its own file so that only binaries
// calling append link the encoder.
#include "kv_cache_impl.hpp"
#include "kvq/cuda/encode.hpp"

namespace kvq::cuda {

void PackedKvCache::append(int layer, const float* k_dev, const float* v_dev, void* stream) {
  const detail::CacheLayer& L = impl_->layer(layer);
  if (!L.appendable)
    throw Error("", "kv cache: append layer " + std::to_string(layer),
                "a head stores several tokens per block (KIVI K): load whole blocks instead");
  Impl& I = *impl_;
  const KvCacheSpec& s = I.spec;
  const int B = s.batch, n_kv = s.n_kv_heads, d = s.head_dim;
  float* x = I.x_scratch.as<float>();
  uint8_t* codes = I.code_scratch.as<uint8_t>();
  detail::launch_gather_tokens(k_dev, v_dev, x, B, n_kv, d, static_cast<cudaStream_t>(stream));
  for (int side = 0; side < 2; ++side) {
    size_t off = side ? L.step_bytes[0] : 0;
    for (int h = 0; h < n_kv; ++h) {
      const DeviceHead& dh = (side ? L.vdev : L.kdev)[static_cast<size_t>(h)];
      encode_async(dh, x + (static_cast<size_t>(side) * n_kv + h) * static_cast<size_t>(B) * d, B, codes + off, stream);
      off += dh.codec().packed_bytes(B);
    }
  }
  append_packed(layer, codes, codes + L.step_bytes[0], stream);
}

}  // namespace kvq::cuda
