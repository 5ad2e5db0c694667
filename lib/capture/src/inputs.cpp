// What a capture derives from its options before the first forward (the model, the corpus's tokens,
// the window plan, the provenance, the streamed forward's memory plan), and the check that a file
// to resume was made from the same.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <sys/stat.h>

#include <filesystem>

#include "capture_detail.hpp"
#include "kvq/util/disk_space.hpp"
#include "kvq/capture/memory_size.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/model/model.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/error.hpp"

namespace kvq {
namespace {

int64_t now_unix() {
  if (const char* e = std::getenv("SOURCE_DATE_EPOCH")) return std::atoll(e);  // reproducible builds
  return int64_t(std::time(nullptr));
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(int64_t(1) << 30));
  return buf;
}

}  // namespace

namespace capture_detail {

void check_resumable(const std::string& out, const CalibFile& old, const CalibProvenance& want,
                     const std::vector<int64_t>& offsets) {
  auto mismatch = [&](const std::string& field, const std::string& was, const std::string& now) {
    throw Error(out, field, "cannot resume: file has '" + was + "', this run has '" + now + "'");
  };
  const auto& p = old.prov;
  if (p.model_config_sha256 != want.model_config_sha256)
    mismatch("provenance.model_config_sha256", p.model_config_sha256, want.model_config_sha256);
  if (p.tokenizer_sha256 != want.tokenizer_sha256)
    mismatch("provenance.tokenizer_sha256", p.tokenizer_sha256, want.tokenizer_sha256);
  if (p.special_tokens_mode != want.special_tokens_mode)
    mismatch("provenance.special_tokens_mode", p.special_tokens_mode, want.special_tokens_mode);
  if (p.forward_precision != want.forward_precision)  // another arithmetic: other statistics
    mismatch("provenance.forward_precision", p.forward_precision, want.forward_precision);
  if (p.corpus.size() != want.corpus.size())
    mismatch("provenance.corpus", std::to_string(p.corpus.size()) + " files", std::to_string(want.corpus.size()) + " files");
  for (size_t i = 0; i < p.corpus.size(); ++i)
    if (p.corpus[i].sha256 != want.corpus[i].sha256)
      mismatch("provenance.corpus[" + std::to_string(i) + "].sha256", p.corpus[i].sha256, want.corpus[i].sha256);
  auto num = [&](const char* f, int64_t a, int64_t b) {
    if (a != b) mismatch(std::string("provenance.") + f, std::to_string(a), std::to_string(b));
  };
  num("n_ranks", p.n_ranks, want.n_ranks);  // first: another rank count changes every rank's share
  num("seed", int64_t(p.seed), int64_t(want.seed));
  num("samples", p.samples, want.samples);
  num("holdout", p.holdout, want.holdout);
  num("seq_len", p.seq_len, want.seq_len);
  num("batch_size", p.batch_size, want.batch_size);
  num("reservoir_tokens", p.reservoir_tokens, want.reservoir_tokens);
  // A file from before the prefix was recorded: its window_bos gives the prefix's length.
  const std::vector<int> now = want.window_prefix.value_or(std::vector<int>{});
  if (p.window_prefix ? *p.window_prefix != now : p.window_prefix_size() != now.size()) {
    auto ids = [](const std::vector<int>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    mismatch("provenance.window_prefix",
             p.window_prefix ? ids(*p.window_prefix) : std::string(p.window_bos ? "[BOS]" : "[]"), ids(now));
  }
  if (old.calib_offsets != offsets) throw Error(out, h5path::kCalibOffsets, "cannot resume: window plan differs");
}

std::unique_ptr<Inputs> prepare(const CaptureOptions& o) {
  if (o.out.empty()) throw Error("", "--out", "an output path is required");
  if (o.batch_size < 1) throw Error("", "--batch", "must be >= 1, got " + std::to_string(o.batch_size));
  if (o.reservoir_tokens < 0) throw Error("", "--reservoir-tokens", "must be >= 0");
  if (o.checkpoint_every < 0) throw Error("", "--checkpoint-every", "must be >= 0");

  if (o.max_memory < 0) throw Error("", "--max-memory", "must be > 0");
  if (o.chunk_windows < 0 || o.chunk_windows % o.batch_size != 0)
    throw Error("", "--chunk", std::to_string(o.chunk_windows) + " is not a positive multiple of --batch " +
                                   std::to_string(o.batch_size));
  Model::LoadOptions lo;
  lo.stream = o.stream;
  lo.precision = o.precision;
  auto in = std::make_unique<Inputs>(Model::load(o.model, lo));
  spdlog::info("forward precision: {} ({})", precision_name(o.precision),
               o.precision == Precision::kBf16 ? "BF16 GEMM weights and products, fp32 norms/attention/statistics"
                                               : "every weight and GEMM in fp32");
  const ModelConfig& cfg = in->model.config();
  if (o.seq_len > cfg.max_seq_len)
    throw Error(o.model, "--seq-len",
                std::to_string(o.seq_len) + " exceeds the model's maximum " + std::to_string(cfg.max_seq_len));
  const std::string tok_path =
      o.tokenizer.empty() ? Tokenizer::default_path_for_model(o.model, cfg.vocab_size) : o.tokenizer;
  auto tok = Tokenizer::load(tok_path);

  spdlog::info("reading corpus ({} path(s))", o.corpus.size());
  CorpusText text = read_corpus(o.corpus, o.lossy_utf8);
  for (const auto& f : text.files)
    if (f.replaced_bytes > 0) spdlog::warn("{}: replaced {} invalid UTF-8 byte(s)", f.path, f.replaced_bytes);
  auto t0 = std::chrono::steady_clock::now();
  const SpecialTokens mode = parse_special_tokens(o.special_tokens);
  int64_t special_matched = 0;
  in->stream = tokenize_corpus(text, [&](const std::string& s) {
    int m = 0;
    auto ids = tok->encode(s, mode, &m);
    special_matched += m;
    return ids;
  });
  if (special_matched > 0)
    spdlog::warn("{} special-token string(s) (e.g. <|begin_of_text|>) in the corpus were encoded as special tokens; "
                 "--special-tokens text encodes them as plain text",
                 special_matched);
  spdlog::info("tokenized {} tokens in {:.1f} s", in->stream.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const std::string corpus_name = o.corpus.size() == 1 ? o.corpus[0] : "corpus";
  if (in->stream.empty()) throw Error(corpus_name, "--corpus", "corpus is empty (no tokens)");
  // Windows start as the tokenizer's sequences do: Llama [BOS], Qwen nothing, GLM-4 [gMASK] <sop>.
  const std::vector<int> prefix = tok->prefix_ids();
  for (int id : prefix)
    if (id < 0 || id >= cfg.vocab_size)
      throw Error(tok_path, "prefix", "token id " + std::to_string(id) + " is outside the model's vocabulary (" +
                                          std::to_string(cfg.vocab_size) + ")");
  if (tok->adds_bos() && cfg.bos_id >= 0 && prefix != std::vector<int>{cfg.bos_id})
    spdlog::warn("the tokenizer's BOS {} is not config.json's bos_token_id {}: windows start with the tokenizer's",
                 prefix.empty() ? -1 : prefix[0], cfg.bos_id);
  in->plan = plan_windows(int64_t(in->stream.size()), o.seq_len, o.samples, o.holdout, o.seed, prefix, corpus_name);

  const int64_t wb = o.window_begin, we = o.window_end < 0 ? o.samples : o.window_end;
  if (wb < 0 || we > o.samples || wb >= we)
    throw Error("", "--windows", "range " + std::to_string(wb) + ":" + std::to_string(we) + " not within 0:" +
                                     std::to_string(o.samples));
  in->offsets.assign(in->plan.calib.begin() + wb, in->plan.calib.begin() + we);

  in->shape = MomentShape{cfg.n_layers, cfg.n_kv_heads, cfg.n_heads, cfg.head_dim, cfg.head_dim_v};
  CalibProvenance& prov = in->prov;
  prov.tool_version = KVQ_VERSION;
  prov.model_path = o.model;
  prov.model_config_sha256 = in->model.config_sha256();
  prov.architecture = cfg.architecture;
  prov.pairing = cfg.pairing;
  prov.rotary_dim = cfg.rotary_dim;
  prov.rope_theta = cfg.rope_theta;
  {
    const RopeParams rp = rope_params(cfg, o.seq_len);  // every window runs positions [0, seq_len)
    prov.rope_type = to_string(cfg.rope_scaling.type);
    prov.rope_inv_freq = rp.inv_freq;
    prov.rope_attention_factor = rp.attention_factor;
    if (cfg.rope_local_theta > 0) {  // Gemma 3: the local layers' own RoPE
      const RopeParams lp = local_rope_params(cfg);
      prov.rope_local_inv_freq = lp.inv_freq;
      prov.rope_local_attention_factor = lp.attention_factor;
      for (int l = 0; l < cfg.n_layers; ++l)
        if (cfg.local_rope(l)) prov.rope_local_layers.push_back(l);
    }
  }
  prov.head_dim = cfg.head_dim;
  prov.head_dim_v = cfg.head_dim_v;
  prov.softmax_scale = cfg.softmax_scale;
  prov.n_layers = cfg.n_layers;
  if (cfg.hybrid()) {  // only the layers with a KV cache are captured (version 8 records which)
    prov.decoder_layers = cfg.attn_layer_index;
    prov.n_decoder_layers = cfg.decoder_layers();
  }
  prov.n_heads = cfg.n_heads;
  prov.n_kv_heads = cfg.n_kv_heads;
  for (int g = 0; g < cfg.n_heads; ++g) prov.gqa_map.push_back(cfg.kv_head_of(g));
  for (int l = 0; l < cfg.n_layers; ++l) prov.layer_window.push_back(cfg.window_of(l));
  {
    // A window of W >= seq_len never cuts a key off: the capture cannot see what the window does.
    std::vector<int> unseen;
    for (int l = 0; l < cfg.n_layers; ++l)
      if (cfg.window_of(l) > 0 && cfg.window_of(l) >= o.seq_len) unseen.push_back(l);
    if (!unseen.empty())
      spdlog::warn("--seq-len {} does not exceed the sliding window of {} of {} layers (window {}): those layers are "
                   "captured as full attention and the window's effect is not measured; use --seq-len > {}",
                   o.seq_len, unseen.size(), cfg.n_layers, cfg.window_of(unseen[0]), cfg.window_of(unseen[0]));
  }
  for (const auto& layer : in->model.attention_sinks()) prov.attention_sinks.emplace_back(layer.begin(), layer.end());
  prov.corpus = text.files;
  prov.tokenizer_path = tok_path;
  prov.tokenizer_sha256 = tok->sha256();
  prov.special_tokens_mode = to_string(mode);
  prov.special_tokens_matched = special_matched;
  prov.window_bos = tok->adds_bos();
  prov.window_prefix = prefix;
  prov.seed = o.seed;
  prov.samples = int(in->offsets.size());
  prov.holdout = o.holdout;
  prov.seq_len = o.seq_len;
  prov.batch_size = o.batch_size;
  prov.reservoir_tokens = o.reservoir_tokens;
  prov.forward_precision = precision_name(in->model.precision());
  prov.n_tokens_corpus = int64_t(in->stream.size());
  prov.created_unix = now_unix();
  if (o.stream) in->memory = plan_memory(*in, o);
  in->disk = plan_disk(*in, o);
  return in;
}

std::string temp_dir(const CaptureOptions& o) {
  if (!o.tmp_dir.empty()) return o.tmp_dir;
  const std::filesystem::path dir = std::filesystem::path(o.out).parent_path();
  return dir.empty() ? std::string(".") : dir.string();
}

DiskPlan plan_disk(const Inputs& in, const CaptureOptions& o) {
  const ModelConfig& cfg = in.model.config();
  const int64_t T = o.seq_len, L = cfg.n_layers, d = cfg.head_dim;
  const int64_t row = int64_t(cfg.n_heads + 2 * cfg.n_kv_heads) * d * int64_t(sizeof(float));
  const int64_t rows = std::min<int64_t>(o.reservoir_tokens, int64_t(in.offsets.size()) * T);
  const int64_t holdout = int64_t(in.plan.holdout.size()) * T * L * row;
  const int64_t moments = L * int64_t(3 * cfg.n_kv_heads) * (d * d + d) * int64_t(sizeof(double));
  DiskPlan p;
  // The file: reservoir rows and their sources, held-out windows, moments, offsets; HDF5's own
  // metadata is small beside them.
  p.file = rows * L * row + rows * 2 * int64_t(sizeof(int64_t)) + holdout + moments +
           int64_t(in.plan.holdout.size() + in.offsets.size()) * int64_t(sizeof(int64_t)) + (int64_t(1) << 20);
  if (o.stream) {
    p.payload = in.memory.payload_in_file;
    if (in.memory.spill) p.spill = in.memory.chunk * in.memory.per_window;
  }
  const std::string out_dir = [&] {
    const std::filesystem::path dir = std::filesystem::path(o.out).parent_path();
    return dir.empty() ? std::string(".") : dir.string();
  }();
  const std::string tmp = temp_dir(o);
  std::error_code ec;
  if (!o.tmp_dir.empty() && !std::filesystem::is_directory(o.tmp_dir, ec))
    throw Error(o.tmp_dir, "--tmp-dir", "is not a directory");
  struct stat a {}, b {};
  const bool same_fs = ::stat(out_dir.c_str(), &a) == 0 && ::stat(tmp.c_str(), &b) == 0 && a.st_dev == b.st_dev;
  const int64_t temps = p.payload + p.spill;
  spdlog::info("disk plan: the file {} beside --out{}", gib(p.file),
               temps > 0 ? ", temporary payload " + gib(p.payload) + (p.spill > 0 ? " + spill " + gib(p.spill) : "") +
                               " in " + (same_fs ? out_dir : tmp)
                         : std::string());
  if (same_fs) {
    check_disk_space(out_dir, p.file + temps, "--out", "the calibration file" + std::string(temps > 0 ? " and its temporary payload" : ""));
  } else {
    check_disk_space(out_dir, p.file, "--out", "the calibration file");
    if (temps > 0) check_disk_space(tmp, temps, "--tmp-dir", "the temporary payload");
  }
  return p;
}

MemoryPlan plan_memory(const Inputs& in, const CaptureOptions& o) {
  const ModelConfig& cfg = in.model.config();
  MemoryPlan m;
  m.budget = o.max_memory > 0 ? o.max_memory : default_memory_budget();
  for (int l = 0; l < cfg.decoder_layers(); ++l) {  // every decoder layer, cached or not
    const int64_t b = in.model.layer_bytes(l) + in.model.layer_stored_bytes(l);
    if (b > m.layer) m.layer = b, m.widest_layer = l;
  }
  const int64_t T = o.seq_len, L = cfg.n_layers;
  const int64_t row = int64_t(cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim * int64_t(sizeof(float));
  const int64_t n_win = int64_t(in.offsets.size());
  m.scratch = Model::workspace_bytes(cfg, o.batch_size, T, in.model.precision());
  // The file's payload held in memory: reservoir rows (at most the tokens there are), held-out
  // windows whole, and the moments (sums and second moments of K, V and each query group).
  const int64_t reservoir = std::min<int64_t>(o.reservoir_tokens, n_win * T) * L * row;
  const int64_t holdout = int64_t(in.plan.holdout.size()) * T * L * row;
  const int64_t d = cfg.head_dim;
  const int64_t moments = L * int64_t(3 * cfg.n_kv_heads) * (d * d + d) * int64_t(sizeof(double));
  // Streamed, the reservoir and held-out rows live in files beside --out (payload_memory.hpp) and
  // about one layer of them is resident: each row's slice of the layer, rounded out to pages.
  const int64_t page = 4096;
  auto pages = [&](int64_t bytes) { return ((bytes + page - 1) / page + 1) * page; };
  const int64_t rows = std::min<int64_t>(o.reservoir_tokens, n_win * T);
  const int64_t hd = int64_t(cfg.head_dim) * int64_t(sizeof(float));
  const int64_t res_layer =
      rows * (pages(cfg.n_heads * hd) + 2 * pages(cfg.n_kv_heads * hd));
  const int64_t hold_layer = int64_t(in.plan.holdout.size()) * T * row + 3 * 2 * page;
  m.payload_in_file = reservoir + holdout;
  m.payload = std::min(reservoir, res_layer) + std::min(holdout, hold_layer) + moments;
  m.per_window = T * int64_t(cfg.hidden_size) * int64_t(sizeof(float));
  const int64_t fixed = m.layer + m.scratch + m.payload;
  if (fixed > m.budget)
    throw Error(o.model, "--max-memory",
                gib(m.budget) + " cannot hold one layer's pass: layer " + std::to_string(m.widest_layer) + " takes " +
                    gib(m.layer) + " (" + precision_name(in.model.precision()) + " " +
                    gib(in.model.layer_bytes(m.widest_layer)) + " + stored " +
                    gib(in.model.layer_stored_bytes(m.widest_layer)) + "), a batch's scratch " + gib(m.scratch) +
                    ", the file's resident reservoir/held-out/moments " + gib(m.payload) + "; need at least " + gib(fixed));
  const int64_t B = o.batch_size;
  const int64_t fit = (m.budget - fixed) / m.per_window / B * B;  // whole batches whose hidden states fit
  const int64_t all = std::max<int64_t>(B, (n_win + B - 1) / B * B);
  m.chunk = o.chunk_windows > 0 ? o.chunk_windows : std::min(all, fit);
  m.spill = o.spill || m.chunk * m.per_window > m.budget - fixed;
  if (m.chunk < B) m.chunk = all;  // spilling: the whole run's windows can share each layer
  if (o.checkpoint_every > 0)      // chunks end where the batch loop would write its checkpoints
    m.chunk = std::min(m.chunk, (int64_t(o.checkpoint_every) + B - 1) / B * B);
  spdlog::info("memory plan: budget {}, layer {} {} ({} {} + stored {}), scratch {} (batch {} x {} tokens), "
                "payload {} resident ({} in files in --tmp-dir), hidden states {} per window, chunk {} windows{}, "
                "expected peak {}",
                gib(m.budget), m.widest_layer, gib(m.layer), precision_name(in.model.precision()),
                gib(in.model.layer_bytes(m.widest_layer)),
                gib(in.model.layer_stored_bytes(m.widest_layer)), gib(m.scratch), B, T, gib(m.payload),
                gib(m.payload_in_file),
                gib(m.per_window), m.chunk, m.spill ? " spilled to a file in --tmp-dir" : "", gib(m.peak()));
  return m;
}

}  // namespace capture_detail
}  // namespace kvq
