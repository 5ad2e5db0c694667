// Corpus text: UTF-8 validation (checked against a straightforward reference decoder), strict and
// lossy read_corpus, and chunked tokenization.
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "kvq/corpus/corpus.hpp"
#include "kvq/util/error.hpp"

namespace {
// Reference: decode code points one at a time per RFC 3629.
int64_t ref_invalid(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned c = p[i];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return int64_t(i);
    if (n - i < len) return int64_t(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return int64_t(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return int64_t(i);
    i += len;
  }
  return -1;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const int64_t bad = kvq::find_invalid_utf8(text);
  if (bad != ref_invalid(text)) __builtin_trap();
  const std::string& path = kvq_fuzz::write_scratch(".txt", data, size);
  try {
    kvq::CorpusText c = kvq::read_corpus({path}, /*lossy_utf8=*/false);
    if (bad >= 0) __builtin_trap();  // strict mode must have refused it
  } catch (const kvq::Error&) {
    if (bad < 0) __builtin_trap();
  }
  try {
    kvq::CorpusText c = kvq::read_corpus({path}, /*lossy_utf8=*/true);
    if (c.texts.size() != 1 || kvq::find_invalid_utf8(c.texts[0]) != -1) __builtin_trap();
    if ((c.files[0].replaced_bytes > 0) != (bad >= 0)) __builtin_trap();
    auto ids = kvq::tokenize_corpus(c, [](const std::string& s) { return std::vector<int>(s.size() % 7, 1); }, 16);
    (void)ids;
  } catch (const kvq::Error&) {
    __builtin_trap();  // lossy reading of a readable file cannot fail
  }
  return 0;
}
