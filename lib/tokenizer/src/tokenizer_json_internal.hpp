#pragma once
// Internals of the tokenizer.json reader (lib/model only), shared by its three parts:
//   tokenizer_json_text.cpp    UTF-8, the GPT-2 byte-level alphabet, PCRE2 compile, sanitize_utf8
//   tokenizer_json_load.cpp    parsing and validating tokenizer.json / tokenizer_config.json
//   tokenizer_json_encode.cpp  added-token split, NFC, pre-tokenization, BPE merges, cache, decode
// The pipeline is HF's: added tokens split out of the raw text, normalizer (NFC or none),
// pre-tokenizer (Split with the file's regex, ByteLevel), BPE by merge rank, post-processor for
// the BOS; the README's model-family table lists what is read and what is refused.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/error.hpp"
#include "tokenizer_json.hpp"

namespace kvq::tokjson {

using json = nlohmann::json;

// ---- UTF-8 and Unicode helpers (input is valid UTF-8 by the time they run) ----

inline int32_t decode_at(std::string_view s, size_t i, size_t* len) {
  utf8proc_int32_t cp = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  utf8proc_ssize_t(s.size() - i), &cp);
  *len = n > 0 ? size_t(n) : 1;
  return n > 0 ? cp : 0xFFFD;
}

// The code point ending at byte `end` (exclusive).
inline int32_t decode_before(std::string_view s, size_t end, size_t* len) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80 && end - b < 4) --b;
  size_t l;
  const int32_t cp = decode_at(s, b, &l);
  *len = end - b;
  return cp;
}

// Unicode White_Space (Rust's char::is_whitespace, which HF uses for lstrip/rstrip).
inline bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

inline bool is_word_char(int32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// A byte-level token string back to its raw bytes; false when a character is outside the alphabet.
bool byte_level_to_raw(const std::string& tok, std::string* raw);

// ---- PCRE2 ----

struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { if (code) pcre2_code_free(code); }
};

// Per-thread match state: a JIT stack large enough for long whitespace runs under `\s+(?!\S)`.
struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    md = pcre2_match_data_create(4, nullptr);
    mc = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (mc && stack) pcre2_jit_stack_assign(mc, nullptr, stack);
  }
  ~MatchScratch() {
    if (stack) pcre2_jit_stack_free(stack);
    if (mc) pcre2_match_context_free(mc);
    if (md) pcre2_match_data_free(md);
  }
};
inline MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

// Throws kvq::Error naming file and field when the pattern does not compile.
std::unique_ptr<Regex> compile_regex(const std::string& pattern, bool literal, const std::string& file,
                                     const std::string& field);

// Calls piece(begin, end) for every match and every gap between matches (HF's Isolated split).
template <class F>
void split_isolated(const Regex& re, std::string_view s, F&& piece) {
  MatchScratch& sc = scratch();
  size_t prev = 0, at = 0;
  while (at <= s.size()) {
    int rc = re.jit ? pcre2_jit_match(re.code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                      PCRE2_NO_UTF_CHECK, sc.md, sc.mc)
                    : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION)
      rc = pcre2_match(re.code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, PCRE2_NO_UTF_CHECK, sc.md,
                       nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error("", "pre_tokenizer", std::string("regex match failed: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
    const size_t b = ov[0], e = ov[1];
    if (e == b) {  // an empty match is no piece; step one character past it
      if (b >= s.size()) break;
      size_t len;
      decode_at(s, b, &len);
      at = b + len;
      continue;
    }
    if (b > prev) piece(prev, b);
    piece(b, e);
    prev = at = e;
  }
  if (prev < s.size()) piece(prev, s.size());
}

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex true).
extern const char* const kGpt2Pattern;

struct AddedToken {
  int id = -1;
  std::string content;
  bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

// Leftmost-longest matcher over the added-token strings (HF builds an Aho-Corasick automaton with
// MatchKind::LeftmostLongest; a trie walked from each candidate start gives the same matches).
class AddedMatcher {
 public:
  void add(const std::string& s, int token) {
    if (s.empty()) return;
    int node = 0;
    for (unsigned char c : s) {
      int next = child(node, c);
      if (next < 0) {
        next = int(nodes_.size());
        nodes_.push_back({});
        nodes_[size_t(node)].kids.push_back({c, next});
      }
      node = next;
    }
    nodes_[size_t(node)].token = token;
    first_[s[0] & 0xFF] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  // Next match at or after `from`: (begin, end, token), or begin == npos.
  std::array<size_t, 3> find(std::string_view s, size_t from) const {
    for (size_t p = from; p < s.size(); ++p) {
      if (!first_[static_cast<unsigned char>(s[p])]) continue;
      int node = 0, best_tok = -1;
      size_t best_end = 0;
      for (size_t q = p; q < s.size(); ++q) {
        node = child(node, static_cast<unsigned char>(s[q]));
        if (node < 0) break;
        if (nodes_[size_t(node)].token >= 0) {
          best_tok = nodes_[size_t(node)].token;
          best_end = q + 1;
        }
      }
      if (best_tok >= 0) return {p, best_end, size_t(best_tok)};
    }
    return {std::string_view::npos, 0, 0};
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> kids;
    int token = -1;
  };
  int child(int node, unsigned char c) const {
    for (const auto& [k, n] : nodes_[size_t(node)].kids)
      if (k == c) return n;
    return -1;
  }
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_{};
};

// The "type" string of a tokenizer.json component object; "" when absent.
std::string type_of(const json& j);

class ByteLevelBpeTokenizer : public Tokenizer {
 public:
  ByteLevelBpeTokenizer(const std::string& path, const std::string& bytes);  // tokenizer_json_load.cpp

  using Tokenizer::encode;
  std::vector<int> encode(const std::string& text) const override {
    return encode(text, SpecialTokens::kSpecial, nullptr);
  }
  std::vector<int> encode(const std::string& raw_text, SpecialTokens mode, int* special_matched) const override;
  std::string decode(const std::vector<int>& ids) const override;
  int vocab_size() const override { return int(decode_bytes_.size()); }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  bool adds_bos() const override { return adds_bos_ && bos_ >= 0; }

 private:
  // ---- loading (tokenizer_json_load.cpp) ----
  void parse_model(const json& j);
  void parse_added_tokens(const json& j);
  void parse_normalizer(const json& j);
  void parse_pre_tokenizer(const json& j);
  void parse_decoder(const json& j);
  // The id of an added token's content, else of a byte-level vocab string; -1 when neither.
  int resolve(const std::string& content) const;
  void parse_post_processor(const json& j);
  void parse_config();

  // ---- encoding (tokenizer_json_encode.cpp) ----
  static uint64_t pair_key(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void normalize(std::string_view s, std::string* out) const;
  template <class F>
  void split_added(std::string_view text, bool normalized_stage, SpecialTokens mode, std::vector<int>* ids,
                   int* matched, F&& rest) const;
  void encode_normalized(std::string_view seg, SpecialTokens mode, std::vector<int>* ids, int* matched) const;
  void pre_tokenize(size_t step, std::string_view s, std::vector<int>* ids) const;
  void pre_tokenize_step(size_t step, std::string_view s, std::vector<int>* ids) const;
  void bpe(std::string_view piece, std::vector<int>* ids) const;
  void merge(std::string_view piece, std::vector<int>* out) const;

  struct Step {
    std::unique_ptr<Regex> regex;  // null: no split at this step
    bool byte_level = false, add_prefix_space = false;
  };
  struct Merge { int rank, id; };
  static constexpr size_t kCacheEntries = size_t(1) << 20;

  std::vector<std::string> decode_bytes_;  // id -> raw bytes (added tokens: their content)
  std::vector<char> has_id_;
  std::unordered_map<std::string, int> raw_to_id_;
  std::array<int, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int> by_content_;
  AddedMatcher matcher_raw_, matcher_normalized_;
  bool nfc_ = false;
  std::vector<Step> steps_;
  bool saw_byte_level_ = false;
  int bos_ = -1, eos_ = -1;
  bool adds_bos_ = false;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int>> cache_;
};

}  // namespace kvq::tokjson
