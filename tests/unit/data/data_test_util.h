// Helpers for the data tests: a temporary folder under /tmp removed at scope exit, file writing.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mllm/core/recipe.h"

namespace mllm::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/mllm_data_test.XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Names of the files in `dir` (sorted), to check that nothing half-written is left behind.
inline std::string list_dir(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += n + ";";
  return out;
}

// gzip members, each a complete .gz stream (what `cat a.gz b.gz` or pigz makes).
inline std::string gzip_members(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& part : parts) {
    z_stream zs{};
    EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string buf(deflateBound(&zs, uLong(part.size())) + 64, '\0');
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(part.data()));
    zs.avail_in = uInt(part.size());
    zs.next_out = reinterpret_cast<Bytef*>(buf.data());
    zs.avail_out = uInt(buf.size());
    EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
    buf.resize(zs.total_out);
    deflateEnd(&zs);
    out += buf;
  }
  return out;
}

// zstd frames, one per part.
inline std::string zstd_frames(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& part : parts) {
    std::string buf(ZSTD_compressBound(part.size()), '\0');
    const size_t n = ZSTD_compress(buf.data(), buf.size(), part.data(), part.size(), 3);
    EXPECT_FALSE(ZSTD_isError(n));
    buf.resize(n);
    out += buf;
  }
  return out;
}

// One {"text": doc} line per document.
inline std::string jsonl_of(const std::vector<std::string>& docs) {
  std::string s;
  for (const auto& d : docs) s += nlohmann::json({{"text", d}}).dump() + "\n";
  return s;
}

// Expects `f` to throw E whose message contains every string in `parts`.
template <typename E, typename F>
::testing::AssertionResult throws_with(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      if (msg.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks '" << p << "': " << msg;
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw another type: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace mllm::test
