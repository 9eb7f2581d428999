// DataParallel, its set-up and what a step asks of it outside backward (data_parallel.h): the
// constructor (buckets planned, autograd hooks registered, ZeRO shards cut), the start-up
// broadcast and model check, the token-count loss normalisation and global-norm clipping, and the
// memory footprint. Its other parts: gradient_buckets.cpp (the buckets' collectives during
// backward), zero_shards.cpp (ZeRO 1-3: the optimizer's parameter shards and their all-gather),
// zero3_units.cpp (stage 3's blocks gathered and freed around their forward and backward).
//
// Collectives issued here, all from the calling (training) thread and waited for before
// returning: broadcast_and_verify an all-gather of the model description's hash and a
// broadcast per parameter and buffer from rank 0 (start-up, and a resume at another world
// size); loss_scale and global_mean_loss one small all-reduce each per optimizer step;
// clip_grad_norm at ZeRO stage 1-3 one all-reduce of the partial sums of squares (stage 0 needs
// none: every rank holds the averaged gradients).
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

std::string DataParallel::trace_label(const Bucket& b, const char* op) const {
  if (!trace::active()) return {};
  if (zero_stage_ == 3)
    return b.unit >= 0 ? fmt::format("block {} {}", b.unit, op) : fmt::format("embeddings+head {}", op);
  return fmt::format("bucket {} {}", &b - buckets_.data(), op);
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
