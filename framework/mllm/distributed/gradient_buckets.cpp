// DataParallel's gradient buckets and their overlap with backward (ZeRO stages 0-2; stage 3's
// buckets are its blocks): an autograd hook per parameter marks its gradient ready; when a
// bucket's last gradient is in, it is launched (in bucket order, so every rank issues the same
// sequence): at stage 0 one all-reduce (average) of the bucket, whose .grad tensors alias it
// (DDP's gradient_as_bucket_view); at stages 1-3 an all-reduce of the bucket's "used" flags and a
// reduce-scatter of its gradients into this rank's slice (stage 2-3: into a persistent gradient
// shard, at most two full-size buckets alive at once).
//
// Threads and streams: the launches run on the thread that runs backward (the autograd engine's
// CPU worker, or its device thread for CUDA tensors) under the bucket mutex; the collectives are
// asynchronous (the MPI backend's communication thread; NCCL's own stream, ordered after the
// producer stream by an event: docs/distributed.md). finish_gradient_sync(), on the training
// thread, waits for every one of them and folds the results; no communication happens on
// non-final micro-steps (set_sync(false)) below stage 2.
#include "mllm/distributed/data_parallel.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/core/trace.h"

namespace mllm {
namespace {

// `sizes` elements of `buffer` from element `offset`, as a tensor of its own rather than an
// autograd view: optimizers' zero_grad() calls detach_() on .grad, which views refuse. The
// deleter holds a reference, so the bucket lives as long as any gradient aliasing it.
torch::Tensor bucket_alias(const torch::Tensor& buffer, int64_t offset, at::IntArrayRef sizes) {
  void* ptr = static_cast<char*>(buffer.data_ptr()) + offset * static_cast<int64_t>(buffer.element_size());
  torch::Tensor keep = buffer;
  return torch::from_blob(ptr, sizes, [keep](void*) {}, buffer.options().requires_grad(false));
}

}  // namespace

void DataParallel::set_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_ && !enabled)
    throw Error("DataParallel::set_sync(false) while a gradient sync is in flight; call "
                "finish_gradient_sync() after the last micro-step's backward first");
  sync_enabled_ = enabled;
}

void DataParallel::on_grad_ready(size_t i) {
  // Non-final micro-step: gradients only accumulate (stage 2: reduce-scattered all the same).
  if (!sync_enabled_.load() && zero_stage_ < 2) return;
  std::lock_guard<std::mutex> lock(mu_);
  Param& p = params_[i];
  if (p.ready)
    throw Error(fmt::format(
        "DataParallel: parameter '{}' received a gradient twice in one synced step; call "
        "finish_gradient_sync() after each synced backward, and set_sync(false) for the "
        "micro-steps before the last",
        p.name));
  p.ready = true;
  in_flight_ = true;
  if (--buckets_[p.bucket].pending == 0) launch_ready_buckets_locked();
}

void DataParallel::launch_ready_buckets_locked() {
  // Strictly in bucket order, so every rank issues the same sequence of collectives even when
  // autograd completes buckets out of order.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0)
    launch_bucket_locked(buckets_[next_launch_++]);
}

void DataParallel::launch_bucket_locked(Bucket& b) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& first = params_[b.params.front()].tensor;
  const int64_t n_params = static_cast<int64_t>(b.params.size());
  if (zero_stage_ >= 2) {
    // At most two full-size buffers at once: the bucket launched two before this one is done
    // (or waited for here, usually long finished) and folded into its shard.
    for (size_t k = 0; k + 2 < next_launch_; ++k)
      if (!buckets_[k].folded) fold_bucket_locked(buckets_[k]);
    // Every element is written below (a gradient, zeros or a flag).
    b.buffer = torch::empty({b.numel + n_params}, first.options().requires_grad(false));
    b.grad_shard = b.buffer.narrow(0, b.shard.begin, b.shard.numel());
    b.folded = false;
  } else if (!b.buffer.defined()) {
    b.buffer = torch::zeros({b.numel + n_params}, first.options().requires_grad(false));
  }
  // The flags say which parameters had a gradient on this rank: after the average a flag > 0
  // means some rank had one, so the parameter gets a .grad; otherwise it stays undefined.
  std::vector<float> flags(static_cast<size_t>(n_params), 0.0f);
  torch::Tensor flags_view = b.buffer.narrow(0, b.numel, n_params);
  for (int64_t k = 0; k < n_params; ++k) {
    const Param& p = params_[b.params[k]];
    torch::Tensor slice = b.buffer.narrow(0, p.offset, p.tensor.numel());
    const torch::Tensor& g = p.tensor.grad();
    if (g.defined()) {
      if (g.is_sparse())
        throw Error("DataParallel: sparse gradient for parameter '" + p.name + "' is not supported");
      if (zero_stage_ >= 2) {
        // Into the bucket, and the full-size .grad is freed (the next backward makes a new one).
        slice.view(g.sizes()).copy_(g);
        p.tensor.mutable_grad() = torch::Tensor();
      } else if (g.data_ptr() != slice.data_ptr()) {
        // First step, or the grads were reset to undefined: copy this one in and make .grad
        // alias the bucket from now on. Autograd then accumulates straight into the bucket
        // (in place, as it does for a defined .grad) and the averaged result lands in .grad
        // without a copy either way (PyTorch DDP's gradient_as_bucket_view).
        slice.view(g.sizes()).copy_(g);
        p.tensor.mutable_grad() = bucket_alias(b.buffer, p.offset, p.tensor.sizes());
      }
      flags[static_cast<size_t>(k)] = 1.0f;
    } else {
      slice.zero_();
    }
  }
  // Stage 3: the block's gradients are in the bucket now, and backward has no more use for its
  // parameters (every node reading them ran before their gradient accumulators fired).
  if (zero_stage_ == 3) release_locked(b);
  b.all_local = std::all_of(flags.begin(), flags.end(), [](float f) { return f > 0; });
  // Written on the device without a host round trip. Why: a copy from pageable host memory is
  // a blocking cudaMemcpy that drains the compute stream, from inside the autograd hook, once per
  // bucket per step. All flags set (the usual case) or none: one fill. A mix: a copy from pinned
  // memory, queued on the current stream (the caching host allocator keeps the block alive until
  // the copy has run).
  const bool none_local = std::none_of(flags.begin(), flags.end(), [](float f) { return f > 0; });
  if (b.all_local || none_local) {
    flags_view.fill_(b.all_local ? 1.0 : 0.0);
  } else {
    torch::Tensor host = torch::from_blob(flags.data(), {n_params}, torch::kFloat);
    if (flags_view.is_cpu()) {
      flags_view.copy_(host);
    } else {
      flags_view.copy_(host.to(flags_view.scalar_type()).pin_memory(), /*non_blocking=*/true);
    }
  }
  if (zero_stage_ >= 1) {
    // The flags are needed everywhere (which parameters got a gradient), the gradients only in
    // each rank's slice.
    torch::Tensor grads = b.buffer.narrow(0, 0, b.numel);
    // In place: this rank's averaged slice lands on its own slice of the bucket (no second
    // gradient buffer; the rest of the bucket keeps this rank's local sums).
    if (!b.grad_shard.defined()) b.grad_shard = b.buffer.narrow(0, b.shard.begin, b.shard.numel());
    collectives_issued_ += 2;
    {
      trace::Label label(trace_label(b, "flags all-reduce"));
      b.flags_work = comm_->all_reduce_async(flags_view, ReduceOp::kAvg);
    }
    trace::Label label(trace_label(b, "reduce-scatter"));
    b.work = comm_->reduce_scatter_async(grads, b.grad_shard, ReduceOp::kAvg);
  } else {
    collectives_issued_ += 1;
    trace::Label label(trace_label(b, "all-reduce"));
    b.work = comm_->all_reduce_async(b.buffer, ReduceOp::kAvg);
  }
  b.launched = true;
}

void DataParallel::reset_step_locked() {
  for (auto& p : params_) p.ready = false;
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
    if (!b.folded) {  // stage 2, unwinding from an error: this step's sums are void
      for (auto* w : {&b.work, &b.flags_work}) {
        if (!*w) continue;
        try {
          (*w)->wait();  // the backend must be done with the buffer before it goes
        } catch (...) {  // the error being unwound is the one to report
        }
      }
      b.buffer = torch::Tensor();
      b.grad_shard = torch::Tensor();
      b.folded = true;
    }
    b.work.reset();
    b.flags_work.reset();
  }
  next_launch_ = 0;
  in_flight_ = false;
}

void DataParallel::mark_used_locked(const Bucket& b) {
  if (b.all_local) {
    // Every flag was 1 here, so every average is > 0: no read-back (a host sync on a GPU).
    for (size_t i : b.params) params_[i].used = true;
    return;
  }
  const int64_t n_params = static_cast<int64_t>(b.params.size());
  torch::Tensor flags = b.buffer.narrow(0, b.numel, n_params).to(torch::kCPU, torch::kDouble);
  const double* f = flags.data_ptr<double>();
  for (int64_t k = 0; k < n_params; ++k)
    if (f[k] > 0) params_[b.params[k]].used = true;
}

void DataParallel::fold_bucket_locked(Bucket& b) {
  torch::NoGradGuard no_grad;
  b.flags_work->wait();
  b.work->wait();
  mark_used_locked(b);
  if (b.shard.numel() > 0) {
    if (!b.grad_acc.defined()) b.grad_acc = torch::empty({b.shard.numel()}, b.grad_shard.options());
    if (b.acc_valid) b.grad_acc.add_(b.grad_shard);
    else b.grad_acc.copy_(b.grad_shard);
  }
  b.acc_valid = true;
  b.buffer = torch::Tensor();  // the full-size buffer goes (the caching allocator keeps it on a GPU)
  b.grad_shard = torch::Tensor();
  b.work.reset();
  b.flags_work.reset();
  b.folded = true;
}

const torch::Tensor& DataParallel::shard_grad(const Bucket& b) const {
  static const torch::Tensor kNone;
  if (b.shard.numel() == 0) return kNone;
  if (zero_stage_ >= 2) return b.acc_valid ? b.grad_acc : kNone;
  return b.grad_shard;
}

void DataParallel::zero_grad() {
  if (zero_stage_ < 2) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_)
    throw Error("DataParallel::zero_grad while a gradient sync is in flight; call "
                "finish_gradient_sync() after the backward first");
  for (auto& b : buckets_) b.acc_valid = false;
  for (auto& p : params_) p.used = false;
  for (auto& seg : segments_) seg.param.mutable_grad() = torch::Tensor();
}

void DataParallel::finish_gradient_sync() {
  if (local_only_ || (!sync_enabled_.load() && zero_stage_ < 2)) return;
  std::unique_lock<std::mutex> lock(mu_);
  try {
    // Parameters backward did not reach this time: their accumulated .grad (or zeros) is sent.
    for (size_t bi = next_launch_; bi < buckets_.size(); ++bi) {
      for (size_t i : buckets_[bi].params) {
        if (params_[i].ready) continue;
        params_[i].ready = true;
        --buckets_[bi].pending;
      }
    }
    launch_ready_buckets_locked();
    torch::NoGradGuard no_grad;
    if (zero_stage_ >= 1) {
      adopt_params();  // Module::load (a resume) may have replaced the storage
      for (auto& b : buckets_) {
        if (zero_stage_ >= 2) {
          if (!b.folded) fold_bucket_locked(b);  // `used` gathers since zero_grad()
        } else {
          b.flags_work->wait();
          b.work->wait();
          for (size_t i : b.params) params_[i].used = false;  // this step's flags alone
          mark_used_locked(b);
        }
        const torch::Tensor& shard = shard_grad(b);
        for (size_t si : b.segments) {
          ShardSegment& seg = segments_[si];
          const Param& p = params_[segment_param_[si]];
          torch::Tensor& g = seg.param.mutable_grad();
          if (!p.used) {
            g = torch::Tensor();  // no rank had a gradient for it
            continue;
          }
          const int64_t at = p.offset + seg.begin - b.shard.begin;
          const void* want = static_cast<char*>(shard.data_ptr()) +
                             at * static_cast<int64_t>(shard.element_size());
          if (!g.defined() || g.data_ptr() != want) g = bucket_alias(shard, at, {seg.end - seg.begin});
        }
      }
      reset_step_locked();
      return;
    }
    for (auto& b : buckets_) {
      b.work->wait();
      // Every parameter of the bucket had a gradient here, so after the average every flag is
      // > 0 and every .grad already aliases the bucket: nothing to read back. Why it matters:
      // on a GPU the read-back is a host synchronisation per bucket, which would stall the
      // host until NCCL finished instead of letting it queue the optimizer's kernels.
      if (b.all_local) continue;
      const int64_t n_params = static_cast<int64_t>(b.params.size());
      torch::Tensor flags = b.buffer.narrow(0, b.numel, n_params).to(torch::kCPU, torch::kDouble);
      const double* f = flags.data_ptr<double>();
      for (int64_t k = 0; k < n_params; ++k) {
        if (!(f[k] > 0)) continue;  // no rank had a gradient for it
        Param& p = params_[b.params[k]];
        torch::Tensor slice = b.buffer.narrow(0, p.offset, p.tensor.numel());
        torch::Tensor& g = p.tensor.mutable_grad();
        // Usually .grad already aliases the bucket (launch made it so); a parameter that had no
        // gradient here but had one on another rank gets its alias now.
        if (!g.defined() || g.data_ptr() != slice.data_ptr())
          g = bucket_alias(b.buffer, p.offset, p.tensor.sizes());
      }
    }
  } catch (...) {
    reset_step_locked();
    throw;
  }
  reset_step_locked();
}

}  // namespace mllm
