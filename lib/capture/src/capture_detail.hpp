#pragma once
// Internal to kvq_capture: what the single-process capture (capture.cpp) and the sharded one under
// mpirun (sharded.cpp) share.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvq/capture/options.hpp"
#include "kvq/capture/ranks.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/corpus/corpus.hpp"
#include "kvq/model/model.hpp"

namespace kvq::capture_detail {

inline constexpr uint64_t kReservoirStream = 0x7265736572766f69ULL;  // reservoir draws independent of the window draw

// How the streamed forward fits --max-memory (plan_memory).
struct MemoryPlan {
  int64_t budget = 0;      // bytes
  int64_t layer = 0;       // the largest layer: fp32 + stored bytes
  int widest_layer = 0;
  int64_t scratch = 0;     // one batch's forward scratch
  int64_t payload = 0;     // what of the calibration file is resident (moments; reservoir and held-out
                           // rows of one layer: the rest lives in files beside --out)
  int64_t payload_in_file = 0;  // reservoir + held-out rows, file-backed
  int64_t per_window = 0;  // one window's hidden states
  int64_t chunk = 0;       // windows per chunk (a multiple of --batch)
  bool spill = false;      // the chunk's hidden states live in a temporary file beside --out
  int64_t peak() const { return layer + scratch + payload + (spill ? 0 : chunk * per_window); }
};

// The disk a run needs (plan_disk): beside --out, and in --tmp-dir when that is elsewhere.
struct DiskPlan {
  int64_t file = 0;     // the calibration file (and each checkpoint, written beside it before the rename)
  int64_t payload = 0;  // streamed: the reservoir and held-out rows in files in --tmp-dir
  int64_t spill = 0;    // streamed with a spill: one chunk's hidden states in --tmp-dir
};

// What a run derives from its inputs before the first forward.
struct Inputs {
  explicit Inputs(Model m) : model(std::move(m)) {}
  Model model;
  std::vector<int32_t> stream;
  WindowPlan plan;
  std::vector<int64_t> offsets;  // this run's calibration windows (the --windows range of the plan)
  MomentShape shape;
  CalibProvenance prov;
  MemoryPlan memory;  // streamed runs
  DiskPlan disk;
};

// Validates the options, loads model and tokenizer, tokenizes the corpus, plans the windows.
std::unique_ptr<Inputs> prepare(const CaptureOptions& o);

// The streamed forward's memory plan for this run; throws kvq::Error naming --max-memory when one
// layer's pass cannot fit. Logs the plan (info).
MemoryPlan plan_memory(const Inputs& in, const CaptureOptions& o);

// --tmp-dir, or the directory of --out.
std::string temp_dir(const CaptureOptions& o);

// The disk this run needs beside --out and in --tmp-dir; throws kvq::Error naming the directory,
// the bytes needed and the bytes free when the filesystem cannot hold them (before any forward).
// Logs the plan (info).
DiskPlan plan_disk(const Inputs& in, const CaptureOptions& o);

// Refuses (kvq::Error naming the field) to continue `old` with another run's inputs or plan.
void check_resumable(const std::string& out, const CalibFile& old, const CalibProvenance& want,
                     const std::vector<int64_t>& offsets);

// Held-out windows (c.holdout_offsets): whole q/k/v, never in the statistics.
void capture_holdout(const Inputs& in, int batch_size, CalibFile& c);

// (reservoir slot, row in batch = b*T + t) pairs chosen for one batch; later picks of a slot win.
using Picks = std::vector<std::pair<int64_t, int64_t>>;

// Forwards the calibration windows c.windows_done.. of c.calib_offsets into c.moments, in batches
// that start at multiples of --batch so a resumed run reduces the same batches. `pick` chooses
// each batch's reservoir rows (slots of c.reservoir); `checkpoint` runs every --checkpoint-every
// windows before the last; kill_after >= 0 raises SIGKILL after that many windows (tests).
void run_windows(const Inputs& in, const CaptureOptions& o, CalibFile& c,
                 const std::function<void(int64_t w0, int64_t n, Picks& picks)>& pick,
                 const std::function<void()>& checkpoint, bool quiet, int64_t kill_after);

// Tests: KVQ_TEST_KILL_AFTER_WINDOWS=K raises a real SIGKILL after K windows (of this rank; with
// KVQ_TEST_KILL_RANK=r only on rank r). -1 when unset.
int64_t test_kill_after(int rank);

// The capture sharded over the ranks of an mpirun job (sharded.cpp).
CalibFile run_sharded(const CaptureOptions& o, Ranks& ranks);

}  // namespace kvq::capture_detail
