// Bucket packing by bytes: groupings worked out by hand from the rule in bucket_plan.h.
#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/distributed/bucket_plan.h"

using mllm::BucketTensor;
using mllm::plan_buckets;
using Plan = std::vector<std::vector<size_t>>;

namespace {
std::vector<BucketTensor> f32(std::vector<int64_t> bytes) {
  std::vector<BucketTensor> out;
  for (auto b : bytes) out.push_back({b, torch::kFloat, torch::kCPU});
  return out;
}
}  // namespace

TEST(BucketPlan, FillsUpToTheCapWithoutPassingIt) {
  // cap 100: 40+40 = 80 (adding 30 would make 110) | 30+70 = 100 | 10
  EXPECT_EQ(plan_buckets(f32({40, 40, 30, 70, 10}), 100), (Plan{{0, 1}, {2, 3}, {4}}));
}

TEST(BucketPlan, OversizedTensorGetsItsOwnBucket) {
  EXPECT_EQ(plan_buckets(f32({10, 500, 10, 10}), 100), (Plan{{0}, {1}, {2, 3}}));
}

TEST(BucketPlan, HugeCapGivesOneBucket) {
  EXPECT_EQ(plan_buckets(f32({4, 8, 16}), 25 << 20), (Plan{{0, 1, 2}}));
}

TEST(BucketPlan, DtypesNeverShareABucket) {
  std::vector<BucketTensor> t = {{8, torch::kFloat, torch::kCPU},
                                 {8, torch::kDouble, torch::kCPU},
                                 {8, torch::kFloat, torch::kCPU},
                                 {8, torch::kDouble, torch::kCPU}};
  // Ordered by first member: the float bucket starts at 0, the double one at 1.
  EXPECT_EQ(plan_buckets(t, 1024), (Plan{{0, 2}, {1, 3}}));
}

TEST(BucketPlan, RejectsNonPositiveCap) {
  EXPECT_THROW(plan_buckets(f32({4}), 0), mllm::Error);
}

TEST(BucketPlan, EmptyInputGivesNoBuckets) { EXPECT_TRUE(plan_buckets({}, 64).empty()); }
