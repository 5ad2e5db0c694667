// PackedKvCache (kvq/cuda/kv_cache.hpp): construction, setup copies, append_packed and attend.
// append (GPU encoding) lives in kv_cache_append.cu, so binaries that never call it do not need
// the encoder.
#include <algorithm>
#include <string>

#include "attention_launch.hpp"
#include "kv_cache_impl.hpp"

namespace kvq::cuda {
namespace detail {
namespace {

// grid (n_kv, batch, side): one block of 32 threads copies one token's block to position
// lengths[b] of sequence b's stream (nothing for a KIVI K head: block_bytes 0, see
// kivi_k_append_kernel).
__global__ void append_tokens_kernel(const AppendHead* heads, int n_kv, const uint8_t* k_src, const uint8_t* v_src,
                                     const int32_t* lengths, int capacity, int32_t* overflow) {
  const int h = blockIdx.x, b = blockIdx.y, side = blockIdx.z;
  const AppendHead H = heads[side * n_kv + h];
  const int32_t len = lengths[b];
  if (len >= capacity) {
    if (threadIdx.x == 0) *overflow = 1;
    return;
  }
  const uint8_t* src = (side == 0 ? k_src : v_src) + H.src_off + (size_t)b * H.block_bytes;
  uint8_t* dst = H.stream + (size_t)b * H.seq_bytes + (size_t)len * H.block_bytes;
  for (uint32_t i = threadIdx.x; i < H.block_bytes; i += blockDim.x) dst[i] = src[i];
}

__global__ void advance_lengths_kernel(int32_t* lengths, int batch, int capacity) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < batch && lengths[b] < capacity) ++lengths[b];
}

__global__ void gather_tokens_kernel(const float* k, const float* v, float* x, int batch, int n_kv, int d) {
  const size_t per_side = (size_t)batch * n_kv * d;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < 2 * per_side; i += (size_t)gridDim.x * blockDim.x) {
    const int side = i >= per_side;
    const size_t j = i - side * per_side;  // [h][b][c] in the destination
    const int c = (int)(j % d), b = (int)((j / d) % batch), h = (int)(j / ((size_t)d * batch));
    x[i] = (side ? v : k)[((size_t)b * n_kv + h) * d + c];
  }
}

}  // namespace

void launch_gather_tokens(const float* k, const float* v, float* x, int batch, int n_kv, int d, cudaStream_t s) {
  const size_t n = 2 * (size_t)batch * n_kv * d;
  const int blocks = (int)std::min<size_t>((n + 255) / 256, 1024);
  gather_tokens_kernel<<<blocks, 256, 0, s>>>(k, v, x, batch, n_kv, d);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail

using detail::DeviceBuffer;

const detail::CacheLayer& PackedKvCache::Impl::layer(int l) const {
  if (l < 0 || l >= static_cast<int>(layers.size()))
    throw Error("", "kv cache: layer", std::to_string(l) + " outside 0.." + std::to_string(layers.size() - 1));
  return layers[static_cast<size_t>(l)];
}

PackedKvCache::PackedKvCache(const KvCacheSpec& spec) : impl_(std::make_unique<Impl>()) {
  detail::require_device();
  Impl& I = *impl_;
  I.spec = spec;
  const int n_kv = spec.n_kv_heads, B = spec.batch, d = spec.head_dim;
  if (spec.layers.empty()) throw Error("", "kv cache: layers", "none");
  if (B < 1 || spec.capacity < 1)
    throw Error("", "kv cache: batch / capacity", std::to_string(B) + " / " + std::to_string(spec.capacity));
  size_t ws_qc = 0, ws_ml = 0, ws_acc = 0, scratch = 0;
  std::vector<std::vector<detail::KiviKAppend>> kivi_jobs(spec.layers.size());
  std::vector<std::vector<int>> kivi_heads(spec.layers.size());
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const KvCacheLayer& src = spec.layers[l];
    const std::string where = "kv cache: layer " + std::to_string(l);
    if (src.k.size() != static_cast<size_t>(n_kv) || src.v.size() != static_cast<size_t>(n_kv))
      throw Error("", where, std::to_string(src.k.size()) + " K / " + std::to_string(src.v.size()) +
                                 " V codecs for " + std::to_string(n_kv) + " KV heads");
    detail::CacheLayer& L = I.layers.emplace_back();
    std::vector<detail::DevHead> kh, vh;
    std::vector<const codec::HeadCodec*> kc;
    for (int h = 0; h < n_kv; ++h) {
      L.kdev.emplace_back(src.k[static_cast<size_t>(h)]);
      L.vdev.emplace_back(src.v[static_cast<size_t>(h)]);
    }
    for (int h = 0; h < n_kv; ++h) {
      kh.push_back(L.kdev[static_cast<size_t>(h)].impl().view);
      vh.push_back(L.vdev[static_cast<size_t>(h)].impl().view);
      kc.push_back(&L.kdev[static_cast<size_t>(h)].codec());
    }
    detail::AttnShape sh;
    sh.n_q_heads = spec.n_q_heads;
    sh.n_kv_heads = n_kv;
    sh.head_dim = d;
    sh.batch = B;
    sh.max_tokens = spec.capacity;
    sh.window = src.window;
    sh.softmax_scale = spec.softmax_scale;
    sh.rope = spec.rope;
    L.plan = detail::plan_attention(sh, kc, kh, vh, detail::sm_count());
    detail::prepare_attention(L.plan);
    L.d_kh = detail::upload_vector(kh);
    L.d_vh = detail::upload_vector(vh);
    if (L.plan.shape.rope_enabled) L.d_freq = detail::upload_vector(L.plan.inv_freq);
    std::vector<const uint8_t*> kptr(static_cast<size_t>(B * n_kv)), vptr(kptr.size());
    std::vector<detail::AppendHead> app(2 * static_cast<size_t>(n_kv));
    for (int side = 0; side < 2; ++side) {
      unsigned long long off = 0;
      for (int h = 0; h < n_kv; ++h) {
        const DeviceHead& dh = (side ? L.vdev : L.kdev)[static_cast<size_t>(h)];
        const size_t seq = dh.codec().packed_bytes(spec.capacity);
        L.seq_bytes.push_back(seq);
        L.streams.emplace_back(seq * static_cast<size_t>(B));
        I.bytes += seq * static_cast<size_t>(B);
        const layout::PackedLayout& pl = dh.codec().layout();
        const bool multi = pl.tokens_per_block > 1;  // KIVI K
        L.appendable = L.appendable && !multi;
        uint8_t* base = L.streams.back().as<uint8_t>();
        KVQ_CUDA_CHECK(cudaMemset(base, 0, seq * static_cast<size_t>(B)));
        for (int b = 0; b < B; ++b) (side ? vptr : kptr)[static_cast<size_t>(b * n_kv + h)] = base + seq * b;
        const uint32_t step_block = multi ? 0u : pl.block_bytes;
        app[static_cast<size_t>(side * n_kv + h)] = {base, seq, off, step_block};
        off += static_cast<unsigned long long>(step_block) * static_cast<unsigned long long>(B);
        if (multi) {  // x is filled in once the append scratch exists
          const size_t rows = static_cast<size_t>(B) * pl.tokens_per_block * static_cast<size_t>(d);
          L.kivi_rows.emplace_back(sizeof(float) * rows);
          KVQ_CUDA_CHECK(cudaMemset(L.kivi_rows.back().as<void>(), 0, sizeof(float) * rows));
          I.bytes += sizeof(float) * rows;
          kivi_jobs[l].push_back({dh.impl().d_view.as<detail::DevHead>(), nullptr, L.kivi_rows.back().as<float>(), base, seq});
          kivi_heads[l].push_back(h);
        }
      }
      L.step_bytes[side] = off;
    }
    L.d_kptr = detail::upload_vector(kptr);
    L.d_vptr = detail::upload_vector(vptr);
    L.d_append = detail::upload_vector(app);
    ws_qc = std::max(ws_qc, L.plan.ws_qc);
    ws_ml = std::max(ws_ml, L.plan.ws_ml);
    ws_acc = std::max(ws_acc, L.plan.ws_acc);
    scratch = std::max(scratch, L.step_bytes[0] + L.step_bytes[1]);
  }
  const size_t n_layers = I.layers.size();
  I.lengths.reset(sizeof(int32_t) * n_layers * static_cast<size_t>(B));
  KVQ_CUDA_CHECK(cudaMemset(I.lengths.as<void>(), 0, sizeof(int32_t) * n_layers * static_cast<size_t>(B)));
  I.overflow.reset(sizeof(int32_t));
  KVQ_CUDA_CHECK(cudaMemset(I.overflow.as<void>(), 0, sizeof(int32_t)));
  I.ws_qc.reset(sizeof(float) * ws_qc);
  I.ws_m.reset(sizeof(float) * ws_ml);
  I.ws_l.reset(sizeof(float) * ws_ml);
  I.ws_acc.reset(sizeof(float) * ws_acc);
  I.x_scratch.reset(sizeof(float) * 2 * static_cast<size_t>(n_kv) * B * d);
  for (size_t l = 0; l < n_layers; ++l) {
    detail::CacheLayer& L = I.layers[l];
    L.kivi_open_unknown.assign(static_cast<size_t>(B), 0);
    L.n_kivi = static_cast<int>(kivi_jobs[l].size());
    // K rows of head h in the gathered step: x_scratch [side 0][h][batch][d].
    for (size_t i = 0; i < kivi_jobs[l].size(); ++i)
      kivi_jobs[l][i].x = I.x_scratch.as<float>() + static_cast<size_t>(kivi_heads[l][i]) * B * d;
    if (L.n_kivi) L.d_kivi = detail::upload_vector(kivi_jobs[l]);
  }
  I.code_scratch.reset(scratch);
  const size_t kv_step = sizeof(float) * static_cast<size_t>(B) * n_kv * d;
  const size_t q_step = sizeof(float) * static_cast<size_t>(B) * spec.n_q_heads * d;
  I.host_k.reset(kv_step);
  I.host_v.reset(kv_step);
  I.host_q.reset(q_step);
  I.host_out.reset(q_step);
  I.bytes += 2 * kv_step + 2 * q_step;
  I.bytes += sizeof(float) * (ws_qc + 2 * ws_ml + ws_acc + 2 * static_cast<size_t>(n_kv) * B * d) + scratch;
}

PackedKvCache::~PackedKvCache() = default;
PackedKvCache::PackedKvCache(PackedKvCache&&) noexcept = default;
PackedKvCache& PackedKvCache::operator=(PackedKvCache&&) noexcept = default;

const KvCacheSpec& PackedKvCache::spec() const { return impl_->spec; }
size_t PackedKvCache::device_bytes() const { return impl_->bytes; }

const int32_t* PackedKvCache::lengths_device(int layer) const {
  impl_->layer(layer);
  return impl_->lengths.as<int32_t>() + static_cast<size_t>(layer) * impl_->spec.batch;
}

void PackedKvCache::load(int layer, int seq, const std::vector<const uint8_t*>& k_packed,
                         const std::vector<const uint8_t*>& v_packed, int n_tokens) {
  const detail::CacheLayer& L = impl_->layer(layer);
  const KvCacheSpec& s = impl_->spec;
  if (seq < 0 || seq >= s.batch) throw Error("", "kv cache: load sequence", std::to_string(seq));
  if (n_tokens < 0 || n_tokens > s.capacity)
    throw Error("", "kv cache: load tokens", std::to_string(n_tokens) + " for capacity " + std::to_string(s.capacity));
  const size_t n_kv = static_cast<size_t>(s.n_kv_heads);
  if (k_packed.size() != n_kv || v_packed.size() != n_kv)
    throw Error("", "kv cache: load", "need one K and one V buffer per KV head");
  for (size_t i = 0; i < 2 * n_kv; ++i) {
    const bool v = i >= n_kv;
    const size_t h = v ? i - n_kv : i;
    const DeviceHead& dh = (v ? L.vdev : L.kdev)[h];
    const size_t bytes = dh.codec().packed_bytes(n_tokens);
    if (bytes)
      KVQ_CUDA_CHECK(cudaMemcpy(L.streams[i].as<uint8_t>() + L.seq_bytes[i] * static_cast<size_t>(seq),
                                (v ? v_packed : k_packed)[h], bytes, cudaMemcpyHostToDevice));
  }
  // The open group's fp32 rows are not in the packed bytes: append cannot continue a partial one.
  bool partial = false;
  for (const DeviceHead& dh : L.kdev) {
    const uint32_t g = dh.codec().layout().tokens_per_block;
    partial = partial || (g > 1 && n_tokens % static_cast<int>(g) != 0);
  }
  impl_->layers[static_cast<size_t>(layer)].kivi_open_unknown[static_cast<size_t>(seq)] = partial;
  const int32_t n = n_tokens;
  KVQ_CUDA_CHECK(cudaMemcpy(impl_->lengths.as<int32_t>() + static_cast<size_t>(layer) * s.batch + seq, &n,
                            sizeof(n), cudaMemcpyHostToDevice));
}

std::vector<int32_t> PackedKvCache::lengths(int layer) const {
  std::vector<int32_t> out(static_cast<size_t>(impl_->spec.batch));
  KVQ_CUDA_CHECK(cudaMemcpy(out.data(), lengths_device(layer), sizeof(int32_t) * out.size(), cudaMemcpyDeviceToHost));
  return out;
}

std::vector<uint8_t> PackedKvCache::packed(int layer, int seq, int kv_head, Side side) const {
  const detail::CacheLayer& L = impl_->layer(layer);
  const KvCacheSpec& s = impl_->spec;
  if (seq < 0 || seq >= s.batch) throw Error("", "kv cache: packed sequence", std::to_string(seq));
  if (kv_head < 0 || kv_head >= s.n_kv_heads) throw Error("", "kv cache: packed kv head", std::to_string(kv_head));
  const size_t i = static_cast<size_t>(side == Side::kV ? s.n_kv_heads + kv_head : kv_head);
  const DeviceHead& dh = (side == Side::kV ? L.vdev : L.kdev)[static_cast<size_t>(kv_head)];
  std::vector<uint8_t> out(dh.codec().packed_bytes(lengths(layer)[static_cast<size_t>(seq)]));
  if (!out.empty())
    KVQ_CUDA_CHECK(cudaMemcpy(out.data(), L.streams[i].as<uint8_t>() + L.seq_bytes[i] * static_cast<size_t>(seq),
                              out.size(), cudaMemcpyDeviceToHost));
  return out;
}

bool PackedKvCache::overflowed() const {
  int32_t f = 0;
  KVQ_CUDA_CHECK(cudaMemcpy(&f, impl_->overflow.as<int32_t>(), sizeof(f), cudaMemcpyDeviceToHost));
  return f != 0;
}

size_t PackedKvCache::packed_step_bytes(int layer, Side side) const {
  return impl_->layer(layer).step_bytes[side == Side::kV ? 1 : 0];
}

void PackedKvCache::append_packed(int layer, const uint8_t* k_dev, const uint8_t* v_dev, void* stream) {
  const detail::CacheLayer& L = impl_->layer(layer);
  if (!L.appendable)
    throw Error("", "kv cache: append_packed layer " + std::to_string(layer),
                "a head stores several tokens per block (KIVI K): use append, which re-encodes its open group");
  impl_->launch_append(layer, k_dev, v_dev, static_cast<cudaStream_t>(stream));
}

void PackedKvCache::Impl::launch_append(int l, const uint8_t* k_dev, const uint8_t* v_dev, cudaStream_t st) {
  const detail::CacheLayer& L = layer(l);
  const KvCacheSpec& s = spec;
  int32_t* len = lengths.as<int32_t>() + static_cast<size_t>(l) * s.batch;
  detail::append_tokens_kernel<<<dim3(static_cast<unsigned>(s.n_kv_heads), static_cast<unsigned>(s.batch), 2), 32, 0,
                                 st>>>(L.d_append.as<detail::AppendHead>(), s.n_kv_heads, k_dev, v_dev, len,
                                       s.capacity, overflow.as<int32_t>());
  KVQ_CUDA_CHECK(cudaGetLastError());
  // KIVI K: the open block re-encoded from its rows (the new row from the step's gathered tokens),
  // before the lengths advance (the kernel reads them).
  detail::launch_kivi_k_append(L.d_kivi.as<detail::KiviKAppend>(), L.n_kivi, s.batch, len, s.capacity, st);
  detail::advance_lengths_kernel<<<(s.batch + 127) / 128, 128, 0, st>>>(len, s.batch, s.capacity);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void PackedKvCache::attend(int layer, const float* q_dev, float* out_dev, void* stream) const {
  const detail::CacheLayer& L = impl_->layer(layer);
  const Impl& I = *impl_;
  const detail::AttnParams P = detail::make_attn_params(
      L.plan, {L.d_kh.as<detail::DevHead>(), L.d_vh.as<detail::DevHead>(), L.d_kptr.as<const uint8_t*>(),
               L.d_vptr.as<const uint8_t*>(), q_dev, lengths_device(layer), nullptr, 0, L.d_freq.as<double>(),
               I.ws_qc.as<float>(), I.ws_m.as<float>(), I.ws_l.as<float>(), I.ws_acc.as<float>()});
  detail::launch_attention(L.plan, P, out_dev, static_cast<cudaStream_t>(stream));
}

void PackedKvCache::attend_host(int layer, const float* q_host, float* out_host) const {
  const KvCacheSpec& s = impl_->spec;
  const size_t bytes = sizeof(float) * static_cast<size_t>(s.batch) * s.n_q_heads * s.head_dim;
  impl_->host_q.upload(q_host, bytes);
  attend(layer, impl_->host_q.as<float>(), impl_->host_out.as<float>(), nullptr);
  impl_->host_out.download(out_host, bytes);  // cudaMemcpy: waits for the default stream
}

}  // namespace kvq::cuda
