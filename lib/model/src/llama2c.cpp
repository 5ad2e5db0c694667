// llama2.c legacy ("v0") checkpoints: 7 int32 header fields, then fp32 arrays in a fixed order.
#include <cstring>
#include <limits>

#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "mapped_file.hpp"
#include "weights.hpp"

namespace kvq::detail {

void load_llama2c(const std::string& path, ModelConfig* cfg, ModelWeights* w,
                  std::string* config_sha256) {
  MappedFile f(path);
  constexpr uint64_t kHeaderBytes = 7 * 4;
  if (f.size() < kHeaderBytes)
    throw Error(path, "header", "file is truncated: " + std::to_string(f.size()) + " bytes, the header needs 28");
  int32_t h[7];
  std::memcpy(h, f.data(), kHeaderBytes);
  // llama2.c's newer exports start with the magic "ak42"; they use a different layout.
  if (static_cast<uint32_t>(h[0]) == 0x616b3432u)
    throw Error(path, "magic", "llama2.c version-1+ export ('ak42') is not supported; export the legacy v0 format");

  static const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    const int64_t v = i == 5 ? std::abs(int64_t(h[i])) : int64_t(h[i]);
    if (v <= 0 || v > (1 << 24))
      throw Error(path, names[i], std::to_string(h[i]) + " is out of range");
  }
  ModelConfig c;
  c.architecture = "llama2c";
  c.hidden_size = h[0];
  c.intermediate_size = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.vocab_size = std::abs(h[5]);
  c.tie_word_embeddings = h[5] > 0;  // negative vocab: the classifier follows the weights
  c.max_seq_len = h[6];
  if (c.hidden_size % c.n_heads != 0)
    throw Error(path, "n_heads", std::to_string(c.n_heads) + " does not divide dim " + std::to_string(c.hidden_size));
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0)
    throw Error(path, "n_kv_heads", std::to_string(c.n_kv_heads) + " does not divide n_heads " + std::to_string(c.n_heads));
  c.head_dim = c.hidden_size / c.n_heads;
  if (c.head_dim % 2 != 0) throw Error(path, "n_heads", "head dim " + std::to_string(c.head_dim) + " is odd");
  c.rotary_dim = c.head_dim;
  c.pairing = RopePairing::kInterleaved;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.bos_id = 1;
  c.eos_id = 2;

  const uint64_t D = c.hidden_size, Hd = c.intermediate_size, L = c.n_layers, V = c.vocab_size;
  const uint64_t kvd = D * c.n_kv_heads / c.n_heads, S = c.max_seq_len, hd = c.head_dim;
  // 128-bit: header fields up to 2^24 make L*D*D overflow 64 bits.
  using u128 = unsigned __int128;
  const u128 floats = u128(V) * D + u128(L) * D + u128(L) * D * D + u128(2) * L * kvd * D + u128(L) * D * D +
                      u128(L) * D + u128(3) * L * Hd * D + D + u128(2) * S * (hd / 2) +
                      (c.tie_word_embeddings ? 0 : u128(V) * D);
  const u128 want = kHeaderBytes + 4 * floats;
  if (u128(f.size()) != want) {
    const std::string implied = want > u128(UINT64_MAX) ? "more than 2^64" : std::to_string(uint64_t(want));
    throw Error(path, "file size",
                std::to_string(f.size()) + " bytes, but the header (dim " + std::to_string(D) + ", " +
                    std::to_string(L) + " layers, vocab " + std::to_string(h[5]) + ") implies " + implied);
  }

  const uint8_t* p = f.data() + kHeaderBytes;
  auto take = [&](std::vector<int64_t> shape) {
    at::Tensor t = at::empty(shape, at::kFloat);
    const size_t bytes = static_cast<size_t>(t.numel()) * 4;
    std::memcpy(t.data_ptr<float>(), p, bytes);
    p += bytes;
    return t;
  };
  const int64_t iD = D, iHd = Hd, iL = L, iV = V, ikvd = kvd;
  w->embed = take({iV, iD});
  at::Tensor rms_att = take({iL, iD}), wq = take({iL, iD, iD}), wk = take({iL, ikvd, iD}),
             wv = take({iL, ikvd, iD}), wo = take({iL, iD, iD}), rms_ffn = take({iL, iD}),
             w1 = take({iL, iHd, iD}), w2 = take({iL, iD, iHd}), w3 = take({iL, iHd, iD});
  w->final_norm = take({iD});
  p += 2 * S * (hd / 2) * 4;  // legacy RoPE tables: recomputed by the forward
  w->lm_head = c.tie_word_embeddings ? w->embed : take({iV, iD});

  w->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& lw = w->layers[l];
    lw.attn_norm = rms_att[l].clone();
    lw.wqkv = at::cat({wq[l], wk[l], wv[l]}, 0);
    lw.wo = wo[l].clone();
    lw.ffn_norm = rms_ffn[l].clone();
    lw.w_gate_up = at::cat({w1[l], w3[l]}, 0);  // w1 is the gate, w3 the up projection
    lw.w_down = w2[l].clone();
  }
  *cfg = c;
  *config_sha256 = sha256_hex(f.data(), kHeaderBytes);
}

}  // namespace kvq::detail
