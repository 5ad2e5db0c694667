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
  // Layer-streamed forward (default): the checkpoint stays mapped, windows go through the model in
  // chunks, layer-major, each layer converted once per chunk. false: the whole model in fp32 and
  // one forward per batch (the statistics are the same bytes either way).
  bool stream = true;
  int64_t max_memory = 0;     // bytes the plan may use; 0: 80 % of the available memory
  int64_t chunk_windows = 0;  // windows per chunk; 0: as many as --max-memory allows
  bool spill = false;         // keep the chunk's hidden states in a temporary file even when they fit
};

// "6G", "1500M", "512k", "123456" (bytes; K/M/G/T are powers of 1024) -> bytes. Throws kvq::Error
// naming `field` on anything else.
int64_t parse_memory_size(const std::string& text, const std::string& field);
// The default --max-memory: 80 % of MemAvailable, or of the cgroup's room when that is smaller.
int64_t default_memory_budget();

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
