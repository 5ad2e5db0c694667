#include "kvq/eval/overlap.hpp"

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include "kvq/corpus/corpus.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/error.hpp"

namespace kvq {
namespace {

uint64_t hash_run(const int32_t* p, int n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids' bytes
  for (int i = 0; i < n; ++i) {
    uint32_t x = uint32_t(p[i]);
    for (int b = 0; b < 4; ++b) h = (h ^ ((x >> (8 * b)) & 0xffu)) * 1099511628211ull;
  }
  return h;
}

}  // namespace

std::vector<int32_t> calibration_stream(const CalibFile& c, const std::string& calib_path, const std::string& purpose,
                                        const std::string& hint) {
  const CalibProvenance& p = c.prov;
  if (p.corpus.empty()) throw Error(calib_path, "provenance.corpus", "records no corpus files");
  auto tok = [&] {
    if (!std::filesystem::is_regular_file(p.tokenizer_path))
      throw Error(calib_path, "provenance.tokenizer_path",
                  purpose + ": the calibration tokenizer " + p.tokenizer_path + " is missing");
    return Tokenizer::load(p.tokenizer_path);
  }();
  if (tok->sha256() != p.tokenizer_sha256)
    throw Error(calib_path, "provenance.tokenizer_sha256",
                purpose + ": " + p.tokenizer_path + " changed since calibration");
  CorpusText all;
  for (const auto& f : p.corpus) {
    if (!std::filesystem::is_regular_file(f.path))
      throw Error(calib_path, "provenance.corpus",
                  purpose + ": calibration corpus file " + f.path + " is missing (" + hint + ")");
    CorpusText one = read_corpus({f.path}, f.replaced_bytes > 0);
    if (one.files[0].sha256 != f.sha256)
      throw Error(calib_path, "provenance.corpus",
                  purpose + ": calibration corpus file " + f.path + " changed since calibration");
    all.files.push_back(one.files[0]);
    all.texts.push_back(std::move(one.texts[0]));
  }
  const SpecialTokens mode = parse_special_tokens(p.special_tokens_mode, "provenance.special_tokens_mode");
  std::vector<int32_t> s = tokenize_corpus(all, [&](const std::string& x) { return tok->encode(x, mode, nullptr); });
  if (int64_t(s.size()) != p.n_tokens_corpus)
    throw Error(calib_path, "provenance.n_tokens_corpus",
                purpose + ": re-tokenizing the corpus gives " + std::to_string(s.size()) +
                    " tokens, the calibration recorded " + std::to_string(p.n_tokens_corpus));
  return s;
}

OverlapReport check_disjoint(const std::vector<int32_t>& text, const std::string& text_name,
                             const std::vector<int32_t>& calib_stream, const CalibFile& c,
                             const std::string& calib_path, int ngram) {
  OverlapReport r;
  r.text_tokens = int64_t(text.size());
  r.calib_windows = int64_t(c.calib_offsets.size());
  // each window is the recorded prefix + `slot` stream tokens
  const int64_t slot = int64_t(c.prov.seq_len) - int64_t(c.prov.window_prefix_size());
  const int n = int(std::min<int64_t>(ngram, int64_t(text.size())));
  r.ngram = n;
  if (n <= 0) return r;
  struct Where {
    int64_t window, pos;
  };
  std::unordered_multimap<uint64_t, Where> runs;
  for (size_t w = 0; w < c.calib_offsets.size(); ++w) {
    const int64_t off = c.calib_offsets[w];
    if (off < 0 || off + slot > int64_t(calib_stream.size()))
      throw Error(calib_path, h5path::kCalibOffsets,
                  "window " + std::to_string(w) + " at token " + std::to_string(off) + " is past the corpus (" +
                      std::to_string(calib_stream.size()) + " tokens)");
    r.calib_tokens += slot;
    for (int64_t t = off; t + n <= off + slot; ++t) runs.emplace(hash_run(&calib_stream[size_t(t)], n), Where{int64_t(w), t});
  }
  for (size_t i = 0; i + size_t(n) <= text.size(); ++i) {
    auto range = runs.equal_range(hash_run(&text[i], n));
    for (auto it = range.first; it != range.second; ++it)
      if (std::equal(text.begin() + int64_t(i), text.begin() + int64_t(i) + n,
                     calib_stream.begin() + it->second.pos))
        throw Error(text_name, "--text",
                    "tokens " + std::to_string(i) + ".." + std::to_string(i + size_t(n) - 1) +
                        " also appear in calibration window " + std::to_string(it->second.window) +
                        " (corpus token " + std::to_string(it->second.pos) + ") of " + calib_path +
                        ": the text is not held out (" + std::to_string(n) + "-token runs compared)");
  }
  return r;
}

}  // namespace kvq
