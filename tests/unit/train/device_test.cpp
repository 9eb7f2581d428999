// CPU side of train/device.h and train.threads: the auto rule, cgroup quotas, the affinity mask.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "mllm/train/device.h"
#include "mllm/train/trainer.h"

namespace fs = std::filesystem;

namespace {

TEST(Threads, AutoFollowsOmpNumThreadsElseUsableCpusPerRank) {
  EXPECT_EQ(mllm::resolve_threads(3, 4, 2, nullptr), 3);    // explicit wins (and warns elsewhere)
  EXPECT_EQ(mllm::resolve_threads(0, 2, 16, nullptr), 8);   // 16 CPUs / 2 ranks
  EXPECT_EQ(mllm::resolve_threads(0, 4, 2, nullptr), 1);    // never below 1
  EXPECT_EQ(mllm::resolve_threads(0, 2, 16, "1"), 1);       // OMP_NUM_THREADS=1 is respected
  EXPECT_EQ(mllm::resolve_threads(0, 1, 16, "6"), 6);
  for (const char* bad : {"", "0", "-2", "3x", "two"})       // not a positive integer: ignored
    EXPECT_EQ(mllm::resolve_threads(0, 2, 16, bad), 8) << bad;
  EXPECT_EQ(mllm::resolve_threads(5, 2, 16, "1"), 5);       // explicit beats OMP_NUM_THREADS
}

class CgroupDir {
 public:
  CgroupDir() : path_(fs::temp_directory_path() / ("mllm_cgroup_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_ / "cpu");
  }
  ~CgroupDir() { fs::remove_all(path_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(path_ / name) << text; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

TEST(Threads, CgroupQuotaInWholeCpusRoundedUp) {
  CgroupDir d;
  EXPECT_EQ(mllm::cgroup_cpu_limit(d.str()), 0);                  // no files: no limit
  d.write("cpu/cpu.cfs_quota_us", "50000\n");
  d.write("cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(mllm::cgroup_cpu_limit(d.str()), 1);                  // v1: half a CPU -> 1
  d.write("cpu/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(mllm::cgroup_cpu_limit(d.str()), 0);                  // v1: -1 = unlimited
  d.write("cpu.max", "150000 100000\n");
  EXPECT_EQ(mllm::cgroup_cpu_limit(d.str()), 2);                  // v2 wins: 1.5 CPUs -> 2
  d.write("cpu.max", "max 100000\n");
  EXPECT_EQ(mllm::cgroup_cpu_limit(d.str()), 0);
  d.write("cpu.max", "400000 100000\n");
  EXPECT_EQ(mllm::cgroup_cpu_limit(d.str()), 4);
}

TEST(Threads, AffinityMaskLimitsUsableCpus) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);           // as `taskset -c <first>`
  const int usable = mllm::usable_cpus();
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(usable, 1);
  EXPECT_GE(mllm::usable_cpus(), 1);
}

}  // namespace
