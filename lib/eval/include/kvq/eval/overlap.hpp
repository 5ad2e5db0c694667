#pragma once
// Held-out text must not overlap the calibration windows. The calibration file records its corpus
// (paths + sha256), tokenizer and the token-stream offsets of its windows; re-tokenizing that corpus
// the way calib-capture did gives the exact calibration tokens, and any run of `ngram` tokens the
// text shares with them is an overlap.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/io/calib_file.hpp"

namespace kvq {

struct OverlapReport {
  int ngram = 0;                 // run length compared, in tokens
  int64_t calib_windows = 0;     // calibration windows checked (every planned one)
  int64_t calib_tokens = 0;
  int64_t text_tokens = 0;
};

inline constexpr int kOverlapNgram = 32;

// Throws kvq::Error (one line, naming the window and the text position) when `text` (token stream
// of the held-out text, tokenized with the calibration's tokenizer) shares a run of
// min(ngram, text length) tokens with a calibration window's tokens.
OverlapReport check_disjoint(const std::vector<int32_t>& text, const std::string& text_name,
                             const std::vector<int32_t>& calib_stream, const CalibFile& c,
                             const std::string& calib_path, int ngram = kOverlapNgram);

// The calibration corpus as calib-capture tokenized it (files re-read; sha256 checked against the
// provenance). Throws kvq::Error when a file is missing or changed, or the tokenizer differs.
// purpose / hint: what the messages say (kvq-eval's overlap check by default; kvq-probe re-reads
// its windows).
std::vector<int32_t> calibration_stream(const CalibFile& c, const std::string& calib_path,
                                        const std::string& purpose = "cannot check overlap",
                                        const std::string& hint = "run where calib-capture ran, or leave out --calib");

}  // namespace kvq
