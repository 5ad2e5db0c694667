#pragma once
#include <functional>
#include <string>

namespace kvq {

// Writes `path` atomically: the writer fills `<path>.tmp.<pid>`, which is fsync'ed and renamed over
// `path`. If the writer throws, the temporary is removed and nothing appears at `path`; if SIGINT,
// SIGTERM or SIGHUP ends the process while it is written (and no other handler is installed for
// that signal), the interrupt handler (install_interrupt_handlers) removes it. Temporaries of the
// same path left by writers that no longer run (SIGKILL) are removed first.
void write_atomically(const std::string& path, const std::function<void(const std::string& tmp_path)>& writer);

// SIGINT / SIGTERM / SIGHUP (those not ignored and without another handler): remove the
// temporaries being written, print "<tool>: interrupted by SIGTERM; <note>" on stderr and exit
// 128 + the signal (130 / 143 / 129), never a death by the signal. Every tool installs them at
// start (kvq::cli::run_main); write_atomically installs them too.
void install_interrupt_handlers();
// What the interrupt line says after the signal's name (default "stopped, no partial output
// left"), e.g. how to resume. Thread-safe; the handler reads the last one set.
void set_interrupt_note(const std::string& note);

// A tool's outputs as one: while a batch is alive, write_atomically keeps each finished (fsync'ed)
// temporary instead of renaming it, and a new output directory (make_output_dir) is built as the
// hidden sibling `.<name>.kvq-tmp.<pid>`; commit() checks every piece is still there, then renames
// them all (signals held meanwhile). A batch destroyed without commit — an error, an exception, a
// failed commit — removes its temporaries, its hidden directories and the parents it created, and
// a signal's handler removes them too, so a tool that writes several files (kvq-allocate --out +
// --manifest, kvq-inspect --json/--csv/--plots, kvq-export) leaves every earlier output as it was
// and no partial set, even when its output directory is removed (or re-made) mid-run. One at a
// time per process.
class OutputBatch {
 public:
  OutputBatch();
  ~OutputBatch();
  OutputBatch(const OutputBatch&) = delete;
  OutputBatch& operator=(const OutputBatch&) = delete;
  void commit();
};
// The directory `dir` that outputs are written into (kvq::Error naming `field` when it cannot be
// made or is a file). Without a batch: create_directories. In a batch: an existing directory is
// used as it is (its files are renamed in at commit); a new one is built as a hidden sibling that
// write_atomically(dir/...) writes into and commit renames to `dir`; missing parents are created
// and removed again (when empty) if the batch does not commit.
void make_output_dir(const std::string& dir, const std::string& field);
// create_directories(dir), recorded in the open batch like make_output_dir's parents (for a tool
// that builds `dir/<name>` itself: kvq-export --model).
void make_parent_dirs(const std::string& dir, const std::string& field);
// Hidden siblings `.<name>.kvq-tmp.<pid>` of `target` whose process no longer runs (a SIGKILL)
// are removed with everything in them.
void remove_dead_build_dirs(const std::string& target);

// Convenience for small text/binary payloads.
void write_file_atomically(const std::string& path, const std::string& bytes);

std::string read_file(const std::string& path);  // throws kvq::Error naming the file

}  // namespace kvq
