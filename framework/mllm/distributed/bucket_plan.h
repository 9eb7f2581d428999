// How tensors are packed into communication buckets by bytes (gradient all-reduce and the
// start-up parameter broadcast): one pure function, so the grouping is testable on its own.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace mllm {

// What the planner needs to know about one tensor.
struct BucketTensor {
  int64_t bytes = 0;                       // numel * element size
  torch::ScalarType dtype = torch::kFloat;
  torch::Device device = torch::kCPU;
};

// Packs `tensors`, taken in the order given (DataParallel passes parameters in reverse
// registration order, roughly the order backward produces their gradients), into buckets of at
// most `cap_bytes` each: a tensor joins the open bucket of its (dtype, device) unless that would
// take the bucket past the cap, in which case the open bucket is closed first; a tensor larger
// than the cap gets a bucket of its own. Returns the buckets as lists of indices into `tensors`,
// ordered by their first tensor. Convention of PyTorch DDP's bucket_cap_mb (c10d reducer), except
// that DDP closes a bucket once it reaches the cap instead of before passing it.
// Throws Error when cap_bytes <= 0.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<BucketTensor>& tensors,
                                              int64_t cap_bytes);

}  // namespace mllm
