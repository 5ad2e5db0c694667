// kvq-logit-hash: fingerprints what a model computes, to show that a change which should move
// nothing moved nothing. For each model: the sha256 of the fp32 logits of a fixed batch (2 windows
// of T tokens, ids (7 t + 3 b) mod vocab), loaded whole and streamed, and the memory plan's figures
// (whole fp32 bytes, each layer's fp32 and stored bytes). Run it before and after a change and
// diff the output. Test tooling: built with the tests, never installed.
#include <cstdio>
#include <exception>
#include <string>

#include "kvq/model/model.hpp"
#include "kvq/util/sha256.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: kvq-logit-hash MODEL [MODEL ...]\n");
    return 2;
  }
  kvq::set_threads(1);  // one thread: the same reduction order on every machine
  try {
    for (int a = 1; a < argc; ++a) {
      const std::string path = argv[a];
      for (const bool stream : {false, true}) {
        kvq::Model::LoadOptions lo;
        lo.stream = stream;
        const kvq::Model m = kvq::Model::load(path, lo);
        const kvq::ModelConfig& c = m.config();
        const int64_t T = std::min<int64_t>(24, c.max_seq_len);
        at::Tensor ids = at::empty({2, T}, at::kLong);
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t t = 0; t < T; ++t) ids[b][t] = (7 * t + 3 * b) % c.vocab_size;
        const at::Tensor logits = m.forward(ids).contiguous();
        const std::string h = kvq::sha256_hex(logits.data_ptr<float>(), size_t(logits.numel()) * sizeof(float));
        std::printf("%s %s %s logits %s\n", path.c_str(), c.architecture.c_str(), stream ? "streamed" : "whole", h.c_str());
        if (!stream) continue;
        std::string bytes = std::to_string(kvq::Model::whole_fp32_bytes(path));
        for (int l = 0; l < c.n_layers; ++l)
          bytes += " " + std::to_string(m.layer_fp32_bytes(l)) + "/" + std::to_string(m.layer_stored_bytes(l));
        std::printf("%s %s bytes %s\n", path.c_str(), c.architecture.c_str(), bytes.c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvq-logit-hash: %s\n", e.what());
    return 1;
  }
  return 0;
}
