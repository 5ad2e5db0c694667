#pragma once
// A last line of defence around third-party parsers that can fault on corrupt input (libhdf5
// reads an attribute message's lengths from the file and has been seen to memcpy past its buffer
// on a fuzzed calibration file). While a FaultGuard is alive, SIGSEGV / SIGBUS / SIGFPE end the
// process the way every other bad input does: one line naming the file on stderr, the registered
// temporaries of write_atomically removed, exit status 2 — not a death by signal. Outside a guard,
// or where another handler is installed (ASan, libFuzzer), nothing changes, so fuzzers still see
// these faults as crashes. The handler uses only async-signal-safe calls and never returns into
// the faulting code.
#include <string>

namespace kvq {

class FaultGuard {
 public:
  explicit FaultGuard(const std::string& file);  // `file`: what is being read (named in the message)
  ~FaultGuard();
  FaultGuard(const FaultGuard&) = delete;
  FaultGuard& operator=(const FaultGuard&) = delete;

 private:
  bool active_ = false;
  char previous_[4096];
};

}  // namespace kvq
