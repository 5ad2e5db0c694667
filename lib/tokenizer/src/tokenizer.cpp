#include "kvq/tokenizer/tokenizer.hpp"

#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <queue>
#include <unordered_map>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "tokenizer_json.hpp"
#include "tokenizer_tiktoken.hpp"

namespace fs = std::filesystem;

namespace kvq {
namespace {

// The SentencePiece module (src/spm_shim.cpp) lives in its own link-map namespace; see there why.
struct SpmModule {
  void* (*load)(const char*, size_t, char*, size_t);
  void (*free)(void*);
  int (*info)(const void*, int);
  long (*encode)(const void*, const char*, size_t, int*, size_t, char*, size_t);
  long (*decode)(const void*, const int*, size_t, char*, size_t, char*, size_t);
};

const SpmModule& spm_module() {
  static const SpmModule module = [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KVQ_SPM_MODULE")) candidates.push_back(env);
#ifdef KVQ_SPM_MODULE_PATH
    candidates.push_back(KVQ_SPM_MODULE_PATH);
#endif
    candidates.push_back("libkvq_spm.so");  // the loader's search path
    std::string tried;
    for (const auto& c : candidates) {
      if (c.find('/') != std::string::npos && !fs::exists(c)) {
        tried += " " + c + " (absent)";
        continue;
      }
      void* h = dlmopen(LM_ID_NEWLM, c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        tried += " " + c + " (" + dlerror() + ")";
        continue;
      }
      SpmModule m;
      m.load = reinterpret_cast<decltype(m.load)>(dlsym(h, "kvq_spm_load"));
      m.free = reinterpret_cast<decltype(m.free)>(dlsym(h, "kvq_spm_free"));
      m.info = reinterpret_cast<decltype(m.info)>(dlsym(h, "kvq_spm_info"));
      m.encode = reinterpret_cast<decltype(m.encode)>(dlsym(h, "kvq_spm_encode"));
      m.decode = reinterpret_cast<decltype(m.decode)>(dlsym(h, "kvq_spm_decode"));
      if (m.load && m.free && m.info && m.encode && m.decode) return m;  // kept loaded for the process
      tried += " " + c + " (missing symbols)";
    }
    throw Error("", "sentencepiece", "cannot load the SentencePiece module; tried" + tried +
                                         " (set KVQ_SPM_MODULE to libkvq_spm.so)");
  }();
  return module;
}

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& bytes) : api_(spm_module()) {
    path_ = path;
    sha256_ = sha256_hex(bytes.data(), bytes.size());
    char err[512] = {0};
    handle_ = api_.load(bytes.data(), bytes.size(), err, sizeof err);
    if (!handle_) throw Error(path, "", std::string("not a SentencePiece model: ") + err);
    vocab_ = api_.info(handle_, 0);
    bos_ = api_.info(handle_, 1);
    eos_ = api_.info(handle_, 2);
  }
  ~SentencePieceTokenizer() override { api_.free(handle_); }

  using Tokenizer::encode;
  std::vector<int> encode(const std::string& text) const override {
    // Usually at most one id per byte plus the dummy prefix; normalisation can expand, so retry.
    std::vector<int> ids(text.size() + 16);
    char err[512] = {0};
    for (;;) {
      const long n = api_.encode(handle_, text.data(), text.size(), ids.data(), ids.size(), err, sizeof err);
      if (n < 0) throw Error(path_, "encode", err);
      if (size_t(n) <= ids.size()) {
        ids.resize(size_t(n));
        return ids;
      }
      ids.resize(size_t(n));
    }
  }
  std::string decode(const std::vector<int>& ids) const override {
    for (int id : ids)
      if (id < 0 || id >= vocab_)
        throw Error(path_, "decode", "token id " + std::to_string(id) + " outside [0, " + std::to_string(vocab_) + ")");
    std::string text(ids.size() * 8 + 16, '\0');
    char err[512] = {0};
    for (;;) {
      const long n = api_.decode(handle_, ids.data(), ids.size(), text.data(), text.size(), err, sizeof err);
      if (n < 0) throw Error(path_, "decode", err);
      if (size_t(n) <= text.size()) {
        text.resize(size_t(n));
        return text;
      }
      text.resize(size_t(n));
    }
  }
  int vocab_size() const override { return vocab_; }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }

 private:
  const SpmModule& api_;
  void* handle_ = nullptr;
  int vocab_ = 0, bos_ = -1, eos_ = -1;
};

// llama2.c tokenizer.bin: int32 max_token_length, then per token float32 score, int32 length,
// bytes. The file has no count and no ids for BOS/EOS: llama2.c fixes them at 1 and 2.
class Llama2cTokenizer : public Tokenizer {
 public:
  // Returns false (and leaves *this unusable) when `bytes` is not exactly such a file.
  bool parse(const std::string& bytes) {
    if (bytes.size() < 4) return false;
    int32_t max_len;
    std::memcpy(&max_len, bytes.data(), 4);
    if (max_len <= 0 || max_len > (1 << 16)) return false;
    size_t pos = 4;
    while (pos < bytes.size()) {
      if (bytes.size() - pos < 8) return false;
      float score;
      int32_t len;
      std::memcpy(&score, bytes.data() + pos, 4);
      std::memcpy(&len, bytes.data() + pos + 4, 4);
      pos += 8;
      if (!std::isfinite(score) || len < 0 || len > max_len || bytes.size() - pos < size_t(len)) return false;
      pieces_.emplace_back(bytes.data() + pos, size_t(len));
      scores_.push_back(score);
      pos += size_t(len);
    }
    // <unk>, BOS, EOS, then the 256 byte-fallback pieces: encode maps an unknown byte b to id b + 3,
    // so a smaller vocabulary would hand out ids past its end.
    if (pieces_.size() < 3 + 256) return false;
    for (int i = 0; i < int(pieces_.size()); ++i) lookup_.emplace(pieces_[i], i);  // first id wins
    return true;
  }
  void set_identity(const std::string& path, const std::string& bytes) {
    path_ = path;
    sha256_ = sha256_hex(bytes.data(), bytes.size());
  }

  using Tokenizer::encode;
  std::vector<int> encode(const std::string& text) const override {
    std::vector<int> ids;
    if (text.empty()) return ids;
    if (int sp = find(" "); sp >= 0) ids.push_back(sp);  // llama2.c's dummy prefix
    for (size_t i = 0; i < text.size();) {
      size_t j = i + 1;  // one UTF-8 character: a lead byte and up to 3 continuation bytes
      while (j < text.size() && j - i < 4 && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80) ++j;
      const int id = find(text.substr(i, j - i));
      if (id >= 0) {
        ids.push_back(id);
      } else {
        for (size_t b = i; b < j; ++b) ids.push_back(int(static_cast<unsigned char>(text[b])) + 3);
      }
      i = j;
    }
    merge(&ids);
    return ids;
  }

  std::string decode(const std::vector<int>& ids) const override {
    std::string out;
    int prev = -1;
    for (int id : ids) {
      if (id < 0 || id >= vocab_size())
        throw Error(path_, "decode", "token id " + std::to_string(id) + " outside [0, " + std::to_string(vocab_size()) + ")");
      if (id == bos_id() || id == eos_id()) {  // control tokens print nothing
        prev = id;
        continue;
      }
      const std::string& piece = pieces_[id];
      unsigned byte;
      if (piece.size() == 6 && std::sscanf(piece.c_str(), "<0x%02X>", &byte) == 1) {
        out.push_back(char(byte));
      } else if (prev == bos_id() && !piece.empty() && piece[0] == ' ') {
        out.append(piece, 1, std::string::npos);  // the dummy-prefix space after BOS
      } else {
        out += piece;
      }
      prev = id;
    }
    return out;
  }
  int vocab_size() const override { return int(pieces_.size()); }
  int bos_id() const override { return 1; }
  int eos_id() const override { return 2; }

 private:
  int find(const std::string& s) const {
    auto it = lookup_.find(s);
    return it == lookup_.end() ? -1 : it->second;
  }

  // llama2.c merges the adjacent pair whose concatenation has the best score, leftmost on ties,
  // until none is in the vocabulary. A heap over a linked list gives the same merges in
  // O(n log n) instead of rescanning the whole text per merge (corpora are megabytes).
  void merge(std::vector<int>* ids) const {
    const int n = int(ids->size());
    if (n < 2) return;
    std::vector<int> tok(*ids), next(n), prev(n);
    std::vector<char> alive(n, 1);
    for (int i = 0; i < n; ++i) { next[i] = i + 1; prev[i] = i - 1; }
    struct Cand { float score; int left, right, left_tok, right_tok, merged; };
    auto worse = [](const Cand& a, const Cand& b) {
      return a.score != b.score ? a.score < b.score : a.left > b.left;
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
    auto consider = [&](int l, int r) {
      if (l < 0 || r >= n) return;
      const int m = find(pieces_[tok[l]] + pieces_[tok[r]]);
      if (m >= 0 && scores_[m] > -1e10f) heap.push({scores_[m], l, r, tok[l], tok[r], m});  // llama2.c's floor
    };
    for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || tok[c.left] != c.left_tok ||
          tok[c.right] != c.right_tok)
        continue;  // stale: a neighbour merged since this pair was queued
      tok[c.left] = c.merged;
      alive[c.right] = 0;
      next[c.left] = next[c.right];
      if (next[c.right] < n) prev[next[c.right]] = c.left;
      consider(prev[c.left], c.left);
      consider(c.left, next[c.left]);
    }
    ids->clear();
    for (int i = 0; i < n; i = next[i]) ids->push_back(tok[i]);
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> lookup_;
};

}  // namespace

const char* to_string(SpecialTokens mode) { return mode == SpecialTokens::kText ? "text" : "special"; }

SpecialTokens parse_special_tokens(const std::string& value, const std::string& field) {
  if (value == "special") return SpecialTokens::kSpecial;
  if (value == "text") return SpecialTokens::kText;
  throw Error("", field, "'" + value + "' is neither 'special' nor 'text'");
}

std::vector<int> Tokenizer::encode(const std::string& text, SpecialTokens, int* special_matched) const {
  // SentencePiece and llama2.c have no special-token strings in their encode: both modes agree.
  if (special_matched) *special_matched = 0;
  return encode(text);
}

std::vector<int> Tokenizer::prefix_ids() const {
  if (adds_bos() && bos_id() >= 0) return {bos_id()};
  return {};
}

std::vector<int> Tokenizer::encode_with_bos(const std::string& text, SpecialTokens mode, int* special_matched) const {
  std::vector<int> ids = prefix_ids();
  const std::vector<int> body = encode(text, mode, special_matched);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  const std::string bytes = read_file(path);
  if (looks_like_tokenizer_json(bytes)) return load_tokenizer_json(path, bytes);
  if (looks_like_tiktoken(bytes)) return load_tiktoken(path, bytes);
  // A tokenizer.bin parses exactly to its end under strict bounds; a protobuf essentially never
  // does, so that check decides the format.
  auto l2c = std::make_unique<Llama2cTokenizer>();
  if (l2c->parse(bytes)) {
    l2c->set_identity(path, bytes);
    return l2c;
  }
  spm_module();  // a missing module is its own error, not a verdict on the file
  try {
    return std::make_unique<SentencePieceTokenizer>(path, bytes);
  } catch (const Error&) {
    throw Error(path, "", "neither a Hugging Face tokenizer.json, a tiktoken ranks file (\"base64 rank\" lines), "
                          "a llama2.c tokenizer.bin nor a SentencePiece model (tried all four)");
  }
}

std::string Tokenizer::default_path_for_model(const std::string& model_path, int vocab_size) {
  const fs::path p(model_path);
  // tokenizer.json first; Meta's original/tokenizer.model (tiktoken) only when nothing else is there.
  auto hf_dir = [](const fs::path& dir) {
    if (fs::exists(dir / "tokenizer.json")) return (dir / "tokenizer.json").string();
    if (!fs::exists(dir / "tokenizer.model") && fs::exists(dir / "original" / "tokenizer.model"))
      return (dir / "original" / "tokenizer.model").string();
    return (dir / "tokenizer.model").string();
  };
  if (fs::is_directory(p)) return hf_dir(p);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (p.filename() == "config.json" || p.extension() == ".safetensors" ||
      p.filename() == "model.safetensors.index.json")
    return hf_dir(dir);
  const fs::path plain = dir / "tokenizer.bin";
  const fs::path sized = dir / ("tok" + std::to_string(vocab_size) + ".bin");
  if (!fs::exists(plain) && fs::exists(sized)) return sized.string();
  return plain.string();
}

}  // namespace kvq
