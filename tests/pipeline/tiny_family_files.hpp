#pragma once
// The files the per-family pipeline tests start from: a tiny checkpoint written by kvq-make-tiny-hf,
// a seeded word corpus, its calibration (fp32, one thread) and one allocation — made once per test
// binary under temp_path(name) — plus two small file helpers. (KVQ_MAKE_TINY_HF: the tool's path.)
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "kvq/io/h5.hpp"
#include "run_cmd.hpp"

namespace kvq::test {

struct TinyFiles {
  std::string model, cal, alloc;
};

// kvq-make-tiny-hf --family `family` --seed 1; calib-capture of 4 windows of seq_len tokens (2 held
// out, 64 reservoir rows); kvq-allocate --method `method` --bpd `bpd`.
inline TinyFiles make_tiny_files(const std::string& name, const std::string& family, int seq_len,
                                 const std::string& method, int bpd) {
  namespace fs = std::filesystem;
  const std::string dir = temp_path(name);
  TinyFiles f{dir + "/m", dir + "/c.kvqcal.h5", dir + "/a.kvqalloc.h5"};
  if (fs::exists(f.alloc)) return f;
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto r = run_cmd(std::string(KVQ_MAKE_TINY_HF) + " --family " + family + " --seed 1 --out " + f.model);
  EXPECT_EQ(r.status, 0) << r.err;
  {
    std::mt19937 rng(1);
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "from"};
    std::ofstream c(dir + "/c.txt");
    for (int i = 0; i < 6000; ++i) c << words[rng() % 12] << (i % 17 == 16 ? ".\n" : " ");
  }
  r = run_cmd(bin("calib-capture") + " -q --threads 1 --precision fp32 --model " + f.model + " --corpus " + dir +
              "/c.txt --samples 4 --seq-len " + std::to_string(seq_len) + " --holdout 2 --reservoir-tokens 64 --out " +
              f.cal);
  EXPECT_EQ(r.status, 0) << r.err;
  r = run_cmd(bin("kvq-allocate") + " -q --calib " + f.cal + " --method " + method + " --bpd " + std::to_string(bpd) +
              " --out " + f.alloc);
  EXPECT_EQ(r.status, 0) << r.err;
  return f;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Rewrites a kvq file's root "version" attribute (an older version's file with newer keys).
inline void set_root_version(const std::string& path, int64_t version) {
  h5::quiet();
  H5::H5File f(path, H5F_ACC_RDWR);
  H5::Group g = f.openGroup("/");
  g.removeAttr("version");
  h5::write_attr(g, "version", version);
}

}  // namespace kvq::test
