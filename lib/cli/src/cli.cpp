#include "kvq/cli/cli.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>

#include "kvq/util/atomic_file.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <cstdio>

#include "kvq/util/error.hpp"

namespace kvq::cli {

void add_common(CLI::App& app, Common& c) {
  // Parse errors are one line too, like every other kvq error.
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return a->get_name() + ": error: " + e.what() + " (see --help)\n";
  });
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("-v,--verbose", c.verbose, "more log output (-vv for debug)");
  app.add_flag("-q,--quiet", c.quiet, "only errors; no progress line");
  app.add_option("--threads", c.threads, "CPU threads for the forward (0 = all cores)")
      ->default_val(0)
      ->check(CLI::Range(0, 4096));
}

void add_model(CLI::App& app, std::string& model, bool required) {
  auto* o = app.add_option("--model", model,
                           "model: HF directory (config.json + safetensors) or llama2.c .bin checkpoint");
  if (required) o->required();
}

void add_corpus(CLI::App& app, std::vector<std::string>& corpus) {
  app.add_option("--corpus", corpus, "UTF-8 text files or folders (repeatable)")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void add_calib(CLI::App& app, std::string& calib) {
  app.add_option("--calib", calib, "calibration file (.kvqcal.h5) written by calib-capture")->required();
}

void add_alloc(CLI::App& app, std::string& alloc) {
  app.add_option("--alloc", alloc, "allocation file (.kvqalloc.h5) written by kvq-allocate")->required();
}

void add_bpd(CLI::App& app, double& bpd, const std::string& name, const std::string& what) {
  app.add_option(name, bpd, what)->check(CLI::PositiveNumber);
}

void add_out(CLI::App& app, std::string& out, const std::string& what) {
  app.add_option("-o,--out", out, what)->required();
}

void add_seed(CLI::App& app, uint64_t& seed) {
  app.add_option("--seed", seed, "seed for every random choice (recorded in the output)")->default_val(0);
}

void add_match(CLI::App& app, std::string& match) {
  app.add_option("--match", match,
                 "baseline budget: nominal (the allocation's nominal bits) or effective (per side the whole bits with "
                 "the smallest effective bpd, side information included, >= the allocation's; the most such bits)")
      ->default_val(match)
      ->check(CLI::IsMember({"nominal", "effective"}));
}

void add_precision(CLI::App& app, std::string& precision) {
  app.add_option("--precision", precision,
                 "the forward's arithmetic: bf16 (GEMM weights kept in BF16, projections by BF16 GEMMs with fp32 "
                 "accumulation; norms, RoPE, attention, softmax, router and statistics fp32), fp32 (every weight and "
                 "GEMM fp32: the reference mode), or auto (bf16 when this CPU has AVX512-BF16 or AMX, else fp32). "
                 "Default: $KVQ_PRECISION if set, else auto")
      ->check(CLI::IsMember({"auto", "bf16", "fp32"}));
}

void apply_common(const Common& c) {
  auto logger = spdlog::stderr_color_mt("kvq");
  logger->set_pattern("[%^%l%$] %v");
  spdlog::set_default_logger(logger);
  if (c.quiet) spdlog::set_level(spdlog::level::err);
  else if (c.verbose >= 2) spdlog::set_level(spdlog::level::debug);
  else if (c.verbose == 1) spdlog::set_level(spdlog::level::info);
  else spdlog::set_level(spdlog::level::info);
}

int leave(int rc) {
  if (rc != 2) return rc;
  std::fflush(nullptr);
  ::_exit(rc);
}

// What the tool printed on stdout must have reached it: a full disk or a reader that went away
// (`kvq-inspect A | head -1`) is an error of one line, exit 2, like every other fault of the
// environment -- never a silent exit 0, never death by SIGPIPE (ignored in run_main).
int check_stdout(const std::string& tool, int rc) {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return rc;
  const int err = errno;
  std::fprintf(stderr, "%s: error: stdout: %s\n", tool.c_str(), err ? std::strerror(err) : "write error");
  return 2;
}

int run_main(const std::string& tool, const std::function<int()>& body, bool exit_on_error) {
  kvq::install_interrupt_handlers();  // Ctrl-C / kill: temporaries removed, one line, exit 130 / 143
  std::signal(SIGPIPE, SIG_IGN);      // a closed stdout is an error (check_stdout), not a signal
  int rc = 0;
  try {
    const int ok = check_stdout(tool, body());
    return exit_on_error && ok == 2 ? leave(ok) : ok;
  } catch (const kvq::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), e.what());
    rc = 2;
  } catch (const std::exception& e) {
    // Exit 2 like every other error (1 is kept for "checked and failed", e.g. a kvq-verify gate).
    std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), e.what());
    rc = 2;
  } catch (...) {
    // A library type outside std::exception (HDF5's C++ API throws H5::Exception): never a
    // terminate()/abort. Readers translate these to kvq::Error; reaching here is a missing guard.
    std::fprintf(stderr, "%s: error: unexpected non-standard exception (a reader missed a guard; please report)\n",
                 tool.c_str());
    rc = 2;
  }
  return exit_on_error ? leave(rc) : rc;
}

int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the one-line failure message add_common() set
    return 2;
  }
  return -1;
}

}  // namespace kvq::cli
