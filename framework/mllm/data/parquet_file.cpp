// ParquetFile: the dlopen'ed libmllm_parquet module behind a C++ interface that throws DataError.
#include "mllm/data/parquet_file.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>
#include <mutex>

#include "mllm/core/error.h"
#include "mllm/core/plugin.h"
#include "mllm/data/parquet_module/parquet_api.h"

namespace mllm {
namespace {

struct Module {
#define MLLM_PQ_MEMBER(name) mllm_pq_##name##_fn name = nullptr;
  MLLM_PQ_SYMBOLS(MLLM_PQ_MEMBER)
#undef MLLM_PQ_MEMBER
  std::string error;  // why it is not loaded
};

const Module& module() {
  static Module m;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string path = libmllm_module_path("MLLM_PARQUET_MODULE", "libmllm_parquet.so");
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      m.error = fmt::format("this mllm was built without Parquet support (no {}: CMake found no "
                            "pyarrow in the Python LibTorch came from; run "
                            "launch/install-deps.sh and build again, or convert the file to "
                            ".jsonl)",
                            path);
      return;
    }
    // RTLD_LOCAL: Arrow's symbols stay out of the global scope that LibTorch shares.
    void* dl = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
      m.error = fmt::format("cannot load the Parquet module '{}': {}", path, ::dlerror());
      return;
    }
#define MLLM_PQ_RESOLVE(name)                                                                  \
  m.name = reinterpret_cast<mllm_pq_##name##_fn>(::dlsym(dl, "mllm_pq_" #name));               \
  if (!m.name) {                                                                               \
    m.error = fmt::format("the Parquet module '{}' lacks mllm_pq_" #name                       \
                          "; it is from another mllm version, rebuild mllm_parquet", path);    \
    return;                                                                                    \
  }
    MLLM_PQ_SYMBOLS(MLLM_PQ_RESOLVE)
#undef MLLM_PQ_RESOLVE
    if (m.api_version() != MLLM_PQ_API_VERSION)
      m.error = fmt::format("the Parquet module '{}' has API version {}, this mllm needs {}; "
                            "rebuild mllm_parquet", path, m.api_version(), MLLM_PQ_API_VERSION);
  });
  return m;
}

const Module& loaded(const std::string& path) {
  const Module& m = module();
  if (!m.error.empty()) throw DataError(fmt::format("{}: {}", path, m.error));
  return m;
}

void append(void* ctx, const char* data, size_t n) { static_cast<std::string*>(ctx)->append(data, n); }

}  // namespace

bool parquet_available() { return module().error.empty(); }

ParquetFile::ParquetFile(const std::string& path, const std::string& column) : path_(path) {
  const Module& m = loaded(path);
  std::string err;
  handle_ = m.open(path.c_str(), column.c_str(), append, &err);
  if (!handle_) throw DataError(fmt::format("{}: {}", path, err));
}

ParquetFile::~ParquetFile() {
  if (handle_) module().close(handle_);
}

int64_t ParquetFile::row_groups() const { return module().row_groups(handle_); }

int64_t ParquetFile::row_group_rows(int64_t rg) const { return module().row_group_rows(handle_, rg); }

int64_t ParquetFile::row_group_bytes(int64_t rg) const {
  return module().row_group_bytes(handle_, rg);
}

void ParquetFile::read_row_group(
    int64_t rg, const std::function<bool(std::string_view, bool)>& value) const {
  struct Ctx {
    const std::function<bool(std::string_view, bool)>* value;
    std::exception_ptr error;
  } ctx{&value, nullptr};
  auto call = [](void* c, const char* data, size_t n, int is_null) -> int {
    auto* x = static_cast<Ctx*>(c);
    try {
      return (*x->value)(std::string_view(data ? data : "", n), is_null != 0) ? 0 : 1;
    } catch (...) {
      x->error = std::current_exception();  // no C++ exception crosses the C interface
      return 1;
    }
  };
  std::string err;
  const int rc = module().read_row_group(handle_, rg, call, &ctx, append, &err);
  if (ctx.error) std::rethrow_exception(ctx.error);
  if (rc == 1)
    throw DataError(fmt::format("{}: row group {}: cannot read the text column ({})", path_, rg, err));
}

}  // namespace mllm
