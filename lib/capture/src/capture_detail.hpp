#pragma once
// Internal to kvq_capture: what the single-process capture (capture.cpp) and the sharded one under
// mpirun (sharded.cpp) share.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvq/capture/capture.hpp"
#include "kvq/corpus/corpus.hpp"
#include "kvq/model/model.hpp"

namespace kvq::capture_detail {

inline constexpr uint64_t kReservoirStream = 0x7265736572766f69ULL;  // reservoir draws independent of the window draw

// What a run derives from its inputs before the first forward.
struct Inputs {
  explicit Inputs(Model m) : model(std::move(m)) {}
  Model model;
  std::vector<int32_t> stream;
  WindowPlan plan;
  std::vector<int64_t> offsets;  // this run's calibration windows (the --windows range of the plan)
  MomentShape shape;
  CalibProvenance prov;
};

// Validates the options, loads model and tokenizer, tokenizes the corpus, plans the windows.
std::unique_ptr<Inputs> prepare(const CaptureOptions& o);

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
