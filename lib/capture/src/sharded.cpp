// calib-capture sharded over the ranks of an mpirun job: a deterministic window assignment, an
// input check at the start, per-rank checkpoints, and a reduction in rank order on rank 0, which
// writes the one file. MPI itself stays behind Ranks (mpi_shard.cpp). Layout and rules:
// schemas/calibration-file.md, "Sharded capture".
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <sstream>

#include "capture_detail.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/util/rng.hpp"
#include "kvq/util/error.hpp"

namespace kvq::capture_detail {
namespace {

// Rank r's calibration windows [begin, end): whole batches ⌊r·nb/N⌋ .. ⌊(r+1)·nb/N⌋ of the run's nb
// batches of --batch windows, so each batch is exactly the one a single process forwards.
std::pair<int64_t, int64_t> shard_of(int64_t n_win, int batch, int n_ranks, int rank) {
  const int64_t nb = (n_win + batch - 1) / batch;
  auto edge = [&](int r) { return std::min(n_win, int64_t(r) * nb / n_ranks * batch); };
  return {edge(rank), edge(rank + 1)};
}

// The single-process reservoir draw (Algorithm R over the run's tokens in window order) replayed
// without activations: its choices depend only on the token count and the seeded generator, so
// every rank knows which token each slot finally keeps and captures only the rows of its own.
struct ReservoirPlan {
  std::vector<int64_t> owner;  // per filled slot: the token (window * T + position) it keeps
  std::array<uint64_t, 4> rng_start{}, rng_end{};
};

ReservoirPlan plan_reservoir(uint64_t seed, int64_t capacity, int64_t n_tokens) {
  ReservoirPlan p;
  Rng rng(seed ^ kReservoirStream);
  rng.get_state(p.rng_start.data());
  for (int64_t i = 0; i < n_tokens; ++i) {
    if (int64_t(p.owner.size()) < capacity) {
      p.owner.push_back(i);
    } else if (capacity > 0) {
      uint64_t j = rng.below(uint64_t(i + 1));
      if (j < uint64_t(capacity)) p.owner[size_t(j)] = i;
    }
  }
  rng.get_state(p.rng_end.data());
  return p;
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\t', ' ');
  return s;
}

// What must be the same on every rank, one "field<TAB>value<TAB>note" line each (the note, e.g. a
// path, is shown but not compared).
std::string fingerprint(const CaptureOptions& o, const CalibProvenance& p) {
  std::ostringstream s;
  auto line = [&](const std::string& field, const std::string& value, const std::string& note = "") {
    s << field << '\t' << value << '\t' << one_line(note) << '\n';
  };
  line("tool_version", p.tool_version);
  line("provenance.model_config_sha256", p.model_config_sha256, o.model);
  line("provenance.tokenizer_sha256", p.tokenizer_sha256, p.tokenizer_path);
  line("provenance.special_tokens_mode", p.special_tokens_mode);
  line("provenance.forward_precision", p.forward_precision);
  line("provenance.corpus", std::to_string(p.corpus.size()) + " files");
  for (size_t i = 0; i < p.corpus.size(); ++i)
    line("provenance.corpus[" + std::to_string(i) + "].sha256", p.corpus[i].sha256, p.corpus[i].path);
  line("provenance.n_tokens_corpus", std::to_string(p.n_tokens_corpus));
  line("--seed", std::to_string(p.seed));
  line("--samples", std::to_string(o.samples));
  line("--windows", std::to_string(o.window_begin) + ":" + std::to_string(o.window_end));
  line("--holdout", std::to_string(o.holdout));
  line("--seq-len", std::to_string(o.seq_len));
  line("--batch", std::to_string(o.batch_size));
  line("--reservoir-tokens", std::to_string(o.reservoir_tokens));
  return s.str();
}

std::vector<std::array<std::string, 3>> parse_fingerprint(const std::string& fp) {
  std::vector<std::array<std::string, 3>> rows;
  std::istringstream s(fp);
  std::string ln;
  while (std::getline(s, ln)) {
    std::array<std::string, 3> r;
    size_t a = ln.find('\t'), b = a == std::string::npos ? a : ln.find('\t', a + 1);
    r[0] = ln.substr(0, a);
    if (a != std::string::npos) r[1] = ln.substr(a + 1, b == std::string::npos ? b : b - a - 1);
    if (b != std::string::npos) r[2] = ln.substr(b + 1);
    rows.push_back(r);
  }
  return rows;
}

// Rank 0's verdict on every rank's fingerprint: empty when all agree, else the first failing or
// differing rank and field.
std::string compare_fingerprints(const std::vector<std::string>& fps) {
  for (size_t r = 0; r < fps.size(); ++r)
    if (fps[r].rfind("error\t", 0) == 0) return "rank " + std::to_string(r) + ": " + fps[r].substr(6);
  const auto root = parse_fingerprint(fps[0]);
  for (size_t r = 1; r < fps.size(); ++r) {
    const auto mine = parse_fingerprint(fps[r]);
    for (size_t i = 0; i < std::max(root.size(), mine.size()); ++i) {
      const std::array<std::string, 3> none{"(none)", "(none)", ""};
      const auto& x = i < root.size() ? root[i] : none;
      const auto& y = i < mine.size() ? mine[i] : none;
      if (x[0] == y[0] && x[1] == y[1]) continue;
      auto shown = [](const std::array<std::string, 3>& v) { return "'" + v[1] + "'" + (v[2].empty() ? "" : " (" + v[2] + ")"); };
      const std::string what = x[0] == y[0] ? y[0] + ": " + shown(y) + " differs from rank 0's " + shown(x)
                                            : y[0] + " " + shown(y) + " where rank 0 has " + x[0] + " " + shown(x);
      return "rank " + std::to_string(r) + ": " + what + "; every rank needs the same model, tokenizer, corpus and options";
    }
  }
  return "";
}

// Every rank sends its fingerprint (or its setup error) to rank 0, which decides for all: a
// mismatch or failure stops every rank before any forward, reported once by rank 0.
void agree(Ranks& ranks, const std::string& fp) {
  std::vector<std::string> all = ranks.gather(fp);
  std::string verdict = ranks.rank() == 0 ? compare_fingerprints(all) : std::string();
  verdict = ranks.broadcast(verdict);
  if (verdict.empty()) return;
  ranks.set_agreed_failure();
  if (ranks.rank() == 0) throw Error(verdict);
  throw ReportedByRankZero(verdict);
}

void send_moments(const Ranks& ranks, const Moments& m) {
  for (const SideMoments* s : {&m.k, &m.v, &m.q}) {
    ranks.send(0, s->count.data(), s->count.size() * sizeof(int64_t));
    ranks.send(0, s->sum.data(), s->sum.size() * sizeof(double));
    ranks.send(0, s->gram.data(), s->gram.size() * sizeof(double));
  }
  for (const std::vector<float>* a : {&m.k_amax, &m.v_amax, &m.q_amax}) ranks.send(0, a->data(), a->size() * sizeof(float));
}

void recv_moments(const Ranks& ranks, int from, Moments& m) {
  for (SideMoments* s : {&m.k, &m.v, &m.q}) {
    ranks.recv(from, s->count.data(), s->count.size() * sizeof(int64_t));
    ranks.recv(from, s->sum.data(), s->sum.size() * sizeof(double));
    ranks.recv(from, s->gram.data(), s->gram.size() * sizeof(double));
  }
  for (std::vector<float>* a : {&m.k_amax, &m.v_amax, &m.q_amax}) ranks.recv(from, a->data(), a->size() * sizeof(float));
}

// Slots of `plan` whose kept token lies in windows [begin, end), ascending.
std::vector<size_t> slots_of(const ReservoirPlan& plan, int64_t begin, int64_t end, int T) {
  std::vector<size_t> s;
  for (size_t i = 0; i < plan.owner.size(); ++i)
    if (plan.owner[i] >= begin * T && plan.owner[i] < end * T) s.push_back(i);
  return s;
}

}  // namespace

CalibFile run_sharded(const CaptureOptions& o, Ranks& ranks) {
  // mpirun stops a job (a rank died, MPI_Abort, Ctrl-C) with SIGTERM before SIGKILL: a rank that is
  // writing then removes its temporary (write_atomically's signal handler, lib/util).
  const int R = ranks.rank(), N = ranks.size();
  const std::string partial = o.out + ".rank" + std::to_string(R) + ".partial";
  std::unique_ptr<Inputs> in;
  CalibFile c;  // this rank's share of the run, checkpointed to `partial`
  ReservoirPlan rplan;
  std::vector<size_t> owned;     // reservoir slots this rank fills (c.reservoir row i = slot owned[i])
  int64_t first = 0, n_all = 0;  // this rank's first window; the run's windows
  bool resumed = false;
  std::string fp;
  try {  // every failure up to the first forward is reported by rank 0, naming the rank
    in = prepare(o);
    in->prov.n_ranks = N;
    const int T = o.seq_len;
    n_all = int64_t(in->offsets.size());
    const auto [begin, end] = shard_of(n_all, o.batch_size, N, R);
    first = begin;
    rplan = plan_reservoir(o.seed, o.reservoir_tokens, n_all * T);
    owned = slots_of(rplan, begin, end, T);
    std::vector<int64_t> offsets(in->offsets.begin() + begin, in->offsets.begin() + end);
    std::vector<int64_t> source;  // (window of this share, position) of each owned slot
    for (size_t s : owned) {
      source.push_back(rplan.owner[s] / T - begin);
      source.push_back(rplan.owner[s] % T);
    }
    CalibProvenance prov = in->prov;
    prov.samples = int(offsets.size());
    if (o.resume && std::filesystem::exists(partial)) {
      c = read_calib(partial, true);
      check_resumable(partial, c, prov, offsets);
      if (c.reservoir.source != source)
        throw Error(partial, h5path::kReservoirSource, "cannot resume: the reservoir plan differs");
      c.prov.created_unix = prov.created_unix;
      resumed = true;
      spdlog::info("rank {}: resuming {} at window {}/{}", R, partial, c.windows_done, offsets.size());
    } else {
      if (R == 0 && std::filesystem::exists(o.out))
        spdlog::warn("{} exists and will be replaced", o.out);
      const size_t L = size_t(in->shape.n_layers), d = size_t(in->shape.head_dim);
      const size_t nq = size_t(in->shape.n_heads) * d, nkv = size_t(in->shape.n_kv_heads) * d;
      const size_t nv = size_t(in->shape.n_kv_heads) * size_t(in->shape.v_dim());
      c.prov = prov;
      c.moments = Moments(in->shape);
      track_amax_with(c.moments, c.prov);
      c.calib_offsets = offsets;
      c.reservoir.capacity = o.reservoir_tokens;
      c.reservoir.rng_state = rplan.rng_start;
      c.reservoir.source = source;
      c.reservoir.q.assign(owned.size() * L * nq, 0.f);
      c.reservoir.k.assign(owned.size() * L * nkv, 0.f);
      c.reservoir.v.assign(owned.size() * L * nv, 0.f);
    }
    fp = fingerprint(o, in->prov);
  } catch (const std::exception& e) {
    fp = "error\t" + one_line(e.what());
  }
  agree(ranks, fp);

  try {
    const int T = o.seq_len;
    if (R == 0 && !resumed) {  // rank 0 captures the held-out windows, as a single process would
      c.holdout_offsets = in->plan.holdout;
      capture_holdout(*in, o.batch_size, c);
    }
    auto pick = [&](int64_t w0, int64_t n, Picks& picks) {
      const int64_t t0 = (first + w0) * T, t1 = (first + w0 + n) * T;
      for (size_t i = 0; i < owned.size(); ++i) {
        const int64_t tok = rplan.owner[owned[i]];
        if (tok >= t0 && tok < t1) picks.emplace_back(int64_t(i), tok - t0);
      }
      c.reservoir.seen += n * T;
    };
    const int64_t done_before = c.windows_done;
    run_windows(*in, o, c, pick, [&] { write_calib(partial, c); }, o.quiet || R != 0, test_kill_after(R));
    if (o.checkpoint_every > 0 && c.windows_done > done_before) write_calib(partial, c);  // a finished share

    // Rank 0 adds the shares in rank order (not MPI_Reduce: its order is the library's), so the
    // sums do not depend on timing, and places each rank's reservoir rows in their slots.
    const MomentShape& sh = in->shape;
    const size_t L = size_t(sh.n_layers), d = size_t(sh.head_dim);
    const size_t nq = L * size_t(sh.n_heads) * d, nkv = L * size_t(sh.n_kv_heads) * d;
    const size_t nv = L * size_t(sh.n_kv_heads) * size_t(sh.v_dim());
    CalibFile f;
    if (R != 0) {
      send_moments(ranks, c.moments);
      ranks.send(0, c.reservoir.q.data(), c.reservoir.q.size() * sizeof(float));
      ranks.send(0, c.reservoir.k.data(), c.reservoir.k.size() * sizeof(float));
      ranks.send(0, c.reservoir.v.data(), c.reservoir.v.size() * sizeof(float));
    } else {
      f.prov = in->prov;
      f.moments = std::move(c.moments);
      f.calib_offsets = in->offsets;
      f.holdout_offsets = std::move(c.holdout_offsets);
      f.holdout = std::move(c.holdout);
      f.windows_done = n_all;
      Reservoir& rv = f.reservoir;
      rv.capacity = o.reservoir_tokens;
      rv.seen = n_all * T;
      rv.rng_state = rplan.rng_end;
      for (int64_t tok : rplan.owner) {
        rv.source.push_back(tok / T);
        rv.source.push_back(tok % T);
      }
      rv.q.assign(rplan.owner.size() * nq, 0.f);
      rv.k.assign(rplan.owner.size() * nkv, 0.f);
      rv.v.assign(rplan.owner.size() * nv, 0.f);
      auto place = [&](const std::vector<size_t>& slots, const Reservoir& part) {
        for (size_t i = 0; i < slots.size(); ++i) {
          std::copy_n(part.q.data() + i * nq, nq, rv.q.data() + slots[i] * nq);
          std::copy_n(part.k.data() + i * nkv, nkv, rv.k.data() + slots[i] * nkv);
          std::copy_n(part.v.data() + i * nv, nv, rv.v.data() + slots[i] * nv);
        }
      };
      place(owned, c.reservoir);
      Moments m(sh);
      track_amax_with(m, f.prov);  // sized like the ranks' maxima, filled by recv_moments
      for (int r = 0; r < N; ++r) {
        const auto [begin, end] = shard_of(n_all, o.batch_size, N, r);
        f.window_rank.insert(f.window_rank.end(), size_t(end - begin), r);
        if (r == 0) continue;
        recv_moments(ranks, r, m);
        f.moments.add(m);
        const std::vector<size_t> slots = slots_of(rplan, begin, end, T);
        Reservoir part;
        part.q.resize(slots.size() * nq);
        part.k.resize(slots.size() * nkv);
        part.v.resize(slots.size() * nv);
        ranks.recv(r, part.q.data(), part.q.size() * sizeof(float));
        ranks.recv(r, part.k.data(), part.k.size() * sizeof(float));
        ranks.recv(r, part.v.data(), part.v.size() * sizeof(float));
        place(slots, part);
      }
      write_calib(o.out, f);
      spdlog::info("wrote {} ({} calibration windows on {} ranks, {} held out, {} reservoir tokens)", o.out, n_all,
                   N, f.holdout.windows, rv.size());
    }
    ranks.barrier();  // the file is in place: the checkpoints are spent
    std::error_code ec;
    std::filesystem::remove(partial, ec);
    return R == 0 ? read_calib(o.out, false) : CalibFile{};
  } catch (const Error& e) {
    throw Error("rank " + std::to_string(R) + ": " + e.what());
  }
}

}  // namespace kvq::capture_detail
