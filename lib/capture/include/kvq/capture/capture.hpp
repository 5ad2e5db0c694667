#pragma once
// calib-capture's work: corpus -> windows -> forward with capture points -> calibration file.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/capture/ranks.hpp"
#include "kvq/io/calib_file.hpp"

namespace kvq {

struct CaptureOptions {
  std::string model;                // HF directory or llama2.c .bin
  std::string tokenizer;            // empty: the model's own (Tokenizer::default_path_for_model)
  std::vector<std::string> corpus;  // files or folders
  bool lossy_utf8 = false;
  std::string special_tokens = "special";  // "special" (as HF) or "text": see kvq::SpecialTokens
  int samples = 64;
  int seq_len = 256;
  int holdout = 4;
  int batch_size = 4;
  int reservoir_tokens = 4096;
  uint64_t seed = 0;
  int checkpoint_every = 0;  // windows; 0 = only the final file
  bool resume = false;
  std::string out;
  bool quiet = false;
  // Subset [window_begin, window_end) of the planned calibration windows (for merge and sharding);
  // window_end < 0 means all.
  int64_t window_begin = 0;
  int64_t window_end = -1;
};

// Runs the capture and writes opts.out atomically (and checkpoints). Returns the final file.
// With `ranks` active (under mpirun) the windows are sharded over the ranks: every rank checks that
// its inputs match rank 0's, captures its share (checkpoints in `<out>.rank<k>.partial`), and rank 0
// adds the sums in rank order and writes the one file; ranks other than 0 return an empty file.
// Layout of a sharded run: schemas/calibration-file.md.
CalibFile run_capture(const CaptureOptions& opts, Ranks* ranks = nullptr);

// Exact merge of two calibration files of the same model and convention over disjoint windows.
// Refuses (kvq::Error naming the field) anything that does not match.
CalibFile merge_calib(const CalibFile& a, const std::string& name_a, const CalibFile& b, const std::string& name_b);

}  // namespace kvq
