// The fatal-signal report (core/crash_report.h), in death tests: the child crashes, the parent
// reads its stderr. The crashing functions are extern "C" and the test binary exports its
// symbols (ENABLE_EXPORTS), so the report can name them.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include "mllm/core/crash_report.h"

extern "C" {
volatile int mllm_test_after_call = 0;
// A call (not a tail jump: there is work after it) through a function pointer that is null.
__attribute__((noinline)) void mllm_test_call_through_null(void (*volatile fn)()) {
  fn();
  mllm_test_after_call = mllm_test_after_call + 1;
}
// A read of address 16 from a frame the unwinder can walk.
__attribute__((noinline)) int mllm_test_read_bad_address(int* volatile p) {
  const int v = p[4];
  mllm_test_after_call = mllm_test_after_call + 1;
  return v;
}
}

namespace {

void previous_handler(int) {
  const char msg[] = "previous handler ran\n";
  ssize_t w = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)w;
  _exit(7);
}

class CrashReport : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CrashReport, AJumpToAddressZeroNamesTheCaller) {
  EXPECT_EXIT(
      {
        mllm::install_crash_report(3);
        mllm_test_call_through_null(nullptr);
      },
      ::testing::KilledBySignal(SIGSEGV),
      "\\[mllm rank 3\\] fatal signal 11 \\(SIGSEGV\\) at address 0x0, pc 0x0\n"
      "\\[mllm rank 3\\] a jump to address 0x0 .*called from 0x[0-9a-f]+ "
      "mllm_test_call_through_null \\+ 0x[0-9a-f]+ \\(in .*mllm_core_tests\\)");
}

TEST_F(CrashReport, ABadReadPrintsTheStackWithTheCrashingFunction) {
  EXPECT_EXIT(
      {
        mllm::install_crash_report(0);
        mllm_test_read_bad_address(nullptr);
      },
      ::testing::KilledBySignal(SIGSEGV),
      "\\[mllm rank 0\\] fatal signal 11 \\(SIGSEGV\\) at address 0x10, pc 0x[0-9a-f]+ "
      "mllm_test_read_bad_address \\+ 0x[0-9a-f]+.*stack \\(innermost first.*"
      "mllm_test_read_bad_address");
}

TEST_F(CrashReport, TheHandlerThatWasThereRunsAfterTheReport) {
  EXPECT_EXIT(
      {
        signal(SIGSEGV, previous_handler);
        mllm::install_crash_report(1);
        mllm::install_crash_report(1);  // a second install keeps the first one's previous handler
        mllm_test_read_bad_address(nullptr);
      },
      ::testing::ExitedWithCode(7), "\\[mllm rank 1\\] fatal signal 11.*previous handler ran");
}

}  // namespace
