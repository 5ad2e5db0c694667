#include "kvq/capture/capture.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <optional>

#include "capture_detail.hpp"
#include "kvq/util/rng.hpp"
#include "kvq/model/model.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/disk_space.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/payload_memory.hpp"
#include "kvq/util/progress.hpp"

namespace kvq {
namespace {

// Folds each layer into the moments and copies the reservoir rows chosen for this batch.
class CalibObserver : public CaptureObserver {
 public:
  CalibObserver(Moments& m, Reservoir& r, const MomentShape& s) : m_(m), r_(r), s_(s) {}
  // (slot, row in batch = b*T + t) pairs chosen for this batch; later picks of a slot win.
  std::vector<std::pair<int64_t, int64_t>> picks;

  void on_layer(const LayerCapture& c) override {
    m_.accumulate(c);
    const size_t d = size_t(s_.head_dim), L = size_t(s_.n_layers);
    const size_t nq = size_t(s_.n_heads) * d, nkv = size_t(s_.n_kv_heads) * d;
    const size_t nv = size_t(s_.n_kv_heads) * size_t(s_.v_dim());  // V rows at the value dim (MLA)
    for (auto [slot, row] : picks) {
      std::copy_n(c.q + row * nq, nq, r_.q.data() + (size_t(slot) * L + size_t(c.layer)) * nq);
      std::copy_n(c.k + row * nkv, nkv, r_.k.data() + (size_t(slot) * L + size_t(c.layer)) * nkv);
      std::copy_n(c.v + row * nv, nv, r_.v.data() + (size_t(slot) * L + size_t(c.layer)) * nv);
    }
  }

 private:
  Moments& m_;
  Reservoir& r_;
  MomentShape s_;
};

// Copies whole held-out windows: layout [L][M][T][heads][d].
class HoldoutObserver : public CaptureObserver {
 public:
  HoldoutObserver(Holdout& h, const MomentShape& s, int seq) : h_(h), s_(s), T_(seq) {}
  int first_window = 0;
  void on_layer(const LayerCapture& c) override {
    const size_t d = size_t(s_.head_dim), M = size_t(h_.windows), T = size_t(T_);
    const size_t nq = size_t(s_.n_heads) * d, nkv = size_t(s_.n_kv_heads) * d;
    const size_t nv = size_t(s_.n_kv_heads) * size_t(s_.v_dim());
    const size_t rows = size_t(c.batch) * T;
    const size_t base = (size_t(c.layer) * M + size_t(first_window)) * T;
    std::copy_n(c.q, rows * nq, h_.q.data() + base * nq);
    std::copy_n(c.k, rows * nkv, h_.k.data() + base * nkv);
    std::copy_n(c.v, rows * nv, h_.v.data() + base * nv);
  }

 private:
  Holdout& h_;
  MomentShape s_;
  int T_;
};

// Hidden states of a chunk in an unlinked temporary file in --tmp-dir (default: beside --out), mapped shared: a batch's
// rows are written back and their pages dropped after each step, so they do not stay resident.
class SpillFile {
 public:
  SpillFile(const std::string& dir, int64_t bytes) : size_(size_t(bytes)) {
    // Reserved before it is mapped: a full disk is one line, not a SIGBUS mid-forward.
    base_ = static_cast<uint8_t*>(
        map_reserved_temp_file(dir, ".kvq-spill-", size_, "--tmp-dir", "the hidden-state spill file"));
  }
  ~SpillFile() { ::munmap(base_, size_); }
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;
  float* at(int64_t byte_offset) { return reinterpret_cast<float*>(base_ + byte_offset); }
  // Writes bytes [offset, offset + len) back to the file and drops their pages.
  void park(int64_t offset, int64_t len) {
    const int64_t page = int64_t(::sysconf(_SC_PAGESIZE));
    const int64_t b = offset / page * page, e = std::min<int64_t>(int64_t(size_), offset + len);
    if (e <= b) return;
    (void)::msync(base_ + b, size_t(e - b), MS_SYNC);
    (void)::madvise(base_ + b, size_t(e - b), MADV_DONTNEED);
  }

 private:
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

// What an interrupted run tells its user: the checkpoint on disk and how to continue it.
std::string resume_note(const std::string& out, int64_t done, int64_t total) {
  return out + " holds the checkpoint of " + std::to_string(done) + " of " + std::to_string(total) +
         " windows: the same command with --resume continues it";
}

// Test hook: KVQ_TEST_KILL_AT_LAYER=l with KVQ_TEST_KILL_AFTER_WINDOWS=K kills the streamed run
// inside layer l of the chunk that would take it past K windows (mid-chunk, before its checkpoint).
int test_kill_layer() {
  const char* l = std::getenv("KVQ_TEST_KILL_AT_LAYER");
  return l ? std::atoi(l) : -1;
}

at::Tensor window_tensor(const capture_detail::Inputs& in, const std::vector<int64_t>& offs, size_t first,
                         size_t count) {
  const int T = in.plan.seq_len;
  at::Tensor ids = at::empty({int64_t(count), T}, at::kLong);
  for (size_t i = 0; i < count; ++i)
    window_ids(in.stream, in.plan, offs[first + i], ids.data_ptr<int64_t>() + i * T);
  return ids;
}

}  // namespace

namespace capture_detail {

void capture_holdout(const Inputs& in, int batch_size, CalibFile& c) {
  const int T = in.plan.seq_len;
  const size_t L = size_t(in.shape.n_layers), d = size_t(in.shape.head_dim);
  const size_t nq = size_t(in.shape.n_heads) * d, nkv = size_t(in.shape.n_kv_heads) * d;
  const size_t nv = size_t(in.shape.n_kv_heads) * size_t(in.shape.v_dim());
  const std::vector<int64_t>& offs = c.holdout_offsets;
  Holdout& h = c.holdout;
  h.windows = int(offs.size());
  for (int t = 0; t < (h.windows > 0 ? T : 0); ++t) h.positions.push_back(t);
  h.q = payload::zeros(L * h.windows * T * nq);
  h.k = payload::zeros(L * h.windows * T * nkv);
  h.v = payload::zeros(L * h.windows * T * nv);
  if (in.model.streamed()) {  // one chunk: each layer converted once for all held-out windows
    std::vector<std::unique_ptr<HoldoutObserver>> obs;
    std::vector<Model::ChunkBatch> batches;
    for (size_t w0 = 0; w0 < offs.size(); w0 += size_t(batch_size)) {
      size_t n = std::min(size_t(batch_size), offs.size() - w0);
      at::Tensor ids = window_tensor(in, offs, w0, n);
      h.ids.insert(h.ids.end(), ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n * T);
      obs.push_back(std::make_unique<HoldoutObserver>(h, in.shape, T));
      obs.back()->first_window = int(w0);
      batches.push_back({ids, obs.back().get(), nullptr});
    }
    Model::ChunkHooks hooks;
    hooks.after_layer = [](int) { payload::release_all(); };  // the layer's rows go to the file
    if (!batches.empty()) in.model.forward_chunk(batches, hooks);
    return;
  }
  HoldoutObserver hob(h, in.shape, T);
  for (size_t w0 = 0; w0 < offs.size(); w0 += size_t(batch_size)) {
    size_t n = std::min(size_t(batch_size), offs.size() - w0);
    at::Tensor ids = window_tensor(in, offs, w0, n);
    h.ids.insert(h.ids.end(), ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n * T);
    hob.first_window = int(w0);
    Model::ForwardOptions fo;
    fo.observer = &hob;
    fo.logits = false;
    in.model.forward(ids, fo);
  }
}

// run_windows for a streamed model: chunks of in.memory.chunk windows (whole batches, the same
// batches as the batch loop), layer-major inside a chunk. Checkpoints fall on chunk ends.
void run_windows_streamed(const Inputs& in, const CaptureOptions& o, CalibFile& c,
                          const std::function<void(int64_t w0, int64_t n, Picks& picks)>& pick,
                          const std::function<void()>& checkpoint, bool quiet, int64_t kill_after) {
  const int T = in.plan.seq_len, L = in.shape.n_layers;
  const MemoryPlan& mp = in.memory;
  const int64_t n_win = int64_t(c.calib_offsets.size());
  const int64_t n_chunks = (n_win - c.windows_done + mp.chunk - 1) / std::max<int64_t>(1, mp.chunk);
  // Progress in layer passes of windows (ETA), shown as windows, chunk and layer.
  Progress prog("calib-capture", (n_win - c.windows_done) * L, "tok", quiet);
  const int64_t start = c.windows_done;
  const int kill_layer = kill_after >= 0 ? test_kill_layer() : -1;
  int64_t last_ckpt = c.windows_done, chunk_no = 0;
  while (c.windows_done < n_win) {
    const int64_t begin = c.windows_done;
    int64_t end = std::min(n_win, begin + mp.chunk);
    if (kill_after >= 0 && kill_layer < 0 && begin < kill_after)  // the test hook kills where the batch loop would
      end = std::min(end, (kill_after + o.batch_size - 1) / o.batch_size * o.batch_size);
    ++chunk_no;
    std::vector<std::unique_ptr<CalibObserver>> obs;
    std::vector<Model::ChunkBatch> batches;
    std::vector<int64_t> row0;  // each batch's first hidden row in the chunk
    for (int64_t w0 = begin; w0 < end;) {
      const int64_t n = std::min<int64_t>(o.batch_size - (w0 % o.batch_size), end - w0);
      obs.push_back(std::make_unique<CalibObserver>(c.moments, c.reservoir, in.shape));
      pick(w0, n, obs.back()->picks);
      batches.push_back({window_tensor(in, c.calib_offsets, size_t(w0), size_t(n)), obs.back().get(), nullptr});
      row0.push_back((w0 - begin) * T);
      w0 += n;
    }
    const int64_t row_bytes = int64_t(in.model.config().hidden_size) * int64_t(sizeof(float));
    std::unique_ptr<SpillFile> spill;
    if (mp.spill) {
      spill = std::make_unique<SpillFile>(temp_dir(o), (end - begin) * T * row_bytes);
      for (size_t i = 0; i < batches.size(); ++i) batches[i].hidden = spill->at(row0[i] * row_bytes);
    }
    Model::ChunkHooks hooks;
    if (spill)
      hooks.after_step = [&](size_t i, int) {
        spill->park(row0[i] * row_bytes, batches[i].ids.size(0) * T * row_bytes);
      };
    hooks.after_layer = [&](int l) {
      payload::release_all();  // the reservoir rows of layer l go to their file (when file-backed)
      const int64_t steps = (begin - start) * L + (end - begin) * (l + 1);
      char detail[96];
      std::snprintf(detail, sizeof detail, "windows %lld-%lld/%lld  chunk %lld/%lld  layer %d/%d", (long long)begin,
                    (long long)end, (long long)n_win, (long long)chunk_no, (long long)n_chunks, l + 1, L);
      prog.update(steps, steps / L * T, detail);
      if (kill_layer == l && end > kill_after) std::raise(SIGKILL);
    };
    in.model.forward_chunk(batches, hooks);
    c.windows_done = end;
    if (o.checkpoint_every > 0 && c.windows_done < n_win && c.windows_done - last_ckpt >= o.checkpoint_every) {
      checkpoint();
      last_ckpt = c.windows_done;
      spdlog::debug("checkpoint at window {}", c.windows_done);
    }
    if (kill_after >= 0 && kill_layer < 0 && c.windows_done >= kill_after) std::raise(SIGKILL);
  }
  prog.finish();
}

void run_windows(const Inputs& in, const CaptureOptions& o, CalibFile& c,
                 const std::function<void(int64_t w0, int64_t n, Picks& picks)>& pick,
                 const std::function<void()>& checkpoint, bool quiet, int64_t kill_after) {
  const int T = in.plan.seq_len;
  const int64_t n_win = int64_t(c.calib_offsets.size());
  if (o.stream) {
    run_windows_streamed(in, o, c, pick, checkpoint, quiet, kill_after);
    return;
  }
  CalibObserver obs(c.moments, c.reservoir, in.shape);
  Progress prog("calib-capture", n_win, "tok", quiet);
  int64_t tokens_done = 0;
  int64_t last_ckpt = c.windows_done;
  while (c.windows_done < n_win) {
    const int64_t w0 = c.windows_done;
    const int64_t n = std::min<int64_t>(o.batch_size - (w0 % o.batch_size), n_win - w0);
    at::Tensor ids = window_tensor(in, c.calib_offsets, size_t(w0), size_t(n));
    obs.picks.clear();
    pick(w0, n, obs.picks);
    Model::ForwardOptions fo;
    fo.observer = &obs;
    fo.logits = false;
    in.model.forward(ids, fo);
    c.windows_done += n;
    tokens_done += n * T;
    prog.update(c.windows_done, tokens_done);
    if (o.checkpoint_every > 0 && c.windows_done < n_win && c.windows_done - last_ckpt >= o.checkpoint_every) {
      checkpoint();
      last_ckpt = c.windows_done;
      spdlog::debug("checkpoint at window {}", c.windows_done);
    }
    if (kill_after >= 0 && c.windows_done >= kill_after) std::raise(SIGKILL);
  }
  prog.finish();
}

int64_t test_kill_after(int rank) {
  const char* k = std::getenv("KVQ_TEST_KILL_AFTER_WINDOWS");
  const char* r = std::getenv("KVQ_TEST_KILL_RANK");
  if (!k || (r && std::atoi(r) != rank)) return -1;
  return std::atoll(k);
}

}  // namespace capture_detail

CalibFile run_capture(const CaptureOptions& o, Ranks* ranks) {
  using namespace capture_detail;
  if (ranks && ranks->active()) return run_sharded(o, *ranks);

  std::unique_ptr<Inputs> in = prepare(o);
  const MomentShape& shape = in->shape;
  const std::vector<int64_t>& offsets = in->offsets;
  const CalibProvenance& prov = in->prov;
  const size_t d = size_t(shape.head_dim), L = size_t(shape.n_layers);
  const size_t nq = size_t(shape.n_heads) * d, nkv = size_t(shape.n_kv_heads) * d;
  const size_t nv = size_t(shape.n_kv_heads) * size_t(shape.v_dim());

  // A streamed capture keeps the file's payload (reservoir, held-out windows) in unlinked files
  // in --tmp-dir (default: beside --out), about one layer of it resident (see MemoryPlan).
  std::optional<payload::FileBacked> file_payload;
  if (in->model.streamed()) {
    file_payload.emplace(temp_dir(o));
  }
  CalibFile c;
  if (o.resume && std::filesystem::exists(o.out)) {
    c = read_calib(o.out, true);
    check_resumable(o.out, c, prov, offsets);
    c.prov.created_unix = prov.created_unix;
    spdlog::info("resuming {} at window {}/{}", o.out, c.windows_done, offsets.size());
  } else {
    if (!o.resume && std::filesystem::exists(o.out))
      spdlog::warn("{} exists and will be replaced (use --resume to continue it)", o.out);
    c.prov = prov;
    c.moments = Moments(shape);
    track_amax_with(c.moments, c.prov);
    c.calib_offsets = offsets;
    c.holdout_offsets = in->plan.holdout;
    c.reservoir.capacity = o.reservoir_tokens;
    Rng seed_rng(o.seed ^ kReservoirStream);
    seed_rng.get_state(c.reservoir.rng_state.data());
    capture_holdout(*in, o.batch_size, c);  // held-out windows first
  }
  // The reservoir payload is held at the rows it can ever fill (capacity, or every calibration
  // token when there are fewer) and trimmed to the filled rows when written.
  Reservoir& rv = c.reservoir;
  int64_t filled = rv.size();
  const int64_t rows_max = std::min<int64_t>(rv.capacity, int64_t(c.calib_offsets.size()) * o.seq_len);
  payload::grow_zeroed(rv.q, size_t(rows_max) * L * nq);
  payload::grow_zeroed(rv.k, size_t(rows_max) * L * nkv);
  payload::grow_zeroed(rv.v, size_t(rows_max) * L * nv);
  rv.source.resize(size_t(rows_max) * 2, 0);
  Rng rrng(0);
  rrng.set_state(rv.rng_state.data());

  // Written trimmed to the filled reservoir rows, in place rather than from a copy (the payload
  // may be gigabytes): the file holds rv.size() = source rows, so only `source` is trimmed (slots
  // fill in order; its rows past `filled` are still zero, and growing it back restores them).
  // q, k, v keep their rows_max rows, of which the write reads the first rv.size().
  auto snapshot = [&](const std::string& path) {
    auto trim = [&](int64_t rows) { rv.source.resize(size_t(rows) * 2, 0); };
    trim(filled);
    rrng.get_state(rv.rng_state.data());
    try {
      write_calib(path, c);
    } catch (...) {
      trim(rows_max);
      throw;
    }
    trim(rows_max);
    set_interrupt_note(resume_note(path, c.windows_done, int64_t(offsets.size())));
  };
  if (o.resume && c.windows_done > 0)
    set_interrupt_note(resume_note(o.out, c.windows_done, int64_t(offsets.size())));
  else
    set_interrupt_note(o.checkpoint_every > 0
                           ? "no checkpoint yet, nothing written (one is written every " +
                                 std::to_string(o.checkpoint_every) + " windows)"
                           : "nothing written (--checkpoint-every K makes a long run resumable)");

  const int T = o.seq_len;
  auto pick = [&](int64_t w0, int64_t n, Picks& picks) {
    for (int64_t r = 0; r < n * T; ++r) {  // Algorithm R, tokens in window order
      const int64_t seen = ++rv.seen;
      int64_t slot = -1;
      if (filled < rv.capacity) slot = filled++;
      else if (rv.capacity > 0) {
        uint64_t j = rrng.below(uint64_t(seen));
        if (j < uint64_t(rv.capacity)) slot = int64_t(j);
      }
      if (slot < 0) continue;
      picks.emplace_back(slot, r);
      rv.source[size_t(slot) * 2] = w0 + r / T;  // index into this file's calib_offsets
      rv.source[size_t(slot) * 2 + 1] = r % T;
    }
  };
  run_windows(*in, o, c, pick, [&] { snapshot(o.out); }, o.quiet, test_kill_after(0));
  snapshot(o.out);
  spdlog::info("wrote {} ({} calibration windows, {} held out, {} reservoir tokens)", o.out, offsets.size(),
               c.holdout.windows, filled);
  return read_calib(o.out, false);
}

}  // namespace kvq
