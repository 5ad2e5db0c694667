#pragma once
// The processes one calib-capture runs on. Under `mpirun -n N` (in a build with KVQ_MPI) these are
// the N ranks of MPI_COMM_WORLD; otherwise MPI is never initialised and the tool is the plain
// single-process run. <mpi.h> stays in src/mpi_shard.cpp; nothing else in kvq sees it.
#include <cstddef>
#include <string>
#include <vector>

#include "kvq/util/error.hpp"

namespace kvq {

// True when this build has MPI (CMake option KVQ_MPI).
bool mpi_built();

class Ranks {
 public:
  // Initialises MPI only when mpirun started this process (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
  // PMIX_RANK set); otherwise one rank, no MPI.
  Ranks(int* argc, char*** argv);
  ~Ranks();  // MPI_Finalize when finish() did not run
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

  bool active() const { return active_; }  // started by mpirun
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Rank 0 gets every rank's string in rank order; the other ranks get {}.
  std::vector<std::string> gather(const std::string& mine) const;
  // Every rank gets rank 0's string.
  std::string broadcast(const std::string& from_root) const;
  // Blocking point to point; the receiver knows how many bytes come (a mismatch aborts).
  void send(int to, const void* data, size_t bytes) const;
  void recv(int from, void* data, size_t bytes) const;
  void barrier() const;

  // Every rank has met the same error and rank 0 has reported it: all ranks may exit normally.
  void set_agreed_failure() { agreed_failure_ = true; }
  // The tool's exit: MPI_Finalize after success or an agreed error; any other error ends the whole
  // job with MPI_Abort, so no rank waits forever for a rank that gave up. Returns rc.
  int finish(int rc);

 private:
  bool active_ = false, finalized_ = false, agreed_failure_ = false;
  int rank_ = 0, size_ = 1;
};

// Thrown on ranks other than 0 for an error rank 0 reports for every rank; the tool exits non-zero
// without printing it again.
class ReportedByRankZero : public Error {
 public:
  using Error::Error;
};

}  // namespace kvq
