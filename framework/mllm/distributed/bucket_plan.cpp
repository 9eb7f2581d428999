// Greedy bucket packing by bytes, one open bucket per (dtype, device).
#include "mllm/distributed/bucket_plan.h"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "mllm/core/error.h"

namespace mllm {

std::vector<std::vector<size_t>> plan_buckets(const std::vector<BucketTensor>& tensors,
                                              int64_t cap_bytes) {
  if (cap_bytes <= 0)
    throw Error(fmt::format("bucket cap must be positive, got {} bytes (dist.bucket_mb)", cap_bytes));
  struct Open {
    std::vector<size_t> members;
    int64_t bytes = 0;
  };
  // Key: (dtype, device) as a string; a bucket is one flat buffer, so it cannot mix them.
  std::map<std::string, Open> open;
  std::vector<std::vector<size_t>> closed;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    auto& b = open[fmt::format("{}/{}", static_cast<int>(t.dtype), t.device.str())];
    if (!b.members.empty() && b.bytes + t.bytes > cap_bytes) {
      closed.push_back(std::move(b.members));
      b = Open{};
    }
    b.members.push_back(i);
    b.bytes += t.bytes;
  }
  for (auto& kv : open)
    if (!kv.second.members.empty()) closed.push_back(std::move(kv.second.members));
  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return closed;
}

}  // namespace mllm
