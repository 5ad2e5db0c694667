// llama2.c legacy ("v0") checkpoints: the 7 int32 header fields (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size — negative when the classifier follows the weights — seq_len),
// then fp32 arrays in a fixed order whose total the file's size must equal. Torch-free.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kvq/model/llama2c.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "llama2c_header.hpp"

namespace kvq {
namespace detail {

ModelConfig llama2c_header_config(const MappedFile& f, std::string* config_sha256) {
  const std::string& path = f.path();
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
  if (config_sha256) *config_sha256 = sha256_hex(f.data(), kHeaderBytes);
  return c;
}

}  // namespace detail

ModelConfig llama2c_config(const std::string& path, std::string* config_sha256) {
  const detail::MappedFile f(path);
  return detail::llama2c_header_config(f, config_sha256);
}

}  // namespace kvq
