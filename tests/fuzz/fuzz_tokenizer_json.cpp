// Hugging Face tokenizer.json (byte-level BPE) through Tokenizer::load. The input is the
// tokenizer.json, optionally followed by kConfigMark and a tokenizer_config.json, which is then
// written beside it (the BOS rule reads it). Both live in a private directory, so no stray
// tokenizer_config.json next to the scratch file changes the result. A file that loads is used:
// encode of fixed texts in both special-token modes (added tokens, NFC, regex splits, merges),
// decode of what came out and of every id, and an out-of-range id that must be a clean kvq::Error.
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/error.hpp"

namespace {
constexpr std::string_view kConfigMark = "\n#kvq-tokenizer-config\n";
std::string g_dir;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string templ = kvq_fuzz::scratch_path(".tokjson.XXXXXX");
  if (!::mkdtemp(templ.data())) std::abort();
  g_dir = templ;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t mark = in.find(kConfigMark);
  const std::string path = g_dir + "/tokenizer.json", cfg = g_dir + "/tokenizer_config.json";
  kvq_fuzz::write_file(path, data, mark == std::string_view::npos ? size : mark);
  if (mark == std::string_view::npos) {
    ::unlink(cfg.c_str());
  } else {
    const size_t at = mark + kConfigMark.size();
    kvq_fuzz::write_file(cfg, data + at, size - at);
  }
  try {
    auto tok = kvq::Tokenizer::load(path);
    static const char* texts[] = {"", " ", "Once upon a time, there was a little girl.\n\n",
                                  "h\xc3\xa9llo he\xcc\x81llo \xe2\x82\xac \xf0\x9f\x98\x80 \xff\xfe \xed\xa0\x80",
                                  "<|begin_of_text|><s>hi</s> <|im_start|>user\n<|endoftext|>x",
                                  "   \t\t   aaaaaaaaaaaaaaaa 12345 it's I'll don't"};
    for (const char* t : texts)
      for (auto mode : {kvq::SpecialTokens::kSpecial, kvq::SpecialTokens::kText}) {
        int matched = -1;
        const std::vector<int> ids = tok->encode_with_bos(t, mode, &matched);
        if (matched < 0) std::abort();  // encode must report the count
        for (int id : ids)
          if (id < 0 || id >= tok->vocab_size()) std::abort();  // encode emits only vocabulary ids
        (void)tok->decode(ids);
      }
    std::vector<int> all;
    for (int i = 0; i < tok->vocab_size() && i < 4096; ++i) all.push_back(i);
    try { (void)tok->decode(all); } catch (const kvq::Error&) {}  // holes in the id range are errors
    try { (void)tok->decode({tok->vocab_size()}); std::abort(); } catch (const kvq::Error&) {}
  } catch (const kvq::Error&) {
  }
  return 0;
}
