// RunFolderLock: a second holder is refused naming the first; the lock ends with its holder.
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/train/run_lock.h"

namespace mllm {
namespace {

TEST(RunFolderLock, SecondWriterIsRefusedUntilTheFirstEnds) {
  const std::string dir = ::testing::TempDir() + "/run_lock_test_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  {
    RunFolderLock first(dir);  // creates the folder
    EXPECT_TRUE(std::filesystem::exists(dir + "/.lock"));
    // flock locks belong to an open file description: a second open in this same process
    // conflicts exactly as another process would.
    try {
      RunFolderLock second(dir);
      FAIL() << "second lock taken";
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("run folder " + dir + " is in use by another run (pid " +
                         std::to_string(::getpid()) + " on host "), std::string::npos) << msg;
      EXPECT_EQ(e.exit_code(), 2);
    }
  }
  RunFolderLock again(dir);  // released with the first holder
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mllm
