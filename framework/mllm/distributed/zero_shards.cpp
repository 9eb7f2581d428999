// DataParallel's parameter shards at ZeRO stages 1-3 (Rajbhandari et al. 2020): the
// shard_segments() the optimizer updates in place alias this rank's slice of each flat bucket of
// parameters (adopt_params makes the module's parameters views of those buffers, and at stage 3
// cuts each block's own shard), and after the optimizer step all_gather_params() brings every
// rank's updated slices back into every replica.
//
// Collectives: all_gather_params issues one asynchronous all-gather per bucket (stages 1-2; at
// stage 3 only for blocks gathered right now, and it starts the gathers of the embeddings and
// block 0 for the next forward), from the training thread after the optimizer step;
// wait_params() (and the next use of a bucket) waits for them.
#include "mllm/distributed/data_parallel.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/core/trace.h"

namespace mllm {

void DataParallel::adopt_params() {
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    // Stage 3: a block whose storage is freed has nothing in the module to adopt (a load goes
    // through a FullParams scope, which gathers first).
    if (!b.gathered) continue;
    wait_gather_locked(b);
    const torch::Tensor& first = params_[b.params.front()].tensor;
    if (!b.param_flat.defined())
      b.param_flat = torch::empty({b.numel}, first.options().requires_grad(false));
    for (size_t i : b.params) {
      Param& p = params_[i];
      if (!p.tensor.is_contiguous())
        throw Error(fmt::format("DataParallel: zero_stage {} needs contiguous parameters; '{}' is not",
                                zero_stage_, p.name));
      const int64_t at = b.param_flat.storage_offset() + p.offset;
      if (p.tensor.storage().is_alias_of(b.param_flat.storage()) && p.tensor.storage_offset() == at)
        continue;
      b.param_flat.narrow(0, p.offset, p.tensor.numel()).copy_(p.tensor.reshape({-1}));
      p.tensor.set_(b.param_flat.storage(), at, p.tensor.sizes(), p.tensor.strides());
    }
    // Stage 3 blocks: the segments are slices of the block's own shard (made here once, from
    // the full values), not of the gathered buffer.
    const bool own_shard = zero_stage_ == 3;
    if (own_shard && !b.shard_param.defined())
      b.shard_param = b.param_flat.narrow(0, b.shard.begin, b.shard.numel()).clone();
    const torch::Tensor& base = own_shard ? b.shard_param : b.param_flat;
    const int64_t base_offset = own_shard ? b.shard.begin : 0;
    for (size_t si : b.segments) {
      ShardSegment& seg = segments_[si];
      const int64_t at = base.storage_offset() + params_[segment_param_[si]].offset + seg.begin -
                         base_offset;
      if (seg.param.numel() > 0 && seg.param.storage().is_alias_of(base.storage()) &&
          seg.param.storage_offset() == at)
        continue;
      // The same tensor object (the optimizer keys its state by it), re-aimed.
      seg.param.set_(base.storage(), at, {seg.end - seg.begin}, {1});
    }
  }
}

void DataParallel::all_gather_params() {
  if (zero_stage_ == 0) return;
  wait_params();
  std::lock_guard<std::mutex> lock(mu_);
  adopt_params();
  for (auto& b : buckets_) {
    if (zero_stage_ == 3) {
      // Stage 3: each block is gathered when the next forward reaches it; one that is gathered
      // now (a FullParams scope is open) fetches the updated shards in place.
      if (!b.gathered) continue;
      collectives_issued_ += 1;
      trace::Label label(trace_label(b, "all-gather"));
      b.gather_work = comm_->all_gather_async(b.shard_param, b.param_flat);
      continue;
    }
    torch::Tensor mine = b.param_flat.narrow(0, b.shard.begin, b.shard.numel());
    collectives_issued_ += 1;
    trace::Label label(trace_label(b, "all-gather"));
    b.gather_work = comm_->all_gather_async(mine, b.param_flat);
  }
  // Stage 3: the next forward's first parameters (embeddings and block 0) are on their way
  // while the caller logs and loads the next batch.
  if (zero_stage_ == 3 && full_params_ == 0) {
    if (root_bucket_ != SIZE_MAX) gather_locked(buckets_[root_bucket_]);
    if (Bucket* first = block_bucket(0)) gather_locked(*first);
  }
}

void DataParallel::wait_params() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& b : buckets_) wait_gather_locked(b);
}

}  // namespace mllm
