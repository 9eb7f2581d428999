// Atomic, verified checkpoints: temporary folder -> fsync -> rename -> `latest`.
#include "mllm/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include "mllm/core/error.h"
#include "mllm/core/fault.h"
#include "mllm/core/plugin.h"
#include "mllm/data/atomic_file.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace mllm {
namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kLatest = "latest";

// fsync a folder so that a rename inside it survives a crash.
void fsync_dir(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw Error("cannot open " + p.string() + " to fsync it: " + std::strerror(errno));
  int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error("cannot write " + p.string() + ": " + std::strerror(err));
}

// ENOSPC when MLLM_FAULT has enospc:step=`step`:file=<p's name>, else 0.
int injected_errno(int64_t step, const fs::path& p) {
  auto f = injected_fault("enospc", -1, step);
  return f && f->file == p.filename().string() ? ENOSPC : 0;
}

// Writes `text` to `p` (write, fsync, close), every failure named.
void write_text(const fs::path& p, const std::string& text, int inject_errno = 0) {
  CheckedFile f(p.string());
  if (inject_errno) f.inject_error(inject_errno);
  f.write(text);
  f.close();
}

// Runs `save(writer)` — a LibTorch archive or torch::save writing through `writer` — into `p`.
// Why a writer function rather than a path: LibTorch's file writer reports a short write (a
// full disk) from its destructor, which ends the process in std::terminate; CheckedFile
// remembers the failure and close() throws it as a named error instead.
template <typename Save>
void save_torch(const fs::path& p, int inject_errno, Save&& save) {
  CheckedFile f(p.string());
  if (inject_errno) f.inject_error(inject_errno);
  std::function<size_t(const void*, size_t)> writer = [&f](const void* data, size_t n) {
    return f.write_deferred(data, n);
  };
  try {
    save(writer);
  } catch (const c10::Error& e) {
    throw Error("cannot write " + p.string() + ": " + e.what_without_backtrace());
  }
  f.close();
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw CheckpointError("cannot read " + p.string() + ": missing or unreadable");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint32_t file_crc32(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw CheckpointError("cannot read " + p.string());
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(in.gcount()));
  }
  return static_cast<uint32_t>(crc);
}

// The folder name `latest` points at, trimmed; "" when there is no `latest`.
std::string read_latest(const fs::path& checkpoints_dir) {
  if (!fs::exists(checkpoints_dir / kLatest)) return "";
  std::string name = read_text(checkpoints_dir / kLatest);
  name.erase(name.find_last_not_of(" \n\r\t") + 1);
  return name;
}

std::string rng_file(int rank) { return fmt::format("rng_rank_{:02d}.pt", rank); }
std::string rng_file_cuda(int rank) { return fmt::format("rng_rank_{:02d}.cuda.pt", rank); }

// The device of the module's first parameter (CPU for a module without any).
torch::Device module_device(torch::nn::Module& m) {
  for (const auto& p : m.parameters()) return p.device();
  return torch::Device(torch::kCPU);
}

// Steps of the step_NNNNNN folders under dir, newest first.
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0 && name.size() > 5 &&
        std::all_of(name.begin() + 5, name.end(), ::isdigit))
      out.emplace_back(std::stoll(name.substr(5)), e.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::string optimizer_rank_file(int rank) { return fmt::format("optimizer_rank_{:02d}.pt", rank); }

void write_manifest(const fs::path& dir, int inject_errno, const json& optimizer_shards) {
  json files = json::object();
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename() == kManifest) continue;
    files[e.path().filename().string()] = {{"bytes", fs::file_size(e.path())},
                                           {"crc32", file_crc32(e.path())}};
  }
  json m = {{"format", "mllm-checkpoint"}, {"version", 1}, {"files", files}};
  if (!optimizer_shards.is_null()) m["optimizer_shards"] = optimizer_shards;
  write_text(dir / kManifest, m.dump(2) + "\n", inject_errno);
}

}  // namespace

std::string checkpoint_name(int64_t step) { return fmt::format("step_{:06d}", step); }

std::string save_checkpoint(Communicator& comm, const std::string& checkpoints_dir,
                            const TrainState& state, torch::nn::Module& model,
                            torch::optim::Optimizer& optimizer, const std::string& recipe_yaml,
                            const std::string& tokenizer_path, int64_t keep_last,
                            const std::vector<OptimizerPiece>* shard, int zero_stage) {
  const fs::path dir(checkpoints_dir);
  const fs::path final_dir = dir / checkpoint_name(state.step);
  const fs::path tmp_dir = dir / (".tmp_" + checkpoint_name(state.step));
  const int64_t step = state.step;
  // A failed write (full disk, I/O error) leaves no half-written folder behind: rank 0 removes
  // the temporary folder and rethrows; `latest` and every earlier checkpoint are untouched.
  // (A failure on another rank aborts the job; the next start removes the leftover.)
  auto on_rank0 = [&](const std::function<void()>& body) {
    if (comm.rank() != 0) return;
    try {
      body();
    } catch (const std::exception& e) {
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);
      if (dynamic_cast<const Error*>(&e)) throw;
      throw Error(fmt::format("cannot save checkpoint {}: {}", final_dir.string(), e.what()));
    }
  };
  on_rank0([&] {
    fs::create_directories(dir);
    fs::remove_all(tmp_dir);  // left over by a process killed mid-save
    fs::create_directories(tmp_dir);
  });
  // Why: every rank writes its RNG file into tmp_dir, which rank 0 must have created first.
  comm.barrier();
  {
    const fs::path p = tmp_dir / rng_file(comm.rank());
    torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
    save_torch(p, injected_errno(step, p), [&](auto& w) { torch::save(rng, w); });
    // Dropout on a GPU draws from that GPU's generator: saved too, for exact GPU resumes.
    const torch::Device device = module_device(model);
    if (device.is_cuda()) {
      const fs::path pc = tmp_dir / rng_file_cuda(comm.rank());
      torch::Tensor cuda_rng = at::globalContext().defaultGenerator(device).get_state();
      save_torch(pc, injected_errno(step, pc), [&](auto& w) { torch::save(cuda_rng, w); });
    }
  }
  // ZeRO stage 1: every rank's own AdamW state, and rank 0 learns every rank's pieces.
  json optimizer_shards;
  if (shard) {
    json pieces = json::array();
    const fs::path p = tmp_dir / optimizer_rank_file(comm.rank());
    save_torch(p, injected_errno(step, p), [&](auto& w) {
      torch::serialize::OutputArchive archive;
      for (size_t i = 0; i < shard->size(); ++i) {
        const OptimizerPiece& piece = (*shard)[i];
        auto it = optimizer.state().find(piece.tensor.unsafeGetTensorImpl());
        const auto* st = it == optimizer.state().end()
                             ? nullptr
                             : dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
        pieces.push_back({{"param", piece.name}, {"begin", piece.begin}, {"end", piece.end},
                          {"numel", piece.param_numel}, {"state", st != nullptr}});
        if (!st) continue;
        archive.write(fmt::format("exp_avg_{}", i), st->exp_avg().detach().reshape({-1}).cpu());
        archive.write(fmt::format("exp_avg_sq_{}", i), st->exp_avg_sq().detach().reshape({-1}).cpu());
        archive.write(fmt::format("step_{}", i), torch::tensor({st->step()}, torch::kInt64));
      }
      archive.save_to(w);
    });
    const auto all = comm.all_gather(pieces.dump());
    if (comm.rank() == 0) {
      json ranks = json::array();
      for (size_t r = 0; r < all.size(); ++r)
        ranks.push_back({{"file", optimizer_rank_file(static_cast<int>(r))},
                         {"pieces", json::parse(all[r])}});
      optimizer_shards = {{"zero_stage", zero_stage}, {"world_size", comm.world_size()}, {"ranks", ranks}};
    }
  }
  // Why: if rank 0 fails below it removes tmp_dir; no other rank may still be writing into it.
  comm.barrier();
  on_rank0([&] {
    const fs::path pm = tmp_dir / "model.pt";
    save_torch(pm, injected_errno(step, pm), [&](auto& w) {
      torch::serialize::OutputArchive archive;
      model.save(archive);
      archive.save_to(w);
    });
    // Fault injection for the crash-safety test: die mid-save, as a node failure would.
    if (injected_fault("kill", -1, step)) ::raise(SIGKILL);
    if (!shard) {
      const fs::path po = tmp_dir / "optimizer.pt";
      save_torch(po, injected_errno(step, po), [&](auto& w) {
        torch::serialize::OutputArchive archive;
        optimizer.save(archive);
        archive.save_to(w);
      });
    }
    const fs::path ps = tmp_dir / "model.safetensors";
    export_safetensors(model, ps.string(), injected_errno(step, ps));
    json sampler = {{"epoch", state.sampler.epoch}, {"step_in_epoch", state.sampler.step_in_epoch}};
    if (!state.sampler.drawn.empty()) sampler["drawn"] = state.sampler.drawn;
    json st = {{"step", state.step},
               {"tokens", state.tokens},
               {"sampler", sampler},
               {"world_size", state.world_size},
               {"elapsed_s", state.elapsed_s},
               {"lr", state.lr},
               {"nonfinite_skips", state.nonfinite_skips},
               {"tokenizer_fingerprint", fmt::format("{:016x}", state.tokenizer_fingerprint)}};
    if (!state.data_fingerprint.empty()) {
      json files = json::array();
      for (const auto& f : state.corpus_files)
        files.push_back({{"path", f.path}, {"source", f.source}, {"bytes", f.size},
                         {"hash", fmt::format("{:016x}", f.hash)}});
      st["data"] = {{"fingerprint", state.data_fingerprint}, {"corpus_files", files}};
    }
    write_text(tmp_dir / "state.json", st.dump(2) + "\n", injected_errno(step, tmp_dir / "state.json"));
    write_text(tmp_dir / "recipe.yaml", recipe_yaml, injected_errno(step, tmp_dir / "recipe.yaml"));
    if (!tokenizer_path.empty()) {
      const fs::path tok = tmp_dir / ("tokenizer" + fs::path(tokenizer_path).extension().string());
      write_text(tok, read_file_bytes(tokenizer_path), injected_errno(step, tok));
    }
  });
  // Why: the manifest must list every rank's RNG file, so all writes finish first.
  comm.barrier();
  on_rank0([&] {
    write_manifest(tmp_dir, injected_errno(step, tmp_dir / kManifest), optimizer_shards);
    fsync_dir(tmp_dir);
    fs::remove_all(final_dir);  // a stale folder of the same step from an abandoned run
    fs::rename(tmp_dir, final_dir);
    fsync_dir(dir);
  });
  if (comm.rank() == 0) {
    // `latest` moves last, atomically: a failure before the rename leaves the previous one.
    const fs::path latest_tmp = dir / ".latest.tmp";
    try {
      write_text(latest_tmp, checkpoint_name(state.step) + "\n");
      fs::rename(latest_tmp, dir / kLatest);
      fsync_dir(dir);
    } catch (const std::exception& e) {
      std::error_code ec;
      fs::remove(latest_tmp, ec);
      throw Error(fmt::format("saved {} but could not point {} at it: {}", final_dir.string(),
                              (dir / kLatest).string(), e.what()));
    }
    // Folders past this step belong to an abandoned continuation (we resumed from an earlier
    // checkpoint); of the rest, the newest keep_last stay — this save always among them.
    int64_t kept = 0;
    for (const auto& [s, path] : list_checkpoints(dir))
      if (s > state.step || ++kept > keep_last) fs::remove_all(path);
  }
  // Why: no rank may go on (and perhaps be killed) believing a save happened before it did.
  comm.barrier();
  return final_dir.string();
}

std::vector<std::string> remove_interrupted_saves(const std::string& checkpoints_dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(checkpoints_dir, ec)) return removed;
  for (const auto& e : fs::directory_iterator(checkpoints_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp_step_", 0) == 0 || name == ".latest.tmp") {
      fs::remove_all(e.path(), ec);
      removed.push_back(name);
    }
  }
  return removed;
}

void verify_checkpoint(const std::string& folder) {
  const fs::path dir(folder);
  if (!fs::is_directory(dir)) throw CheckpointError("checkpoint " + folder + ": no such folder");
  json m;
  try {
    m = json::parse(read_text(dir / kManifest));
  } catch (const json::exception& e) {
    throw CheckpointError("checkpoint " + folder + ": manifest.json is unreadable (" + e.what() +
                          "); the save was probably interrupted");
  }
  if (!m.contains("files") || !m["files"].is_object())
    throw CheckpointError("checkpoint " + folder + ": manifest.json lists no files");
  for (const auto& [name, info] : m["files"].items()) {
    const fs::path p = dir / name;
    if (!fs::exists(p)) throw CheckpointError("checkpoint file " + p.string() + " is missing");
    const auto bytes = fs::file_size(p);
    if (bytes != info.at("bytes").get<uint64_t>())
      throw CheckpointError(fmt::format("checkpoint file {} is truncated or altered: {} bytes, "
                                        "manifest says {}", p.string(), bytes,
                                        info.at("bytes").get<uint64_t>()));
    if (file_crc32(p) != info.at("crc32").get<uint32_t>())
      throw CheckpointError("checkpoint file " + p.string() +
                            " fails its CRC-32 check (corrupted on disk)");
  }
}

std::optional<std::string> find_resume_checkpoint(const std::string& resume,
                                                  const std::string& checkpoints_dir) {
  if (resume == "none") return std::nullopt;
  if (resume != "auto") {
    fs::path p(resume);
    if (!fs::exists(p)) throw CheckpointError(fmt::format("{}: no such file or folder", resume));
    if (p.filename() == kLatest && fs::is_regular_file(p)) {  // checkpoints/latest itself
      p = p.parent_path() / read_latest(p.parent_path());
    } else if (fs::exists(p / kLatest)) {
      p = p / read_latest(p);
    } else if (fs::exists(p / "checkpoints" / kLatest)) {
      p = p / "checkpoints" / read_latest(p / "checkpoints");
    } else if (!fs::exists(p / "manifest.json")) {
      // Not a checkpoint: say what the folder is instead of "cannot read .../manifest.json".
      const bool run_dir = fs::is_directory(p / "checkpoints") || fs::exists(p / "metrics.jsonl");
      const fs::path dir = run_dir ? p / "checkpoints" : p;
      const auto steps = list_checkpoints(dir);  // newest first
      if (run_dir && steps.empty())
        throw CheckpointError(fmt::format(
            "{} is a run folder without checkpoints: the run saved none (checkpoint.every_steps) "
            "or was stopped before its first save", resume));
      if (!steps.empty())
        throw CheckpointError(fmt::format(
            "{} has checkpoint folders but no `latest` file (an interrupted save?); name one of "
            "them, e.g. {}", dir.string(), steps.front().second.string()));
      throw CheckpointError(fmt::format(
          "{} is not a checkpoint (no manifest.json), a checkpoints folder or a run folder "
          "(neither has `latest`)", resume));
    }
    verify_checkpoint(p.string());
    return p.string();
  }
  const fs::path dir(checkpoints_dir);
  const std::string latest = read_latest(dir);
  auto all = list_checkpoints(dir);
  // Try `latest` first, then every other folder newest first.
  std::stable_partition(all.begin(), all.end(),
                        [&](const auto& c) { return c.second.filename() == latest; });
  for (const auto& [step, path] : all) {
    try {
      verify_checkpoint(path.string());
      if (path.filename() != latest)
        spdlog::warn("resuming from {} instead of latest ({})", path.string(),
                     latest.empty() ? "missing" : latest);
      return path.string();
    } catch (const CheckpointError& e) {
      spdlog::warn("skipping checkpoint {}: {}", path.string(), e.what());
    }
  }
  return std::nullopt;
}

OpenedCheckpoint open_checkpoint(const std::string& path,
                                 const std::optional<std::vector<std::string>>& plugins) {
  if (path == "auto" || path == "none")
    throw CheckpointError("--checkpoint needs a folder: a checkpoint (checkpoints/step_NNNNNN) "
                          "or a run / checkpoints folder with `latest`");
  OpenedCheckpoint c;
  c.folder = find_resume_checkpoint(path, "").value();
  const std::string text = read_checkpoint_recipe(c.folder);
  if (plugins) {
    load_plugins(*plugins);
  } else {
    // The saved `plugins:` paths are relative to the folder training ran in: from anywhere else
    // they are missing, and --plugins is the way to say where they are now.
    YAML::Node saved;
    try {
      saved = YAML::Load(text);
    } catch (const YAML::Exception&) {
    }  // load_recipe_string below reports a broken recipe with its line
    if (saved.IsMap() && saved["plugins"] && saved["plugins"].IsSequence())
      for (const auto& item : saved["plugins"])
        if (item.IsScalar() && !fs::exists(item.Scalar()))
          throw ConfigError(fmt::format(
              "{}/recipe.yaml: the checkpoint was trained with plugin '{}' (recipe `plugins:`, "
              "relative to the folder training ran in), which is not there from {}; give the "
              "plugins' current paths with --plugins PATH [PATH...], or run from that folder",
              c.folder, item.Scalar(), fs::current_path().string()));
  }
  c.recipe = load_recipe_string(text, c.folder + "/recipe.yaml", {}, ".",
                                plugins ? RecipePlugins::kAlreadyLoaded : RecipePlugins::kLoad);
  if (plugins) c.recipe.plugins = *plugins;
  return c;
}

TrainState read_train_state(const std::string& folder) {
  const fs::path p = fs::path(folder) / "state.json";
  try {
    json st = json::parse(read_text(p));
    TrainState s;
    s.step = st.at("step").get<int64_t>();
    s.tokens = st.at("tokens").get<int64_t>();
    s.sampler.epoch = st.at("sampler").at("epoch").get<int64_t>();
    s.sampler.step_in_epoch = st.at("sampler").at("step_in_epoch").get<int64_t>();
    // Sequences drawn per source of a data.sources mixture (absent otherwise).
    if (st.at("sampler").contains("drawn"))
      s.sampler.drawn = st.at("sampler").at("drawn").get<std::vector<int64_t>>();
    s.world_size = st.at("world_size").get<int>();
    s.elapsed_s = st.at("elapsed_s").get<double>();
    s.lr = st.at("lr").get<double>();
    s.nonfinite_skips = st.value("nonfinite_skips", int64_t{0});  // absent before 2026-12
    s.tokenizer_fingerprint = std::stoull(st.at("tokenizer_fingerprint").get<std::string>(),
                                          nullptr, 16);
    if (st.contains("data")) {  // absent before 2026-12-07
      s.data_fingerprint = st.at("data").at("fingerprint").get<std::string>();
      for (const auto& f : st.at("data").at("corpus_files"))
        s.corpus_files.push_back({f.at("path").get<std::string>(), f.at("source").get<int>(),
                                  f.at("bytes").get<uint64_t>(),
                                  std::stoull(f.at("hash").get<std::string>(), nullptr, 16)});
    }
    return s;
  } catch (const json::exception& e) {
    throw CheckpointError("checkpoint file " + p.string() + " is malformed: " + e.what());
  }
}

std::string read_checkpoint_recipe(const std::string& folder) {
  return read_text(fs::path(folder) / "recipe.yaml");
}

std::string checkpoint_tokenizer_path(const std::string& folder) {
  for (const auto& e : fs::directory_iterator(folder))
    if (e.path().stem() == "tokenizer") return e.path().string();
  throw CheckpointError("checkpoint " + folder + " holds no tokenizer file");
}

void load_model_weights(const std::string& folder, torch::nn::Module& model) {
  const fs::path p = fs::path(folder) / "model.pt";
  try {
    torch::serialize::InputArchive archive;
    // Onto the model's device, wherever the checkpoint was written (GPU <-> CPU resumes).
    archive.load_from(p.string(), module_device(model));
    model.load(archive);
  } catch (const c10::Error& e) {
    throw CheckpointError("cannot load weights from " + p.string() + ": " + e.what_without_backtrace());
  }
}

void load_optimizer_state(const std::string& folder, torch::optim::Optimizer& optimizer) {
  const fs::path p = fs::path(folder) / "optimizer.pt";
  torch::Device device(torch::kCPU);
  for (const auto& group : optimizer.param_groups())
    if (!group.params().empty()) {
      device = group.params().front().device();
      break;
    }
  try {
    torch::load(optimizer, p.string(), device);
  } catch (const c10::Error& e) {
    throw CheckpointError("cannot load optimizer state from " + p.string() + ": " +
                          e.what_without_backtrace());
  }
}

bool has_sharded_optimizer_state(const std::string& folder) {
  try {
    return json::parse(read_text(fs::path(folder) / kManifest)).contains("optimizer_shards");
  } catch (const json::exception& e) {
    throw CheckpointError("checkpoint " + folder + ": manifest.json is unreadable (" + e.what() + ")");
  }
}

namespace {
// A piece of saved AdamW state: elements [begin, end) of parameter `name`.
struct SavedPiece {
  std::string name;
  int64_t begin = 0, end = 0;
  int64_t step = 0;
  torch::Tensor exp_avg, exp_avg_sq;  // [end - begin] float, CPU
};

std::vector<SavedPiece> read_saved_pieces(const std::string& folder,
                                          const std::vector<NamedParam>& model_params,
                                          const OptimConfig& cfg) {
  std::vector<SavedPiece> out;
  const json m = json::parse(read_text(fs::path(folder) / kManifest));
  if (!m.contains("optimizer_shards")) {
    // A stage-0 checkpoint: optimizer.pt, loaded into an optimizer over the whole parameters.
    std::vector<torch::Tensor> decay, no_decay;
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& p : model_params) {
      torch::Tensor t = torch::zeros_like(p.param, torch::TensorOptions().device(torch::kCPU));
      (decays(cfg, p) ? decay : no_decay).push_back(t);
      named.emplace_back(p.name, t);
    }
    auto opt = make_adamw(cfg, decay, no_decay);
    const fs::path po = fs::path(folder) / "optimizer.pt";
    try {
      torch::load(*opt, po.string(), torch::Device(torch::kCPU));
    } catch (const c10::Error& e) {
      throw CheckpointError("cannot load optimizer state from " + po.string() + ": " +
                            e.what_without_backtrace());
    }
    for (const auto& [name, t] : named) {
      auto it = opt->state().find(t.unsafeGetTensorImpl());
      if (it == opt->state().end()) continue;
      const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      out.push_back({name, 0, t.numel(), st.step(), st.exp_avg().reshape({-1}),
                     st.exp_avg_sq().reshape({-1})});
    }
    return out;
  }
  const json& shards = m["optimizer_shards"];
  for (const auto& rank : shards.at("ranks")) {
    const fs::path p = fs::path(folder) / rank.at("file").get<std::string>();
    torch::serialize::InputArchive archive;
    try {
      archive.load_from(p.string(), torch::Device(torch::kCPU));
      const auto& pieces = rank.at("pieces");
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (!pieces[i].at("state").get<bool>()) continue;
        SavedPiece sp;
        sp.name = pieces[i].at("param").get<std::string>();
        sp.begin = pieces[i].at("begin").get<int64_t>();
        sp.end = pieces[i].at("end").get<int64_t>();
        torch::Tensor step;
        archive.read(fmt::format("exp_avg_{}", i), sp.exp_avg);
        archive.read(fmt::format("exp_avg_sq_{}", i), sp.exp_avg_sq);
        archive.read(fmt::format("step_{}", i), step);
        sp.step = step.item<int64_t>();
        if (sp.exp_avg.numel() != sp.end - sp.begin || sp.exp_avg_sq.numel() != sp.end - sp.begin)
          throw CheckpointError(fmt::format("{}: piece {} of {} holds {} moments for elements "
                                            "[{}, {})", p.string(), i, sp.name,
                                            sp.exp_avg.numel(), sp.begin, sp.end));
        out.push_back(std::move(sp));
      }
    } catch (const c10::Error& e) {
      throw CheckpointError("cannot load optimizer state from " + p.string() + ": " +
                            e.what_without_backtrace());
    } catch (const json::exception& e) {
      throw CheckpointError("checkpoint " + folder + ": manifest.json optimizer_shards: " + e.what());
    }
  }
  return out;
}
}  // namespace

void load_optimizer_state_resharded(const std::string& folder, torch::optim::Optimizer& optimizer,
                                    const std::vector<OptimizerPiece>& targets,
                                    const std::vector<NamedParam>& model_params,
                                    const OptimConfig& cfg) {
  const std::vector<SavedPiece> saved = read_saved_pieces(folder, model_params, cfg);
  torch::NoGradGuard no_grad;
  for (const OptimizerPiece& t : targets) {
    const int64_t n = t.end - t.begin;
    torch::Tensor m1 = torch::zeros({n}, torch::kFloat), m2 = torch::zeros({n}, torch::kFloat);
    int64_t step = -1, covered = 0;
    for (const SavedPiece& s : saved) {
      if (s.name != t.name) continue;
      const int64_t lo = std::max(s.begin, t.begin), hi = std::min(s.end, t.end);
      if (step >= 0 && s.step != step)
        throw CheckpointError(fmt::format("checkpoint {}: the pieces of {} have different AdamW "
                                          "step counts ({} and {})", folder, t.name, step, s.step));
      step = s.step;
      if (lo >= hi) continue;
      m1.narrow(0, lo - t.begin, hi - lo).copy_(s.exp_avg.narrow(0, lo - s.begin, hi - lo));
      m2.narrow(0, lo - t.begin, hi - lo).copy_(s.exp_avg_sq.narrow(0, lo - s.begin, hi - lo));
      covered += hi - lo;
    }
    if (step < 0) continue;  // no state saved for this parameter (it never had a gradient)
    if (covered != n)
      throw CheckpointError(fmt::format("checkpoint {}: its optimizer state covers {} of elements "
                                        "[{}, {}) of {}", folder, covered, t.begin, t.end, t.name));
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(step);
    st->exp_avg(m1.to(t.tensor.options()).view(t.tensor.sizes()));
    st->exp_avg_sq(m2.to(t.tensor.options()).view(t.tensor.sizes()));
    optimizer.state()[t.tensor.unsafeGetTensorImpl()] = std::move(st);
  }
}

namespace {

// Sets `gen`'s state from the tensor saved at `p`; CheckpointError naming the file on failure.
void restore_generator(at::Generator gen, const fs::path& p) {
  torch::Tensor state;
  try {
    torch::load(state, p.string());
  } catch (const c10::Error& e) {
    throw CheckpointError("cannot load RNG state from " + p.string() + ": " +
                          e.what_without_backtrace());
  }
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

bool load_rng_state(const std::string& folder, int rank, const torch::Device& device) {
  const fs::path p = fs::path(folder) / rng_file(rank);
  if (!fs::exists(p)) return false;
  restore_generator(at::detail::getDefaultCPUGenerator(), p);
  // The GPU generator's state when the checkpoint has one and we train on a GPU (a CPU
  // checkpoint resumed on a GPU, or the other way round, re-seeds dropout on the GPU).
  const fs::path pc = fs::path(folder) / rng_file_cuda(rank);
  if (device.is_cuda() && fs::exists(pc))
    restore_generator(at::globalContext().defaultGenerator(device), pc);
  return true;
}

void export_safetensors(torch::nn::Module& model, const std::string& path, int inject_errno) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : model.named_parameters()) tensors.emplace_back(item.key(), item.value());
  write_safetensors(tensors, path, inject_errno);
}

void write_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::string& path, int inject_errno) {
  json header = json::object();
  std::vector<torch::Tensor> blobs;
  uint64_t offset = 0;
  for (const auto& [name, value] : tensors) {
    torch::Tensor t = value.detach().contiguous().cpu();
    const char* dtype = t.scalar_type() == torch::kBFloat16 ? "BF16" : "F32";
    if (t.scalar_type() != torch::kBFloat16) t = t.to(torch::kFloat32);
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype}, {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    blobs.push_back(t);
  }
  header["__metadata__"] = {{"format", "pt"}, {"producer", "mllm"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  CheckedFile out(path);
  if (inject_errno) out.inject_error(inject_errno);
  const uint64_t n = text.size();  // little-endian on every platform we build for (x86-64, arm64)
  out.write(&n, 8);
  out.write(text);
  for (const auto& t : blobs) out.write(t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
  out.close();
}

}  // namespace mllm
