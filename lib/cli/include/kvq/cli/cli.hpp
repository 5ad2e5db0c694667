#pragma once
// One option vocabulary for every kvq tool, defined once. Each add_* registers the flag with the
// same name, help text and validation everywhere.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvq::cli {

struct Common {
  int verbose = 0;
  bool quiet = false;
  int threads = 0;  // 0 = all cores
};

// -v/--verbose, -q/--quiet, --threads; also makes a repeated scalar flag take its last value and
// parse errors print one line. Call it first, before adding other options.
void add_common(CLI::App& app, Common& c);
void add_model(CLI::App& app, std::string& model, bool required = true);
void add_corpus(CLI::App& app, std::vector<std::string>& corpus);
void add_calib(CLI::App& app, std::string& calib);
void add_alloc(CLI::App& app, std::string& alloc);
void add_bpd(CLI::App& app, double& bpd, const std::string& name = "--bpd",
             const std::string& what = "bits per dimension (budget)");
void add_out(CLI::App& app, std::string& out, const std::string& what);
void add_seed(CLI::App& app, uint64_t& seed);
// --match nominal|effective: how a baseline's budget is chosen against the allocation's
// (kvq-verify, kvq-eval; the library checks it again: alloc::check_match).
void add_match(CLI::App& app, std::string& match);
// --precision auto|bf16|fp32 for the tools that run the forward (calib-capture, kvq-eval,
// kvq-generate, kvq-probe). `precision` stays empty when not given: the tool then takes
// kvq::default_precision() ($KVQ_PRECISION, else auto).
void add_precision(CLI::App& app, std::string& precision);

// Applies -v/-q to spdlog (warnings and errors always reach stderr unless -q).
void apply_common(const Common& c);

// Runs `body` and maps errors to exit codes: any exception -> one line "tool: error: ..." and 2
// (1 is the body's "checked and failed"). CLI11 parse errors are handled by the caller's
// CLI11_PARSE. Installs the interrupt handlers first (SIGINT/SIGTERM: one line, exit 130/143).
// After an error the process ends at once (_exit, stdio flushed) unless `exit_on_error` is false:
// a library that failed mid-write (HDF5 on a full disk) can crash in its exit-time cleanup, and an
// error exit must never become a signal. calib-capture passes false (MPI ranks finish first) and
// ends with leave().
int run_main(const std::string& tool, const std::function<int()>& body, bool exit_on_error = true);
// Returns rc, or after an error (rc == 2) ends the process at once as run_main does.
int leave(int rc);

// Parses argv. --help/--version print and give 0; a usage error prints one line naming the tool and
// gives 2 (the bad-input code of every kvq tool; CLI11's own codes are 100+). Returns -1 to go on.
int parse(CLI::App& app, int argc, char** argv);

}  // namespace kvq::cli

// Use in main(): parses, or returns the exit code of --help / a usage error.
#define KVQ_CLI_PARSE(app, argc, argv)                               \
  do {                                                               \
    const int kvq_parse_rc_ = ::kvq::cli::parse((app), (argc), (argv)); \
    if (kvq_parse_rc_ >= 0) return kvq_parse_rc_;                    \
  } while (0)

namespace kvq::cli {

}  // namespace kvq::cli
