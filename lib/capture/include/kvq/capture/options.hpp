#pragma once
// What calib-capture is asked to do (its flags), read by every part of lib/capture.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/model/model.hpp"

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
  // Where the streamed capture's temporary files go (the payload and spill files, unlinked at once);
  // empty: the directory of --out.
  std::string tmp_dir;
  // The forward's arithmetic (kvq/model/model.hpp), recorded in the provenance. The library's
  // default is fp32; calib-capture's is default_precision().
  Precision precision = Precision::kFp32;
};

}  // namespace kvq
