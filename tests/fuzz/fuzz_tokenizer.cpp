// llama2.c tokenizer.bin (SentencePiece is loaded through dlmopen and is not fuzzed: the module
// path points nowhere, so a non-tokenizer.bin input ends in kvq::Error). A file that loads is
// then used: encode of fixed texts (BPE merges) and decode of every id.
#include <cstdlib>
#include <vector>

#include "fuzz_common.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/error.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("KVQ_SPM_MODULE", "/nonexistent/kvq-fuzz/libkvq_spm.so", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvq_fuzz::write_scratch(".tok.bin", data, size);
  try {
    auto tok = kvq::Tokenizer::load(path);
    static const char* texts[] = {"", " ", "Once upon a time, there was a little girl.",
                                  "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80 \xff\xfe", "<0x0A>\n\t  aaaa"};
    for (const char* t : texts) {
      std::vector<int> ids = tok->encode(t);
      for (int id : ids)
        if (id < 0 || id >= tok->vocab_size()) {
          // Byte fallback (id = byte + 3) past a small vocabulary: decode must reject it cleanly.
          try { tok->decode({id}); } catch (const kvq::Error&) {}
        }
    }
    std::vector<int> all;
    for (int i = 0; i < tok->vocab_size() && i < 4096; ++i) all.push_back(i);
    (void)tok->decode(all);
    try { tok->decode({tok->vocab_size()}); } catch (const kvq::Error&) {}
  } catch (const kvq::Error&) {
  }
  return 0;
}
