// kvq-export's model directories: an HF checkpoint linked (or copied) with kvq's files added, the
// safetensors index rewritten, built beside the target and renamed into place.
#include "kvq/export/model_dir.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"

namespace kvq::exporter {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::map<std::string, uint64_t> safetensors_tensor_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "", "cannot open for reading");
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw Error(path, "", "cannot stat: " + ec.message());
  unsigned char len[8];
  if (size < 8 || !f.read(reinterpret_cast<char*>(len), 8)) throw Error(path, "header", "shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > size - 8) throw Error(path, "header", "length " + std::to_string(n) + " runs past the end of the file");
  std::string text(size_t(n), '\0');
  if (!f.read(text.data(), std::streamsize(n))) throw Error(path, "header", "cannot read");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text);
  } catch (const std::exception&) {
    throw Error(path, "header", "not valid JSON");
  }
  if (!h.is_object()) throw Error(path, "header", "not a JSON object");
  const uint64_t data = size - 8 - n;
  std::map<std::string, uint64_t> out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& e = it.value();
    const std::string field = "header['" + it.key() + "'].data_offsets";
    if (!e.is_object() || !e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2 ||
        !e["data_offsets"][0].is_number_unsigned() || !e["data_offsets"][1].is_number_unsigned())
      throw Error(path, field, "missing or not two offsets");
    const uint64_t b = e["data_offsets"][0], en = e["data_offsets"][1];
    if (b > en || en > data) throw Error(path, field, "[" + std::to_string(b) + ", " + std::to_string(en) + "] outside the data");
    out[it.key()] = en - b;
  }
  return out;
}

namespace {

bool is_file_name(const std::string& s) { return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos; }

ojson read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "", "cannot open for reading");
  try {
    return ojson::parse(f);
  } catch (const std::exception&) {
    throw Error(path, "", "not valid JSON");
  }
}

}  // namespace

HfModelDir read_hf_model_dir(const std::string& dir) {
  HfModelDir m;
  m.dir = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(dir, "--model", "not a directory (kvq-export writes a model directory from an HF checkpoint)");
  const std::string config = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config, ec)) throw Error(dir, "config.json", "missing");
  m.config = read_json(config);
  if (!m.config.is_object()) throw Error(config, "", "not a JSON object");
  m.config_sha256 = sha256_file(config);
  const ojson* layers = m.config.contains("num_hidden_layers") ? &m.config["num_hidden_layers"]
                        : m.config.contains("text_config") && m.config["text_config"].is_object() &&
                                  m.config["text_config"].contains("num_hidden_layers")
                            ? &m.config["text_config"]["num_hidden_layers"]
                            : nullptr;
  if (!layers || !layers->is_number_integer() || layers->get<int64_t>() <= 0 || layers->get<int64_t>() > 1 << 20)
    throw Error(config, "num_hidden_layers", "missing or not an integer > 0");
  m.n_layers = int(layers->get<int64_t>());

  const std::string index = (fs::path(dir) / kIndexName).string();
  std::map<std::string, std::string> listed;  // the index's own weight_map
  if (fs::exists(index, ec)) {
    const ojson j = read_json(index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index, "weight_map", "missing or not an object");
    if (j.contains("metadata") && j["metadata"].is_object()) m.index_metadata = j["metadata"];
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string field = "weight_map['" + it.key() + "']";
      if (!it.value().is_string() || !is_file_name(it.value().get<std::string>()))
        throw Error(index, field, it.value().dump() + " is not a file name in the model directory");
      listed[it.key()] = it.value().get<std::string>();
      shards.insert(it.value().get<std::string>());
    }
    if (shards.empty()) throw Error(index, "weight_map", "empty");
    m.shards.assign(shards.begin(), shards.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    m.shards = {"model.safetensors"};
  } else {
    throw Error(dir, "model.safetensors", "missing (and no " + std::string(kIndexName) + ")");
  }
  for (const std::string& shard : m.shards) {
    const std::string p = (fs::path(dir) / shard).string();
    if (!fs::exists(p, ec)) throw Error(index, "weight_map", "shard '" + shard + "' does not exist");
    for (const auto& [name, bytes] : safetensors_tensor_bytes(p)) {
      auto [it, fresh] = m.weight_map.emplace(name, shard);
      if (!fresh) throw Error(p, "tensor '" + name + "'", "also in shard '" + it->second + "'");
      m.total_size += bytes;
    }
  }
  for (const auto& [name, shard] : listed) {
    auto it = m.weight_map.find(name);
    if (it == m.weight_map.end() || it->second != shard)
      throw Error(index, "weight_map['" + name + "']", "'" + shard + "' does not hold this tensor");
  }
  return m;
}

void check_model_out_dir(const std::string& out) {
  if (out.empty()) throw Error("", "--out", "is empty");
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec)) throw Error(out, "--out", "exists and is not a directory");
  if (!fs::is_empty(out, ec))
    throw Error(out, "--out", "exists and is not empty (kvq-export writes a new model directory; give a new path)");
}

ojson model_index_json(const HfModelDir& m, const std::vector<StTensor>& scales) {
  std::map<std::string, std::string> wm = m.weight_map;
  uint64_t total = m.total_size;
  for (const StTensor& t : scales) {
    wm[t.name] = kScalesName;
    total += t.bytes.size();
  }
  ojson meta = m.index_metadata;
  meta["total_size"] = total;
  ojson map = ojson::object();
  for (const auto& [k, v] : wm) map[k] = v;
  ojson j = ojson::object();
  j["metadata"] = meta;
  j["weight_map"] = map;
  return j;
}

namespace {

// Writes and fsyncs one file of the directory being built (the directory is renamed as a whole).
void put(const std::string& path, const std::string& bytes) {
  {
    std::ofstream f(path, std::ios::binary);
    if (!f) throw Error(path, "", "cannot open for writing");
    f.write(bytes.data(), std::streamsize(bytes.size()));
    f.close();
    if (!f) throw Error(path, "", "write failed (disk full?)");
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// The hidden sibling directory, removed with everything in it unless released.
struct TempDir {
  std::string path;
  bool keep = false;
  ~TempDir() {
    if (keep || path.empty()) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// SIGINT / SIGTERM / SIGHUP wait while the hidden directory is built: the interrupt handler removes
// files, not a directory tree, so a stop is taken between files, after the directory is removed
// (stop_if_asked), and then ends the run as it would anywhere else (one line, 128 + signal).
class HeldSignals {
 public:
  HeldSignals() {
    sigemptyset(&set_);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set_, s);
    ::pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~HeldSignals() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  HeldSignals(const HeldSignals&) = delete;
  HeldSignals& operator=(const HeldSignals&) = delete;
  void stop_if_asked(TempDir& tmp) {
    sigset_t p;
    if (::sigpending(&p) != 0) return;
    bool asked = false;
    for (int s : {SIGINT, SIGTERM, SIGHUP}) asked = asked || (sigismember(&p, s) == 1 && sigismember(&old_, s) == 0);
    if (!asked) return;
    std::error_code ec;
    fs::remove_all(tmp.path, ec);
    tmp.path.clear();
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);  // the pending signal is taken here
    throw Error("", "--out", "interrupted");          // a handler that returned
  }

 private:
  sigset_t set_, old_;
};

// Tests (scripts/fault-table): KVQ_TEST_EXPORT_PAUSE_MS=N sleeps N ms after each file of the hidden
// directory, so a signal lands while it is built.
int test_pause_ms() {
  const char* e = std::getenv("KVQ_TEST_EXPORT_PAUSE_MS");
  return e ? std::max(0, std::atoi(e)) : 0;
}

}  // namespace

std::vector<std::string> write_model_dir(const HfModelDir& m, const std::string& out, bool copy, const ModelDirOutput& o) {
  check_model_out_dir(out);
  std::error_code ec;
  // Names kvq writes: the model must not have them already (other than the two it rewrites).
  // No scales (kvq-export vllm-turboquant): the checkpoint's own index and shards stay as they are.
  const bool scales = !o.scales.empty();
  std::set<std::string> written;
  if (scales) written = {kIndexName, kScalesName};
  if (!o.config.is_null()) written.insert("config.json");
  for (const auto& e : o.extra) written.insert(e.first);
  for (const std::string& name : written) {
    if (name == kIndexName || name == "config.json") continue;
    if (fs::exists(fs::path(m.dir) / name, ec))
      throw Error((fs::path(m.dir) / name).string(), "--model",
                  "the model already has this file, which kvq-export would write: export from the original checkpoint");
  }
  for (const StTensor& t : o.scales)
    if (m.weight_map.count(t.name))
      throw Error((fs::path(m.dir) / m.weight_map.at(t.name)).string(), "tensor '" + t.name + "'",
                  "the checkpoint already has KV-cache scales: export from the original checkpoint");

  const std::string st = safetensors_bytes(o.scales, o.scales_metadata);
  const std::string index = model_index_json(m, o.scales).dump(2) + "\n";

  fs::path target = fs::absolute(out, ec);
  if (target.filename().empty()) target = target.parent_path();  // "dir/"
  make_parent_dirs(target.parent_path().string(), "--out");
  remove_dead_build_dirs(target.string());
  HeldSignals held;  // before tmp: an error removes the directory before a pending signal is taken
  const int pause_ms = test_pause_ms();
  TempDir tmp;
  tmp.path = (target.parent_path() / ("." + target.filename().string() + ".kvq-tmp." + std::to_string(::getpid()))).string();
  fs::remove_all(tmp.path, ec);
  fs::create_directory(tmp.path, ec);
  if (ec) throw Error(tmp.path, "--out", "cannot create the directory: " + ec.message());

  for (const auto& entry : fs::directory_iterator(m.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || written.count(name)) continue;
    const fs::path src = fs::canonical(entry.path(), ec);
    if (ec) throw Error(entry.path().string(), "--model", "cannot resolve: " + ec.message());
    const fs::path dst = fs::path(tmp.path) / name;
    if (copy)
      fs::copy(src, dst, fs::copy_options::recursive, ec);
    else
      fs::create_symlink(src, dst, ec);
    if (ec) throw Error(dst.string(), "--out", std::string(copy ? "cannot copy: " : "cannot link: ") + ec.message());
    if (pause_ms > 0) ::usleep(useconds_t(pause_ms) * 1000);
    held.stop_if_asked(tmp);
  }
  if (ec) throw Error(m.dir, "--model", "cannot list: " + ec.message());

  std::vector<std::string> paths;
  auto add = [&](const std::string& name, const std::string& bytes) {
    put((fs::path(tmp.path) / name).string(), bytes);
    paths.push_back((fs::path(out) / name).string());
    if (pause_ms > 0) ::usleep(useconds_t(pause_ms) * 1000);
    held.stop_if_asked(tmp);
  };
  if (!o.config.is_null()) add("config.json", o.config.dump(2) + "\n");
  if (scales) {
    add(kIndexName, index);
    add(kScalesName, st);
  }
  for (const auto& [name, bytes] : o.extra) add(name, bytes);

  // An empty `out` is replaced by the rename; a missing one is created by it.
  if (::rename(tmp.path.c_str(), target.c_str()) != 0)
    throw Error(out, "--out", std::string("cannot move the finished directory into place: ") + std::strerror(errno));
  tmp.keep = true;
  set_interrupt_note("the model directory " + out + " was already written");
  const int fd = ::open(target.parent_path().c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  return paths;
}

}  // namespace kvq::exporter
