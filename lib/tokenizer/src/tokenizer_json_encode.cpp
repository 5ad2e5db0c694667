// The tokenizer.json encoding engine (added-token split, NFC, pre-tokenizer splits, ByteLevel,
// BPE merges by rank with a per-tokenizer cache) and decode.
#include <cstdlib>
#include <queue>

#include "tokenizer_json_internal.hpp"

namespace kvq::tokjson {

std::vector<int> ByteLevelBpeTokenizer::encode(const std::string& raw_text, SpecialTokens mode, int* special_matched) const {
  std::string text;
  sanitize_utf8(raw_text, &text);  // HF takes a Rust str: invalid bytes become U+FFFD first
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 8);
  int matched = 0;
  split_added(text, /*normalized_stage=*/false, mode, &ids, &matched, [&](std::string_view seg) {
    if (!nfc_) return encode_normalized(seg, mode, &ids, &matched);
    std::string norm;
    normalize(seg, &norm);
    encode_normalized(norm, mode, &ids, &matched);
  });
  if (special_matched) *special_matched = matched;
  return ids;
}

std::string ByteLevelBpeTokenizer::decode(const std::vector<int>& ids) const {
  std::string out;
  for (int id : ids) {
    if (id < 0 || id >= int(decode_bytes_.size()) || !has_id_[size_t(id)])
      throw Error(path_, "decode", "token id " + std::to_string(id) + " is not in the vocabulary");
    out += decode_bytes_[size_t(id)];
  }
  std::string clean;
  sanitize_utf8(out, &clean);  // HF's ByteLevel decoder ends in from_utf8_lossy
  return clean;
}

void ByteLevelBpeTokenizer::normalize(std::string_view s, std::string* out) const {
  bool ascii = true;
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) { ascii = false; break; }
  if (ascii) {  // NFC leaves ASCII alone
    out->assign(s);
    return;
  }
  utf8proc_uint8_t* res = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &res,
                              utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    out->assign(s);
  } else {
    out->assign(reinterpret_cast<const char*>(res), size_t(n));
  }
  std::free(res);
}

// Splits `text` on the added tokens of one stage (raw text, or normalized text); the added
// tokens' ids go to *ids, every other segment to `rest`, in order.
template <class F>
void ByteLevelBpeTokenizer::split_added(std::string_view text, bool normalized_stage, SpecialTokens mode,
                                        std::vector<int>* ids, int* matched, F&& rest) const {
  const AddedMatcher& m = normalized_stage ? matcher_normalized_ : matcher_raw_;
  if (m.empty()) {
    if (!text.empty()) rest(text);
    return;
  }
  size_t from = 0, emitted = 0;  // emitted: text before this offset is handed out
  while (from < text.size()) {
    auto [b, e, idx] = m.find(text, from);
    if (b == std::string_view::npos) break;
    const AddedToken& t = added_[idx];
    from = e;
    // With kText, special tokens are found and dropped (HF's encode_special_tokens): the text
    // they cover stays plain text.
    if (t.special && mode == SpecialTokens::kText) continue;
    if (t.single_word) {
      size_t l;
      if ((b > 0 && is_word_char(decode_before(text, b, &l))) || (e < text.size() && is_word_char(decode_at(text, e, &l))))
        continue;
    }
    if (t.lstrip) {
      size_t l;
      while (b > emitted && is_white_space(decode_before(text, b, &l))) b -= l;
    }
    if (t.rstrip) {
      size_t l;
      while (e < text.size() && is_white_space(decode_at(text, e, &l))) e += l;
      from = e;
    }
    if (b > emitted) rest(text.substr(emitted, b - emitted));
    ids->push_back(t.id);
    if (t.special) ++*matched;
    emitted = e;
  }
  if (emitted < text.size()) rest(text.substr(emitted));
}

void ByteLevelBpeTokenizer::encode_normalized(std::string_view seg, SpecialTokens mode, std::vector<int>* ids, int* matched) const {
  split_added(seg, true, mode, ids, matched, [&](std::string_view s) { pre_tokenize(0, s, ids); });
}

void ByteLevelBpeTokenizer::pre_tokenize(size_t step, std::string_view s, std::vector<int>* ids) const {
  if (s.empty()) return;
  if (step == steps_.size()) return bpe(s, ids);
  const Step& st = steps_[step];
  if (st.byte_level && st.add_prefix_space && s[0] != ' ') {
    const std::string spaced = " " + std::string(s);
    return pre_tokenize_step(step, spaced, ids);
  }
  pre_tokenize_step(step, s, ids);
}

void ByteLevelBpeTokenizer::pre_tokenize_step(size_t step, std::string_view s, std::vector<int>* ids) const {
  const Step& st = steps_[step];
  if (!st.regex) return pre_tokenize(step + 1, s, ids);
  split_isolated(*st.regex, s, [&](size_t b, size_t e) { pre_tokenize(step + 1, s.substr(b, e - b), ids); });
}

// One pre-token (raw bytes) to ids: the cache, else ignore_merges' whole-word lookup, else merges.
void ByteLevelBpeTokenizer::bpe(std::string_view piece, std::vector<int>* ids) const {
  if (piece.size() == 1) {
    if (const int id = byte_id_[static_cast<unsigned char>(piece[0])]; id >= 0) ids->push_back(id);
    return;
  }
  const std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int> out;
  if (auto it = ignore_merges_ ? raw_to_id_.find(key) : raw_to_id_.end(); it != raw_to_id_.end()) {
    out.push_back(it->second);
  } else {
    merge(piece, &out);
  }
  ids->insert(ids->end(), out.begin(), out.end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() < kCacheEntries) cache_.emplace(key, std::move(out));
}

// Repeatedly merges the adjacent pair of lowest rank (leftmost on ties), as HF's BPE does with
// its priority queue; a heap over a linked list of symbols keeps it O(n log n).
void ByteLevelBpeTokenizer::merge(std::string_view piece, std::vector<int>* out) const {
  const int n = int(piece.size());
  const size_t un = size_t(n);
  std::vector<int> tok(un), next(un), prev(un);
  int m = 0;
  for (int i = 0; i < n; ++i) {
    const int id = byte_id_[static_cast<unsigned char>(piece[size_t(i)])];
    if (id < 0) continue;  // a byte outside the vocabulary and no unk_token: dropped, as HF does
    tok[size_t(m++)] = id;
  }
  if (m == 0) return;
  for (int i = 0; i < m; ++i) { next[size_t(i)] = i + 1; prev[size_t(i)] = i - 1; }
  struct Cand { int rank, left, right, left_tok, right_tok, merged; };
  auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.left > b.left; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto consider = [&](int l, int r) {
    if (l < 0 || r >= m) return;
    auto it = merges_.find(pair_key(tok[size_t(l)], tok[size_t(r)]));
    if (it != merges_.end()) heap.push({it->second.rank, l, r, tok[size_t(l)], tok[size_t(r)], it->second.id});
  };
  for (int i = 0; i + 1 < m; ++i) consider(i, i + 1);
  std::vector<char> alive(size_t(m), 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[size_t(c.left)] || !alive[size_t(c.right)] || next[size_t(c.left)] != c.right ||
        tok[size_t(c.left)] != c.left_tok || tok[size_t(c.right)] != c.right_tok)
      continue;  // stale: a neighbour merged since this pair was queued
    tok[size_t(c.left)] = c.merged;
    alive[size_t(c.right)] = 0;
    next[size_t(c.left)] = next[size_t(c.right)];
    if (next[size_t(c.right)] < m) prev[size_t(next[size_t(c.right)])] = c.left;
    consider(prev[size_t(c.left)], c.left);
    consider(c.left, next[size_t(c.left)]);
  }
  for (int i = 0; i < m; i = next[size_t(i)]) out->push_back(tok[size_t(i)]);
}

}  // namespace kvq::tokjson
