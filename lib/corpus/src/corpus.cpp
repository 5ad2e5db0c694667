#include "kvq/corpus/corpus.hpp"

#include <algorithm>
#include <filesystem>

#include "kvq/util/rng.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"

namespace fs = std::filesystem;

namespace kvq {

// Length of the valid UTF-8 sequence at s[i], or 0 if invalid (overlongs, surrogates, > U+10FFFF).
static int utf8_seq_len(const unsigned char* s, size_t n, size_t i) {
  unsigned char c = s[i];
  if (c < 0x80) return 1;
  int len;
  uint32_t min;
  if ((c & 0xE0) == 0xC0) { len = 2; min = 0x80; }
  else if ((c & 0xF0) == 0xE0) { len = 3; min = 0x800; }
  else if ((c & 0xF8) == 0xF0) { len = 4; min = 0x10000; }
  else return 0;
  if (i + len > n) return 0;
  uint32_t cp = c & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    if ((s[i + k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i + k] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

int64_t find_invalid_utf8(const std::string& str) {
  auto s = reinterpret_cast<const unsigned char*>(str.data());
  for (size_t i = 0; i < str.size();) {
    int l = utf8_seq_len(s, str.size(), i);
    if (l == 0) return int64_t(i);
    i += l;
  }
  return -1;
}

static std::string replace_invalid_utf8(const std::string& str, int64_t* replaced) {
  auto s = reinterpret_cast<const unsigned char*>(str.data());
  std::string out;
  out.reserve(str.size());
  for (size_t i = 0; i < str.size();) {
    int l = utf8_seq_len(s, str.size(), i);
    if (l == 0) { out += "\xEF\xBF\xBD"; ++*replaced; ++i; }
    else { out.append(str, i, l); i += l; }
  }
  return out;
}

CorpusText read_corpus(const std::vector<std::string>& paths, bool lossy_utf8) {
  if (paths.empty()) throw Error("", "--corpus", "no corpus path given");
  std::vector<std::string> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      if (found.empty()) throw Error(p, "--corpus", "folder holds no files");
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      throw Error(p, "--corpus", "no such file or folder");
    }
  }
  CorpusText c;
  for (const auto& f : files) {
    std::string text = read_file(f);
    CorpusFile cf;
    cf.path = f;
    cf.bytes = int64_t(text.size());
    cf.sha256 = sha256_hex(text.data(), text.size());
    int64_t bad = find_invalid_utf8(text);
    if (bad >= 0) {
      if (!lossy_utf8)
        throw Error(f, "utf-8", "invalid byte at offset " + std::to_string(bad) +
                                    " (use --lossy-utf8 to replace invalid bytes)");
      text = replace_invalid_utf8(text, &cf.replaced_bytes);
    }
    c.files.push_back(cf);
    c.texts.push_back(std::move(text));
  }
  return c;
}

std::vector<int32_t> tokenize_corpus(const CorpusText& c,
                                     const std::function<std::vector<int>(const std::string&)>& encode,
                                     size_t chunk_bytes) {
  std::vector<int32_t> out;
  for (const auto& text : c.texts) {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = std::min(text.size(), pos + chunk_bytes);
      if (end < text.size()) {
        size_t nl = text.find('\n', end);  // extend to the next line end so words stay whole
        end = nl == std::string::npos ? text.size() : nl + 1;
      }
      std::string chunk = text.substr(pos, end - pos);
      // Whitespace-only chunks tokenize to nothing useful; skip them so blank runs do not matter.
      if (chunk.find_first_not_of(" \t\r\n") != std::string::npos)
        for (int id : encode(chunk)) out.push_back(int32_t(id));
      pos = end;
    }
  }
  return out;
}

WindowPlan plan_windows(int64_t n_tokens, int seq_len, int samples, int holdout, uint64_t seed,
                        const std::vector<int>& prefix, const std::string& corpus_name) {
  if (seq_len < 2) throw Error("", "--seq-len", "must be at least 2, got " + std::to_string(seq_len));
  if (int64_t(seq_len) <= int64_t(prefix.size()))
    throw Error("", "--seq-len",
                std::to_string(seq_len) + " leaves no corpus token after the tokenizer's " +
                    std::to_string(prefix.size()) + "-token prefix");
  if (samples < 1) throw Error("", "--samples", "must be at least 1, got " + std::to_string(samples));
  if (holdout < 0) throw Error("", "--holdout", "must be >= 0, got " + std::to_string(holdout));
  WindowPlan p;
  p.seq_len = seq_len;
  p.prefix = prefix;
  p.seed = seed;
  const int64_t slot = p.slot();
  const int64_t n_slots = n_tokens / slot;
  const int64_t need = int64_t(samples) + holdout;
  if (n_slots < need)
    throw Error(corpus_name, "--samples",
                "corpus too short: " + std::to_string(n_tokens) + " tokens give " + std::to_string(n_slots) +
                    " windows of " + std::to_string(seq_len) + ", but samples+holdout = " + std::to_string(need));
  // Partial Fisher-Yates over slot indices: the first `need` entries are a seeded uniform draw.
  std::vector<int64_t> idx(static_cast<size_t>(n_slots));
  for (int64_t i = 0; i < n_slots; ++i) idx[size_t(i)] = i;
  Rng rng(seed);
  for (int64_t i = 0; i < need; ++i) {
    int64_t j = i + int64_t(rng.below(uint64_t(n_slots - i)));
    std::swap(idx[size_t(i)], idx[size_t(j)]);
  }
  for (int64_t i = 0; i < need; ++i) (i < samples ? p.calib : p.holdout).push_back(idx[size_t(i)] * slot);
  return p;
}

void window_ids(const std::vector<int32_t>& stream, const WindowPlan& plan, int64_t offset, int64_t* out) {
  const int64_t head = int64_t(plan.prefix.size());
  KVQ_ASSERT(offset >= 0 && offset + plan.slot() <= int64_t(stream.size()));
  for (int64_t t = 0; t < head; ++t) out[t] = plan.prefix[size_t(t)];
  for (int64_t t = head; t < plan.seq_len; ++t) out[t] = stream[size_t(offset + t - head)];
}

}  // namespace kvq
