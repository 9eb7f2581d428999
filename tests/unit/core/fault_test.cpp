// MLLM_FAULT grammar (core/fault.h).
#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/core/fault.h"

namespace mllm {
namespace {

TEST(Fault, ParsesEveryKind) {
  auto f = parse_faults("throw:rank=1:step=5,sleep:rank=0:step=3:seconds=2.5,enospc:step=10:file=optimizer.pt,kill:step=4");
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].kind, "throw");
  EXPECT_EQ(f[0].rank, 1);
  EXPECT_EQ(f[0].step, 5);
  EXPECT_EQ(f[1].kind, "sleep");
  EXPECT_DOUBLE_EQ(f[1].seconds, 2.5);
  EXPECT_EQ(f[2].file, "optimizer.pt");
  EXPECT_EQ(f[3].kind, "kill");
  EXPECT_EQ(f[3].rank, 0);            // default
  EXPECT_EQ(parse_faults("enospc:step=2")[0].file, "model.pt");  // default
  EXPECT_TRUE(parse_faults("").empty());
  auto skew = parse_faults("skew:step=3:by=-1e-3");
  ASSERT_EQ(skew.size(), 1u);
  EXPECT_EQ(skew[0].kind, "skew");
  EXPECT_EQ(skew[0].step, 3);
  EXPECT_DOUBLE_EQ(skew[0].by, -0.001);
  EXPECT_THROW(parse_faults("skew:step=3:by=much"), ConfigError);
}

TEST(Fault, RejectsMalformedEntries) {
  EXPECT_THROW(parse_faults("explode:step=1"), ConfigError);
  EXPECT_THROW(parse_faults("throw:rank=1"), ConfigError);        // no step
  EXPECT_THROW(parse_faults("throw:step=x"), ConfigError);
  EXPECT_THROW(parse_faults("throw:step=1:when=now"), ConfigError);
  try {
    parse_faults("nan:rank=a:step=1");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MLLM_FAULT: 'nan:rank=a:step=1': rank must be a number"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mllm
