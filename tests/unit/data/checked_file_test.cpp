// CheckedFile: a full disk is a named error (ENOSPC from the kernel via /dev/full, and injected).
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <functional>

#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/data/atomic_file.h"

namespace mllm {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckedFile, WritesAndAppends) {
  const std::string p = ::testing::TempDir() + "/checked_" + std::to_string(::getpid());
  write_file_checked(p, "ab\n");
  {
    CheckedFile f(p, /*append=*/true);
    f.write("cd\n");
    f.close();
  }
  EXPECT_EQ(read_file_bytes(p), "ab\ncd\n");
  std::filesystem::remove(p);
}

TEST(CheckedFile, FullDiskIsANamedError) {
  // /dev/full: every write fails with ENOSPC, as on a full file system.
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  EXPECT_EQ(message_of([] { write_file_checked("/dev/full", "x"); }),
            "cannot write /dev/full: No space left on device");
  // The deferred form (for LibTorch's writer): no exception while writing, the error at close.
  CheckedFile f("/dev/full");
  EXPECT_EQ(f.write_deferred("abc", 3), 3u);
  EXPECT_EQ(f.write_deferred("def", 3), 3u);
  EXPECT_EQ(message_of([&] { f.close(); }), "cannot write /dev/full: No space left on device");
}

TEST(CheckedFile, InjectedErrorAndUnwritableFolder) {
  const std::string p = ::testing::TempDir() + "/checked_inj_" + std::to_string(::getpid());
  CheckedFile f(p);
  f.inject_error(ENOSPC);
  EXPECT_EQ(message_of([&] { f.write("x"); }), "cannot write " + p + ": No space left on device");
  std::filesystem::remove(p);
  EXPECT_EQ(message_of([] { CheckedFile g("/nonexistent-dir/x"); }),
            "cannot write /nonexistent-dir/x: No such file or directory");
}

}  // namespace
}  // namespace mllm
