// DataParallel: start-up broadcast and model check, hook-driven bucketed gradient all-reduce,
// accumulation without communication, token-count loss normalisation, global-norm clipping.
#include "mllm/distributed/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <unordered_set>
#include <vector>

#include <ATen/Parallel.h>

#include <fmt/format.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "mllm/core/error.h"
#include "mllm/core/trace.h"
#include "mllm/distributed/bucket_plan.h"

namespace mllm {
namespace {

std::string shape_str(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? "," : "") + std::to_string(t.size(i));
  return s + "]";
}

// One line per tensor: what every rank must agree on before rank 0's values are copied over.
std::vector<std::string> describe_model(torch::nn::Module& m) {
  std::vector<std::string> lines;
  for (const auto& kv : m.named_parameters(true))
    lines.push_back(fmt::format("parameter {} {} {}{}", kv.key(), c10::toString(kv.value().scalar_type()),
                                shape_str(kv.value()),
                                kv.value().requires_grad() ? "" : " (frozen)"));
  for (const auto& kv : m.named_buffers(true))
    lines.push_back(fmt::format("buffer {} {} {}", kv.key(), c10::toString(kv.value().scalar_type()),
                                shape_str(kv.value())));
  return lines;
}

// FNV-1a 64 (Fowler/Noll/Vo): a stable, dependency-free hash; collisions are not a security
// concern here, only accidental mismatches.
std::string fnv1a_hex(const std::vector<std::string>& lines) {
  uint64_t h = 1469598103934665603ULL;
  for (const auto& l : lines) {
    for (unsigned char c : l) h = (h ^ c) * 1099511628211ULL;
    h = (h ^ '\n') * 1099511628211ULL;
  }
  return fmt::format("{:016x}", h);
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Sum of squares of float32 `p[0, n)` in float64 in a fixed order that depends on n alone:
// blocks of kSquaresBlock elements, each summed in 8 interleaved lanes (element i into lane
// i % 8) combined pairwise, then the blocks' sums in block order. The blocks run in parallel,
// but neither the thread count nor the SIMD width changes a bit of the result (a float's square
// is exact in float64, so a fused multiply-add rounds as a multiply and an add do). The strictly
// serial sum this replaces ran at one add's latency per element: ~50 ms per step for 34M
// parameters, 5% of the small shape's bf16 step (issue 32).
constexpr int64_t kSquaresBlock = int64_t{1} << 16;

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
double block_squares(const float* __restrict p, int64_t n) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += static_cast<double>(p[i + j]) * static_cast<double>(p[i + j]);
  for (int j = 0; i + j < n; ++j) lane[j] += static_cast<double>(p[i + j]) * static_cast<double>(p[i + j]);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

double float_squares(const float* p, int64_t n) {
  const int64_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  std::vector<double> sums(static_cast<size_t>(blocks), 0.0);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      sums[b] = block_squares(p + b * kSquaresBlock, std::min(kSquaresBlock, n - b * kSquaresBlock));
  });
  double acc = 0.0;
  for (double s : sums) acc += s;
  return acc;
}

// Sum of squares in float64, in a fixed order for CPU tensors (float_squares for float32,
// element order for float64), so every rank (whatever its thread count) gets the same bits
// from the same gradient.
double sum_of_squares(const torch::Tensor& g) {
  if (g.device().is_cpu() && (g.scalar_type() == torch::kFloat || g.scalar_type() == torch::kDouble)) {
    torch::Tensor c = g.contiguous();
    const int64_t n = c.numel();
    if (c.scalar_type() == torch::kFloat) return float_squares(c.data_ptr<float>(), n);
    double acc = 0.0;
    const double* p = c.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) acc += p[i] * p[i];
    return acc;
  }
  return g.detach().to(torch::kDouble).square().sum().item<double>();
}

// Sum of squares of every defined tensor in `ts`, in order: CPU tensors with sum_of_squares,
// GPU ones summed on the device and read back once.
double total_squares(const std::vector<torch::Tensor>& ts) {
  double sq = 0.0;
  torch::Tensor device_sq;
  for (const auto& g : ts) {
    if (!g.defined()) continue;
    if (g.device().is_cpu()) {
      sq += sum_of_squares(g);
    } else {
      torch::NoGradGuard no_grad;
      torch::Tensor s = g.detach().to(torch::kDouble).square().sum();
      device_sq = device_sq.defined() ? device_sq + s : s;
    }
  }
  if (device_sq.defined()) sq += device_sq.item<double>();
  return sq;
}

// `sizes` elements of `buffer` from element `offset`, as a tensor of its own rather than an
// autograd view: optimizers' zero_grad() calls detach_() on .grad, which views refuse. The
// deleter holds a reference, so the bucket lives as long as any gradient aliasing it.
torch::Tensor bucket_alias(const torch::Tensor& buffer, int64_t offset, at::IntArrayRef sizes) {
  void* ptr = static_cast<char*>(buffer.data_ptr()) + offset * static_cast<int64_t>(buffer.element_size());
  torch::Tensor keep = buffer;
  return torch::from_blob(ptr, sizes, [keep](void*) {}, buffer.options().requires_grad(false));
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> model,
                           std::shared_ptr<Communicator> comm, int64_t bucket_bytes, int zero_stage,
                           std::function<int64_t(const std::string&)> unit_of)
    : model_(std::move(model)), comm_(std::move(comm)), bucket_bytes_(bucket_bytes),
      zero_stage_(zero_stage) {
  if (zero_stage_ < 0 || zero_stage_ > 3)
    throw Error(fmt::format("DataParallel: zero_stage must be 0, 1, 2 or 3, got {} "
                            "(dist.zero_stage)", zero_stage_));
  if (zero_stage_ == 3 && !unit_of)
    throw Error("DataParallel: zero_stage 3 needs to know which block each parameter belongs to "
                "(unit_of)");
  if (!model_) throw Error("DataParallel: model is null");
  if (!comm_) throw Error("DataParallel: communicator is null");
  if (bucket_bytes_ <= 0)
    throw Error(fmt::format("DataParallel: bucket size must be positive, got {} bytes "
                            "(dist.bucket_mb)", bucket_bytes_));
  std::unordered_set<const void*> seen;  // tied weights appear under two names
  for (const auto& kv : model_->named_parameters(true)) {
    const torch::Tensor& p = kv.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    params_.push_back(Param{kv.key(), p});
  }
  // Reverse registration order: backward produces the last layers' gradients first.
  std::vector<BucketTensor> specs;
  std::vector<size_t> order;
  for (size_t i = params_.size(); i-- > 0;) {
    const auto& p = params_[i].tensor;
    specs.push_back({p.numel() * static_cast<int64_t>(p.element_size()), p.scalar_type(), p.device()});
    order.push_back(i);
  }
  std::vector<std::vector<size_t>> plan;
  std::vector<int64_t> plan_units;
  if (zero_stage_ == 3) {
    // One bucket per block, the last block first (backward's order), the root unit last (the
    // token table's gradient is backward's last).
    std::map<int64_t, std::vector<size_t>> by_unit;
    for (size_t m = 0; m < order.size(); ++m) {
      const int64_t u = unit_of(params_[order[m]].name);
      by_unit[u < 0 ? -1 : u].push_back(m);
    }
    for (auto it = by_unit.rbegin(); it != by_unit.rend(); ++it) {
      const auto& first = specs[it->second.front()];
      for (size_t m : it->second)
        if (specs[m].dtype != first.dtype || specs[m].device != first.device)
          throw Error(fmt::format("DataParallel: zero_stage 3 gathers each block's parameters "
                                  "as one flat buffer, but parameter '{}' differs in dtype or "
                                  "device from the rest of its block", params_[order[m]].name));
      plan.push_back(it->second);
      plan_units.push_back(it->first);
    }
  } else {
    plan = plan_buckets(specs, bucket_bytes_);
  }
  for (size_t bi = 0; bi < plan.size(); ++bi) {
    const auto& members = plan[bi];
    Bucket b;
    for (size_t m : members) {
      Param& p = params_[order[m]];
      p.bucket = buckets_.size();
      p.offset = b.numel;
      b.numel += p.tensor.numel();
      b.params.push_back(order[m]);
    }
    b.pending = static_cast<int>(b.params.size());
    if (zero_stage_ == 3) {
      b.unit = plan_units[bi];
      if (b.unit < 0) {
        root_bucket_ = buckets_.size();
      } else {
        if (static_cast<int64_t>(block_bucket_.size()) <= b.unit)
          block_bucket_.resize(static_cast<size_t>(b.unit) + 1, SIZE_MAX);
        block_bucket_[static_cast<size_t>(b.unit)] = buckets_.size();
      }
    }
    buckets_.push_back(std::move(b));
  }
  if (zero_stage_ >= 1) {
    // This rank's slice of each flat bucket, cut at parameter boundaries into segments.
    const int world = comm_->world_size(), rank = comm_->rank();
    for (auto& b : buckets_) {
      b.shard = shard_range(b.numel, world, rank);  // grad_shard: set at the first launch
      for (size_t i : b.params) {
        const Param& p = params_[i];
        const int64_t lo = std::max(b.shard.begin, p.offset);
        const int64_t hi = std::min(b.shard.end, p.offset + p.tensor.numel());
        if (lo >= hi) continue;
        ShardSegment seg;
        seg.name = p.name;
        seg.begin = lo - p.offset;
        seg.end = hi - p.offset;
        seg.param_numel = p.tensor.numel();
        seg.param = torch::empty({0}, p.tensor.options().requires_grad(false));
        b.segments.push_back(segments_.size());
        segments_.push_back(std::move(seg));
        segment_param_.push_back(i);
      }
    }
    adopt_params();
    // Stage 3: the parameters stay whole, as this rank built them, until broadcast_and_verify
    // (or the first forward) ends this first FullParams scope: a broadcast must send rank 0's
    // own values, not a gather of every rank's slices of different initialisations.
    if (zero_stage_ == 3) {
      full_params_ = 1;
      initial_full_ = true;
    }
  }
  // One rank: the averaged gradient is the local one. Why skip the buckets too: on a GPU each
  // bucket would cost a copy of every fresh .grad (the trainer resets them to undefined) and an
  // all-reduce of ~4 bytes per parameter per step for nothing.
  local_only_ = comm_->world_size() == 1 && zero_stage_ == 0;
  if (local_only_) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i].tensor);
    MLLM_CHECK(acc, "no gradient accumulator for parameter " + params_[i].name);
    auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list&) {
          on_grad_ready(i);
          return outputs;
        }));
    hooks_.emplace_back(std::move(acc), key);
  }
}

DataParallel::~DataParallel() {
  for (auto& h : hooks_) h.first->del_post_hook(h.second);
  // Buckets still in flight (an exception unwound past finish_gradient_sync) keep their buffers
  // alive through their Work handles; wait so the backend does not outlive what it writes into.
  for (auto& b : buckets_) {
    for (auto* w : {&b.work, &b.gather_work}) {
      if (!*w) continue;
      try {
        (*w)->wait();
      } catch (...) {
      }
    }
  }
}

void DataParallel::broadcast_and_verify() {
  wait_params();
  FullParams full(*this);  // stage 3: rank 0's values reach the shards when the scope ends
  const int world = comm_->world_size();
  const auto lines = describe_model(*model_);
  const std::string mine = fmt::format("{} ({} tensors)", fnv1a_hex(lines), lines.size());
  collectives_issued_ += 1;
  const auto all = comm_->all_gather(mine);
  std::vector<int> differ;
  for (int r = 1; r < world; ++r)
    if (all[r] != all[0]) differ.push_back(r);
  if (!differ.empty()) {
    // Every rank saw the same hashes, so every rank takes this branch and joins this gather.
    collectives_issued_ += 1;
    const auto texts = comm_->all_gather(join_lines(lines));
    const auto ref = split_lines(texts[0]);
    std::string detail;
    for (int r : differ) {
      const auto other = split_lines(texts[r]);
      size_t i = 0;
      while (i < ref.size() && i < other.size() && ref[i] == other[i]) ++i;
      const std::string a = i < ref.size() ? ref[i] : "(nothing more)";
      const std::string b = i < other.size() ? other[i] : "(nothing more)";
      detail += fmt::format("\n  rank {}: model hash {}; first difference at tensor {}: rank 0 has "
                            "'{}', rank {} has '{}'",
                            r, all[r], i, a, r, b);
    }
    std::string ranks;
    for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    throw CommError(fmt::format(
        "{} {} built a different model than rank 0 (rank 0: model hash {}).{}\nEvery rank must "
        "build the model from the same recipe and plugins; check overrides and the plugins: list.",
        differ.size() == 1 ? "rank" : "ranks", ranks, all[0], detail));
  }

  // Rank 0's values, coalesced into flat buffers of at most bucket_bytes per dtype.
  std::vector<torch::Tensor> tensors;
  for (const auto& kv : model_->named_parameters(true)) tensors.push_back(kv.value());
  for (const auto& kv : model_->named_buffers(true)) tensors.push_back(kv.value());
  std::vector<BucketTensor> specs;
  for (const auto& t : tensors)
    specs.push_back({t.numel() * static_cast<int64_t>(t.element_size()), t.scalar_type(), t.device()});
  if (world == 1) {  // rank 0's values are already in place
    end_initial_full();
    return;
  }
  torch::NoGradGuard no_grad;
  for (const auto& group : plan_buckets(specs, bucket_bytes_)) {
    std::vector<torch::Tensor> flat_parts;
    for (size_t i : group) flat_parts.push_back(tensors[i].detach().reshape({-1}));
    torch::Tensor flat = torch::cat(flat_parts);
    collectives_issued_ += 1;
    comm_->broadcast(flat, 0);
    int64_t off = 0;
    for (size_t i : group) {
      auto& t = tensors[i];
      t.detach().copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
  end_initial_full();
}

void DataParallel::end_initial_full() {
  if (!initial_full_) return;
  initial_full_ = false;
  end_full_params();
}

double DataParallel::loss_scale(int64_t local_real_tokens, int64_t* global_real_tokens) {
  if (local_real_tokens < 0)
    throw Error(fmt::format("loss_scale: negative real-token count {}", local_real_tokens));
  torch::Tensor t = torch::tensor({local_real_tokens}, torch::kLong);
  collectives_issued_ += 1;
  comm_->all_reduce(t, ReduceOp::kSum);
  const int64_t global = t.item<int64_t>();
  if (global_real_tokens) *global_real_tokens = global;
  if (global == 0) return 0.0;
  return static_cast<double>(comm_->world_size()) / static_cast<double>(global);
}

double DataParallel::global_mean_loss(double local_loss_sum, int64_t global_real_tokens) {
  torch::Tensor t = torch::tensor({local_loss_sum}, torch::kDouble);
  collectives_issued_ += 1;
  comm_->all_reduce(t, ReduceOp::kSum);
  if (global_real_tokens <= 0) return 0.0;
  return t.item<double>() / static_cast<double>(global_real_tokens);
}

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

double DataParallel::clip_grad_norm(double max_norm) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_)
      throw Error("DataParallel::clip_grad_norm called while a gradient sync is in flight; call "
                  "finish_gradient_sync() first");
  }
  if (zero_stage_ >= 1) {
    // Each rank's slices: partial sums of squares, one all-reduce, the same norm everywhere.
    std::vector<torch::Tensor> slices;
    for (const auto& b : buckets_) slices.push_back(shard_grad(b));
    torch::Tensor total = torch::tensor({total_squares(slices)}, torch::kDouble);
    collectives_issued_ += 1;
    comm_->all_reduce(total, ReduceOp::kSum);
    const double norm = std::sqrt(total.item<double>());
    if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
      torch::NoGradGuard no_grad;
      for (const auto& b : buckets_) {
        torch::Tensor g = shard_grad(b);
        if (g.defined()) g.mul_(max_norm / norm);
      }
    }
    return norm;
  }
  std::vector<torch::Tensor> grads;
  for (const auto& p : params_) grads.push_back(p.tensor.grad());
  const double norm = std::sqrt(total_squares(grads));
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    const double coef = max_norm / norm;
    torch::NoGradGuard no_grad;
    for (auto& p : params_) {
      torch::Tensor g = p.tensor.grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return norm;
}

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

std::string DataParallel::trace_label(const Bucket& b, const char* op) const {
  if (!trace::active()) return {};
  if (zero_stage_ == 3)
    return b.unit >= 0 ? fmt::format("block {} {}", b.unit, op) : fmt::format("embeddings+head {}", op);
  return fmt::format("bucket {} {}", &b - buckets_.data(), op);
}

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

DataParallel::Footprint DataParallel::footprint() const {
  Footprint f;
  for (const auto& p : params_) {
    const int64_t bytes = p.tensor.numel() * static_cast<int64_t>(p.tensor.element_size());
    if (zero_stage_ < 3) f.param_bytes += bytes;  // stage 3: per bucket, below
    // The bucket buffers (at stage 1 the averaged slice is in place); stage 2: below.
    if (zero_stage_ < 2) f.grad_bytes += bytes;
    if (zero_stage_ == 0) f.optimizer_elements += p.tensor.numel();
  }
  std::vector<int64_t> bucket_bytes, gathered_bytes;
  for (const auto& b : buckets_) {
    if (local_only_) break;  // .grad alone, no buckets
    const int64_t elem = static_cast<int64_t>(params_[b.params.front()].tensor.element_size());
    const int64_t flags = static_cast<int64_t>(b.params.size()) * elem;  // the "used" flags
    if (zero_stage_ == 3) {
      f.param_bytes += b.shard.numel() * elem;
      if (b.unit < 0) f.transient_param_bytes += b.numel * elem;  // gathered all step long
      else gathered_bytes.push_back(b.numel * elem);
    }
    if (zero_stage_ >= 2) {
      f.grad_bytes += b.shard.numel() * elem;  // the gradient shard
      bucket_bytes.push_back(b.numel * elem + flags);
    } else {
      f.grad_bytes += flags;
    }
    if (zero_stage_ >= 1) f.optimizer_elements += b.shard.numel();
  }
  std::sort(bucket_bytes.rbegin(), bucket_bytes.rend());
  for (size_t k = 0; k < bucket_bytes.size() && k < 2; ++k) f.transient_grad_bytes += bucket_bytes[k];
  std::sort(gathered_bytes.rbegin(), gathered_bytes.rend());
  for (size_t k = 0; k < gathered_bytes.size() && k < 2; ++k) f.transient_param_bytes += gathered_bytes[k];
  return f;
}

}  // namespace mllm
