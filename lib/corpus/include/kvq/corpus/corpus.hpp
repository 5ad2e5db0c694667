#pragma once
// Corpus: text files or folders -> token stream -> seeded windows of seq_len tokens (the
// tokenizer's prefix first: Llama [BOS], Qwen none, GLM-4 [gMASK] <sop>).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvq {

struct CorpusFile {
  std::string path;
  std::string sha256;
  int64_t bytes = 0;
  int64_t replaced_bytes = 0;  // invalid UTF-8 bytes replaced (only with lossy_utf8)
};

struct CorpusText {
  std::vector<CorpusFile> files;  // in the order read (folders expanded, sorted by path)
  std::vector<std::string> texts;
};

// Reads every path (a file, or a folder walked recursively in sorted order). Invalid UTF-8 is an
// error naming the file and byte offset, or replaced by U+FFFD and counted when lossy_utf8.
CorpusText read_corpus(const std::vector<std::string>& paths, bool lossy_utf8);

// Returns the byte offset of the first invalid UTF-8 sequence, or -1.
int64_t find_invalid_utf8(const std::string& s);

// Tokenizes each text in newline-aligned chunks of about chunk_bytes (bounded tokenizer cost;
// deterministic) and concatenates the ids. `encode` maps text -> ids without BOS.
std::vector<int32_t> tokenize_corpus(const CorpusText& c,
                                     const std::function<std::vector<int>(const std::string&)>& encode,
                                     size_t chunk_bytes = 4096);

struct WindowPlan {
  int seq_len = 0;                // T, the prefix included
  std::vector<int> prefix;        // ids every window starts with (Tokenizer::prefix_ids())
  uint64_t seed = 0;
  std::vector<int64_t> calib;     // start offsets into the token stream, calibration windows
  std::vector<int64_t> holdout;   // start offsets, held-out windows (disjoint from calib)
  int64_t slot() const { return seq_len - int64_t(prefix.size()); }  // stream tokens per window
};

// Cuts the stream into non-overlapping slots of T - |prefix| tokens (each window = prefix + one
// slot), and picks `samples` + `holdout` distinct slots by a seeded shuffle; the first `samples`
// calibrate. Throws kvq::Error when the corpus has too few slots or T leaves no room after the prefix.
WindowPlan plan_windows(int64_t n_tokens, int seq_len, int samples, int holdout, uint64_t seed,
                        const std::vector<int>& prefix, const std::string& corpus_name);

// Fills `out` (seq_len ids) with the window starting at `offset`: the prefix, then
// stream[offset .. offset + slot).
void window_ids(const std::vector<int32_t>& stream, const WindowPlan& plan, int64_t offset, int64_t* out);

}  // namespace kvq
