#include "tokenizer_tiktoken.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <queue>
#include <string_view>
#include <unordered_map>

#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "tokenizer_json_internal.hpp"  // Regex, compile_regex, scratch(), AddedMatcher, sanitize_utf8

namespace fs = std::filesystem;

namespace kvq {

// tiktoken's cl100k_base spells the contractions out (no (?i)): under (?i) "'ſ" would match too.
const char* const kCl100kPattern =
    R"(('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

using tokjson::json;

constexpr int kLlama3Ranks = 128000, kCl100kRanks = 100256;
constexpr int kMaxHoles = 1 << 16;  // ids past the ranks without a token (specials sit right after them)

// Strict RFC 4648 base64 (standard alphabet, '=' padding to a multiple of 4); false on anything else.
bool base64_decode(std::string_view s, std::string* out) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(abc[i])] = int8_t(i);
    return t;
  }();
  out->clear();
  if (s.empty() || s.size() % 4 != 0) return false;
  size_t pad = 0;
  while (pad < 2 && s[s.size() - 1 - pad] == '=') ++pad;
  const size_t n = s.size() - pad;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    const int v = table[static_cast<unsigned char>(s[i])];
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(char((acc >> bits) & 0xFF));
    }
  }
  // The bits left over by the padding must be zero (a canonical encoding).
  return (acc & ((1u << bits) - 1)) == 0;
}

struct Special {
  std::string content;
  int id;
};

class TiktokenTokenizer : public Tokenizer {
 public:
  TiktokenTokenizer(const std::string& path, const std::string& bytes) {
    path_ = path;
    sha256_ = sha256_hex(bytes.data(), bytes.size());
    parse_ranks(bytes);
    configure();
  }

  using Tokenizer::encode;
  std::vector<int> encode(const std::string& text) const override {
    return encode(text, SpecialTokens::kSpecial, nullptr);
  }

  std::vector<int> encode(const std::string& raw, SpecialTokens mode, int* special_matched) const override {
    std::string text;
    sanitize_utf8(raw, &text);  // the regex runs on valid UTF-8 (tiktoken takes a str)
    std::vector<int> ids;
    ids.reserve(text.size() / 3 + 8);
    int matched = 0;
    const std::string_view s(text);
    size_t at = 0;
    if (mode == SpecialTokens::kSpecial && !matcher_.empty()) {
      for (;;) {
        const auto m = matcher_.find(s, at);
        if (m[0] == std::string_view::npos) break;
        encode_ordinary(s.substr(at, m[0] - at), &ids);
        ids.push_back(int(m[2]));
        ++matched;
        at = m[1];
      }
    }
    encode_ordinary(s.substr(at), &ids);
    if (special_matched) *special_matched = matched;
    return ids;
  }

  std::string decode(const std::vector<int>& ids) const override {
    std::string out;
    for (int id : ids) {
      if (id < 0 || id >= vocab_size() || !has_id_[size_t(id)])
        throw Error(path_, "decode", "token id " + std::to_string(id) + " is not a token of this file (ids [0, " +
                                         std::to_string(vocab_size()) + "))");
      out += bytes_of_[size_t(id)];
    }
    std::string clean;
    sanitize_utf8(out, &clean);  // tiktoken decodes with errors="replace"
    return clean;
  }
  int vocab_size() const override { return int(bytes_of_.size()); }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  bool adds_bos() const override { return adds_bos_ && bos_ >= 0; }
  std::vector<int> prefix_ids() const override {
    if (!prefix_.empty()) return prefix_;
    return Tokenizer::prefix_ids();
  }

 private:
  [[noreturn]] void fail_line(size_t line, const std::string& what) const {
    throw Error(path_, "line " + std::to_string(line), what);
  }

  void parse_ranks(const std::string& bytes) {
    std::vector<std::pair<std::string, int>> tokens;
    std::unordered_map<int, size_t> line_of_rank;
    size_t line_no = 0;
    int max_rank = -1;
    for (size_t pos = 0; pos < bytes.size();) {
      size_t eol = bytes.find('\n', pos);
      if (eol == std::string::npos) eol = bytes.size();
      std::string_view line(bytes.data() + pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
        fail_line(line_no, "'" + std::string(line.substr(0, 60)) + "' is not \"base64 rank\"");
      const std::string_view b64 = line.substr(0, sp), rank_s = line.substr(sp + 1);
      std::string tok;
      if (!base64_decode(b64, &tok)) fail_line(line_no, "'" + std::string(b64.substr(0, 60)) + "' is not base64");
      if (rank_s.empty() || rank_s.size() > 9 ||
          !std::all_of(rank_s.begin(), rank_s.end(), [](char c) { return c >= '0' && c <= '9'; }))
        fail_line(line_no, "rank '" + std::string(rank_s.substr(0, 60)) + "' is not an integer in [0, 1e9)");
      const int rank = std::stoi(std::string(rank_s));
      if (rank >= (1 << 24)) fail_line(line_no, "rank " + std::to_string(rank) + " is above 2^24");
      if (auto [it, fresh] = line_of_rank.emplace(rank, line_no); !fresh)
        fail_line(line_no, "rank " + std::to_string(rank) + " already given on line " + std::to_string(it->second));
      max_rank = std::max(max_rank, rank);
      tokens.emplace_back(std::move(tok), rank);
    }
    if (tokens.empty()) throw Error(path_, "", "no \"base64 rank\" lines");
    n_ranks_ = int(tokens.size());
    // Real files number their tokens 0..n-1; a few holes are tolerated, not a 13-byte file that
    // would allocate 2^24 ids.
    if (max_rank >= n_ranks_ + kMaxHoles)
      throw Error(path_, "rank " + std::to_string(max_rank),
                  "leaves " + std::to_string(max_rank + 1 - n_ranks_) + " ids without a token (" +
                      std::to_string(n_ranks_) + " lines; at most " + std::to_string(kMaxHoles) + " holes)");
    bytes_of_.assign(size_t(max_rank) + 1, std::string());
    has_id_.assign(size_t(max_rank) + 1, 0);
    for (auto& [tok, rank] : tokens) {
      bytes_of_[size_t(rank)] = std::move(tok);
      has_id_[size_t(rank)] = 1;
    }
  }

  // Last step of loading: the keys view into bytes_of_, which is not resized afterwards.
  void build_rank_map() {
    ranks_.clear();
    ranks_.reserve(size_t(n_ranks_) * 2);
    for (size_t id = 0; id < bytes_of_.size(); ++id) {
      if (!has_id_[id] || is_special_[id]) continue;
      auto [it, fresh] = ranks_.emplace(std::string_view(bytes_of_[id]), int(id));
      if (!fresh)
        throw Error(path_, "rank " + std::to_string(id),
                    "token bytes already have rank " + std::to_string(it->second) + " (each token once)");
    }
    for (int b = 0; b < 256; ++b) {
      const char c = char(b);
      if (!ranks_.count(std::string_view(&c, 1))) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        throw Error(path_, "", std::string("byte ") + hex + " has no rank (every single byte must be a token)");
      }
    }
  }

  void add_special(const std::string& content, int id, const std::string& where) {
    if (id < 0 || id >= n_ranks_ + kMaxHoles)
      throw Error(where, std::to_string(id), "special token id outside [0, " + std::to_string(n_ranks_ + kMaxHoles) +
                                                 ") (the ranks number " + std::to_string(n_ranks_) + ")");
    if (content.empty()) throw Error(where, std::to_string(id), "empty special-token content");
    if (size_t(id) >= bytes_of_.size()) {
      bytes_of_.resize(size_t(id) + 1);
      has_id_.resize(size_t(id) + 1, 0);
    }
    if (has_id_[size_t(id)])
      throw Error(where, std::to_string(id), "special token " + json(content).dump() + " takes id " +
                                                  std::to_string(id) + ", which is already a rank of " + path_);
    bytes_of_[size_t(id)] = content;
    has_id_[size_t(id)] = 1;
    specials_.push_back({content, id});
  }

  int special_id(const std::string& content) const {
    for (const auto& s : specials_)
      if (s.content == content) return s.id;
    return -1;
  }

  // Regex, specials, BOS/EOS and prefix: from tokenizer_config.json beside the file, else from
  // what the ranks are (see tokenizer_tiktoken.hpp).
  void configure() {
    const fs::path dir = fs::path(path_).parent_path();
    const fs::path cfg_path = dir / "tokenizer_config.json";
    std::error_code ec;
    std::string pattern = kLlama3Pattern;
    if (fs::exists(cfg_path, ec)) {
      read_tokenizer_config(cfg_path.string(), dir);
    } else if (n_ranks_ == kLlama3Ranks && int(bytes_of_.size()) == kLlama3Ranks) {
      // Meta's llama-models tokenizer.py: 256 specials after the ranks, BOS <|begin_of_text|>.
      const char* named[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                             "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                             "<|python_tag|>"};
      const int n_named = int(sizeof named / sizeof named[0]);
      for (int i = 0; i < 256; ++i)
        add_special(i < n_named ? std::string(named[i]) : "<|reserved_special_token_" + std::to_string(2 + i - n_named) + "|>",
                    kLlama3Ranks + i, path_);
      bos_ = kLlama3Ranks;
      eos_ = kLlama3Ranks + 1;
      adds_bos_ = true;
    } else if (n_ranks_ == kCl100kRanks && int(bytes_of_.size()) == kCl100kRanks) {
      pattern = kCl100kPattern;  // OpenAI's cl100k_base and its five specials; no BOS
      add_special("<|endoftext|>", 100257, path_);
      add_special("<|fim_prefix|>", 100258, path_);
      add_special("<|fim_middle|>", 100259, path_);
      add_special("<|fim_suffix|>", 100260, path_);
      add_special("<|endofprompt|>", 100276, path_);
      eos_ = 100257;
    }
    is_special_.assign(bytes_of_.size(), 0);
    for (const auto& s : specials_) is_special_[size_t(s.id)] = 1;
    build_rank_map();
    for (const auto& s : specials_) matcher_.add(s.content, s.id);
    regex_ = tokjson::compile_regex(pattern, false, path_, "pattern");
  }

  void read_tokenizer_config(const std::string& cp, const fs::path& dir) {
    json c;
    try {
      c = json::parse(read_file(cp));
    } catch (const json::exception& e) {
      throw Error(cp, "", std::string("not valid JSON: ") + e.what());
    }
    if (!c.is_object()) throw Error(cp, "", "not a JSON object");
    if (c.contains("added_tokens_decoder")) {
      const json& a = c["added_tokens_decoder"];
      if (!a.is_object()) throw Error(cp, "added_tokens_decoder", "not an object");
      for (auto it = a.begin(); it != a.end(); ++it) {
        const std::string field = "added_tokens_decoder[" + json(it.key()).dump() + "]";
        const std::string& k = it.key();
        if (k.empty() || k.size() > 8 || !std::all_of(k.begin(), k.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
          throw Error(cp, field, "key is not a token id");
        if (!it.value().is_object() || !it.value().contains("content") || !it.value()["content"].is_string())
          throw Error(cp, field, "has no string \"content\"");
        add_special(it.value()["content"].get<std::string>(), std::stoi(k), cp);
      }
    }
    auto token_of = [&](const char* f) -> int {
      if (!c.contains(f) || c[f].is_null()) return -1;
      std::string s;
      if (c[f].is_string()) s = c[f].get<std::string>();
      else if (c[f].is_object() && c[f].contains("content") && c[f]["content"].is_string()) s = c[f]["content"].get<std::string>();
      else throw Error(cp, f, c[f].dump().substr(0, 80) + " is neither a string nor {content}");
      const int id = special_id(s);
      if (id < 0) throw Error(cp, f, json(s).dump() + " is not one of added_tokens_decoder");
      return id;
    };
    bos_ = token_of("bos_token");
    eos_ = token_of("eos_token");
    if (c.contains("add_bos_token")) {
      if (!c["add_bos_token"].is_boolean()) throw Error(cp, "add_bos_token", c["add_bos_token"].dump() + " is not a boolean");
      adds_bos_ = c["add_bos_token"].get<bool>();
    }
    bool glm = c.contains("tokenizer_class") && c["tokenizer_class"] == "ChatGLM4Tokenizer";
    const fs::path model_cfg = dir / "config.json";
    std::error_code ec;
    if (!glm && fs::exists(model_cfg, ec)) {
      try {
        const json m = json::parse(read_file(model_cfg.string()));
        glm = m.is_object() && m.contains("model_type") && m["model_type"] == "chatglm";
      } catch (const json::exception&) {
        // The model loader reports a broken config.json; here it only could have said "GLM".
      }
    }
    if (glm) {  // ChatGLM4Tokenizer.build_inputs_with_special_tokens: [gMASK] <sop> first, no BOS
      for (const char* t : {"[gMASK]", "<sop>"}) {
        const int id = special_id(t);
        if (id < 0) throw Error(cp, "added_tokens_decoder", std::string("GLM-4 tokenizer without ") + t);
        prefix_.push_back(id);
      }
      adds_bos_ = false;
    }
  }

  // tiktoken's encode_ordinary: the regex's matches, each merged by rank.
  void encode_ordinary(std::string_view s, std::vector<int>* ids) const {
    if (s.empty()) return;
    tokjson::MatchScratch& sc = tokjson::scratch();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t at = 0;
    while (at < s.size()) {
      int rc = regex_->jit ? pcre2_jit_match(regex_->code, subject, s.size(), at, PCRE2_NO_UTF_CHECK, sc.md, sc.mc)
                           : PCRE2_ERROR_JIT_BADOPTION;
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION)
        rc = pcre2_match(regex_->code, subject, s.size(), at, PCRE2_NO_UTF_CHECK, sc.md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw Error(path_, "pattern", std::string("regex match failed: ") + reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match is no piece; step one character on
        size_t len;
        tokjson::decode_at(s, b, &len);
        at = b + len;
        continue;
      }
      merge(s.substr(b, e - b), ids);
      at = e;
    }
  }

  int rank_of(std::string_view bytes) const {
    auto it = ranks_.find(bytes);
    return it == ranks_.end() ? -1 : it->second;
  }

  // Byte-pair merge by rank. A heap of candidate pairs over parts keyed by their start offset
  // gives tiktoken's merges (lowest rank first, leftmost on ties) in O(n log n).
  void merge(std::string_view piece, std::vector<int>* ids) const {
    if (const int whole = rank_of(piece); whole >= 0) {
      ids->push_back(whole);
      return;
    }
    const int n = int(piece.size());
    std::vector<int> end(size_t(n) + 1), prev(size_t(n) + 1);
    for (int i = 0; i < n; ++i) {
      end[size_t(i)] = i + 1;
      prev[size_t(i)] = i - 1;
    }
    struct Cand { int rank, left, mid, right; };
    auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.left > b.left; };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
    auto consider = [&](int l) {
      if (l < 0 || end[size_t(l)] >= n) return;
      const int m = end[size_t(l)], r = end[size_t(m)];
      const int rank = rank_of(piece.substr(size_t(l), size_t(r - l)));
      if (rank >= 0) heap.push({rank, l, m, r});
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      if (end[size_t(c.left)] != c.mid || end[size_t(c.mid)] != c.right) continue;  // a neighbour merged since
      end[size_t(c.left)] = c.right;
      end[size_t(c.mid)] = -1;  // no longer a part start
      if (c.right < n) prev[size_t(c.right)] = c.left;
      consider(prev[size_t(c.left)]);
      consider(c.left);
    }
    for (int i = 0; i < n; i = end[size_t(i)]) {
      const int id = rank_of(piece.substr(size_t(i), size_t(end[size_t(i)] - i)));
      KVQ_ASSERT(id >= 0);  // every single byte has a rank (checked at load), merges only make ranks
      ids->push_back(id);
    }
  }

  int n_ranks_ = 0;
  std::vector<std::string> bytes_of_;  // id -> bytes (specials: their content)
  std::vector<char> has_id_, is_special_;
  std::unordered_map<std::string_view, int> ranks_;  // keys view into bytes_of_
  std::vector<Special> specials_;
  tokjson::AddedMatcher matcher_;
  std::unique_ptr<tokjson::Regex> regex_;
  std::vector<int> prefix_;
  int bos_ = -1, eos_ = -1;
  bool adds_bos_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, const std::string& bytes) {
  return std::make_unique<TiktokenTokenizer>(path, bytes);
}

}  // namespace kvq
