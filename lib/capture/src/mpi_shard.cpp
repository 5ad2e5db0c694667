// Ranks over MPI_COMM_WORLD (KVQ_HAVE_MPI), or the single process without MPI.
#include <cstdio>
#include <cstdlib>

#include "kvq/capture/ranks.hpp"

#ifdef KVQ_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <climits>
#endif

namespace kvq {

#ifdef KVQ_HAVE_MPI

namespace {
constexpr int kTag = 17;
constexpr size_t kChunk = size_t(1) << 30;  // MPI counts are int: large payloads go in pieces

bool started_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}
}  // namespace

bool mpi_built() { return true; }

Ranks::Ranks(int* argc, char*** argv) {
  if (!started_by_mpirun()) return;
  MPI_Init(argc, argv);  // errors are fatal (MPI_ERRORS_ARE_FATAL): the job stops
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  active_ = true;
}

Ranks::~Ranks() {
  if (active_ && !finalized_) MPI_Finalize();
}

std::vector<std::string> Ranks::gather(const std::string& mine) const {
  if (!active_) return {mine};
  KVQ_ASSERT(mine.size() < size_t(INT_MAX));
  int len = int(mine.size());
  std::vector<int> lens(rank_ == 0 ? size_t(size_) : 0), displs(lens.size());
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank_ == 0) {
    size_t total = 0;
    for (size_t i = 0; i < lens.size(); ++i) {
      displs[i] = int(total);
      total += size_t(lens[i]);
    }
    KVQ_ASSERT(total < size_t(INT_MAX));
    all.resize(total);
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (size_t i = 0; i < lens.size(); ++i) out.push_back(all.substr(size_t(displs[i]), size_t(lens[i])));
  return out;
}

std::string Ranks::broadcast(const std::string& from_root) const {
  if (!active_) return from_root;
  KVQ_ASSERT(from_root.size() < size_t(INT_MAX));
  int len = int(from_root.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string s = rank_ == 0 ? from_root : std::string(size_t(len), '\0');
  MPI_Bcast(s.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  return s;
}

void Ranks::send(int to, const void* data, size_t bytes) const {
  KVQ_ASSERT(active_);
  const char* p = static_cast<const char*>(data);
  for (size_t off = 0; off < bytes; off += kChunk)
    MPI_Send(p + off, int(std::min(kChunk, bytes - off)), MPI_BYTE, to, kTag, MPI_COMM_WORLD);
}

void Ranks::recv(int from, void* data, size_t bytes) const {
  KVQ_ASSERT(active_);
  char* p = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += kChunk) {
    const int n = int(std::min(kChunk, bytes - off));
    MPI_Status st;
    MPI_Recv(p + off, n, MPI_BYTE, from, kTag, MPI_COMM_WORLD, &st);
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    KVQ_ASSERT(got == n);
  }
}

void Ranks::barrier() const {
  if (active_) MPI_Barrier(MPI_COMM_WORLD);
}

int Ranks::finish(int rc) {
  if (!active_ || finalized_) return rc;
  if (rc != 0 && !agreed_failure_) {
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, rc);  // the other ranks may be blocked on this one
  }
  MPI_Finalize();
  finalized_ = true;
  return rc;
}

#else  // built without MPI: always the single process

bool mpi_built() { return false; }
Ranks::Ranks(int*, char***) {}
Ranks::~Ranks() = default;
std::vector<std::string> Ranks::gather(const std::string& mine) const { return {mine}; }
std::string Ranks::broadcast(const std::string& from_root) const { return from_root; }
void Ranks::send(int, const void*, size_t) const { KVQ_ASSERT(!"send without MPI"); }
void Ranks::recv(int, void*, size_t) const { KVQ_ASSERT(!"recv without MPI"); }
void Ranks::barrier() const {}
int Ranks::finish(int rc) { return rc; }

#endif

}  // namespace kvq
