// llama2.c legacy ("v0") checkpoints: 7 int32 header fields (llama2c_header.cpp reads and checks
// them), then fp32 arrays in a fixed order.
#include <cstring>
#include <limits>

#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "llama2c_header.hpp"
#include "mapped_file.hpp"
#include "weights.hpp"

namespace kvq::detail {

void load_llama2c(const std::string& path, ModelConfig* cfg, ModelWeights* w,
                  std::string* config_sha256) {
  MappedFile f(path);
  constexpr uint64_t kHeaderBytes = 7 * 4;
  const ModelConfig c = llama2c_header_config(f, config_sha256);  // header and file size checked
  const uint64_t D = c.hidden_size, Hd = c.intermediate_size, L = c.n_layers, V = c.vocab_size;
  const uint64_t kvd = D * c.n_kv_heads / c.n_heads, S = c.max_seq_len, hd = c.head_dim;

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
}

}  // namespace kvq::detail
