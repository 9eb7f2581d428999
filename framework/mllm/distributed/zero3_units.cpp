// ZeRO stage 3's sharded parameter units (PyTorch FSDP's full sharding): each block of the model,
// and the root unit (embeddings, final norm, head), holds only this rank's shard of its weights;
// its full storage is refilled by an all-gather just before it computes and freed just after
// (pre_forward / post_forward / pre_backward, driven by the model's BlockHooks; the root around
// the whole forward and backward). A FullParams scope keeps everything gathered for work outside
// a training step (evaluation, checkpoints, generation).
//
// Collectives: one asynchronous all-gather per unit per forward and per backward, issued on the
// thread that runs the model's forward (the training thread) or backward (the autograd engine's
// thread) from the hooks, one unit ahead of the compute (the next block's gather overlaps this
// one's work) and waited for when the unit is reached; on CUDA on NCCL's stream, ordered with the
// compute stream by events.
#include "mllm/distributed/data_parallel.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/core/trace.h"

#include <cstdio>

namespace mllm {

void DataParallel::gather_locked(Bucket& b) {
  if (b.gathered) return;
  // The block's storage comes back (from its allocator: on a GPU the caching allocator, on the
  // current stream) and the ranks' shards are gathered into it.
  c10::StorageImpl* impl = b.param_flat.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(b.numel) * b.param_flat.element_size();
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
  collectives_issued_ += 1;
  trace::Label label(trace_label(b, "all-gather"));
  b.gather_work = comm_->all_gather_async(b.shard_param, b.param_flat);
  b.gathered = true;
}

void DataParallel::wait_gather_locked(Bucket& b) {
  if (!b.gather_work) return;
  auto w = std::move(b.gather_work);
  b.gather_work.reset();
  w->wait();
}

void DataParallel::release_locked(Bucket& b) {
  if (zero_stage_ != 3 || !b.gathered || full_params_ > 0) return;
  wait_gather_locked(b);  // the backend must be done writing into it
  // Why the storage itself: autograd's saved tensors and the module hold this StorageImpl;
  // freeing its memory in place (PyTorch FSDP resizes the storage to 0 the same way) and
  // refilling it at the next gather keeps every one of them valid without touching them.
  c10::StorageImpl* impl = b.param_flat.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, b.param_flat.device()));
  impl->set_nbytes(0);
  b.gathered = false;
}

DataParallel::Bucket* DataParallel::block_bucket(int64_t block) {
  if (zero_stage_ != 3) return nullptr;
  if (block < 0)
    throw Error(fmt::format("DataParallel: block {} out of range (ZeRO stage 3 hooks)", block));
  if (block >= static_cast<int64_t>(block_bucket_.size()) ||
      block_bucket_[static_cast<size_t>(block)] == SIZE_MAX)
    return nullptr;  // a block without trainable parameters: nothing to gather
  return &buckets_[block_bucket_[static_cast<size_t>(block)]];
}

void DataParallel::pre_forward(int64_t block) {
  std::lock_guard<std::mutex> lock(mu_);
  Bucket* b = block_bucket(block);
  if (!b) return;
  gather_locked(*b);
  // Prefetch: the next block's gather runs on the network while this block computes.
  if (Bucket* next = block_bucket(block + 1)) gather_locked(*next);
  wait_gather_locked(*b);
}

void DataParallel::post_forward(int64_t block) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Bucket* b = block_bucket(block)) release_locked(*b);
}

void DataParallel::pre_model_forward() {
  if (zero_stage_ != 3) return;
  end_initial_full();  // no broadcast_and_verify: this rank's own values become its shards
  std::lock_guard<std::mutex> lock(mu_);
  if (root_bucket_ != SIZE_MAX) gather_locked(buckets_[root_bucket_]);
  if (Bucket* first = block_bucket(0)) gather_locked(*first);
  if (root_bucket_ != SIZE_MAX) wait_gather_locked(buckets_[root_bucket_]);
}

void DataParallel::release_params() {
  if (zero_stage_ != 3) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& b : buckets_) release_locked(b);
}

void DataParallel::pre_backward(int64_t block) {
  std::lock_guard<std::mutex> lock(mu_);
  Bucket* b = block_bucket(block);
  if (!b) return;
  gather_locked(*b);
  if (block > 0)
    if (Bucket* prev = block_bucket(block - 1)) gather_locked(*prev);
  wait_gather_locked(*b);
}

void DataParallel::begin_full_params() {
  if (zero_stage_ != 3) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (full_params_++ > 0) return;
  for (auto& b : buckets_) gather_locked(b);
  for (auto& b : buckets_) wait_gather_locked(b);
}

void DataParallel::end_full_params() {
  if (zero_stage_ != 3) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (--full_params_ > 0) return;
  // Whatever the full parameters hold now (a loaded checkpoint, rank 0's broadcast values)
  // becomes this rank's shard; unchanged values copy onto themselves.
  adopt_params();
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    b.shard_param.copy_(b.param_flat.narrow(0, b.shard.begin, b.shard.numel()));
    release_locked(b);
  }
}

DataParallel::FullParams::FullParams(DataParallel& dp) : dp_(dp) { dp_.begin_full_params(); }

DataParallel::FullParams::~FullParams() {
  try {
    dp_.end_full_params();
  } catch (const std::exception& e) {
    // A destructor must not throw; the failed gather is reported by the next collective.
    fprintf(stderr, "DataParallel: releasing the full parameters failed: %s\n", e.what());
  }
}

}  // namespace mllm
