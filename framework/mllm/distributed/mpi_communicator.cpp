// The mpi backend: every collective is a task on the communication thread; all-reduces use a
// rank-ordered reduction so results are bitwise identical on all ranks and for any bucketing.
#include "mllm/distributed/mpi_communicator.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/distributed/mpi_runtime.h"

namespace mllm {
namespace detail {
namespace {

// MPI calls take int counts; larger buffers go in pieces (element-wise ops, so the result
// does not depend on the split).
constexpr int64_t kMaxPieceElems = int64_t{1} << 28;
constexpr int64_t kMaxBcastPieceBytes = int64_t{1} << 30;

MPI_Datatype mpi_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return MPI_FLOAT;
    case torch::kDouble: return MPI_DOUBLE;
    case torch::kInt: return MPI_INT32_T;
    case torch::kLong: return MPI_INT64_T;
    default: throw Error(fmt::format("mpi backend: no MPI datatype for {}", c10::toString(t)));
  }
}

// out[i] = rows[0][i] op rows[1][i] op ... op rows[world-1][i], left to right (then / world for
// kAvg). `out` may be one of the rows: each block is read completely before it is written.
template <typename T>
void reduce_rows(const std::vector<const void*>& rows, int64_t n, ReduceOp op, T* out) {
  constexpr int64_t kBlock = 2048;  // elements; the accumulator block stays in L1
  T acc[kBlock];
  const int world = static_cast<int>(rows.size());
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    std::memcpy(acc, static_cast<const T*>(rows[0]) + start, static_cast<size_t>(m) * sizeof(T));
    for (int r = 1; r < world; ++r) {
      const T* row = static_cast<const T*>(rows[r]) + start;
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          for (int64_t i = 0; i < m; ++i) acc[i] = acc[i] + row[i];
          break;
        case ReduceOp::kMax:
          for (int64_t i = 0; i < m; ++i) acc[i] = std::max(acc[i], row[i]);
          break;
        case ReduceOp::kMin:
          for (int64_t i = 0; i < m; ++i) acc[i] = std::min(acc[i], row[i]);
          break;
      }
    }
    if (op == ReduceOp::kAvg) {
      const T w = static_cast<T>(world);
      for (int64_t i = 0; i < m; ++i) acc[i] = acc[i] / w;
    }
    std::memcpy(out + start, acc, static_cast<size_t>(m) * sizeof(T));
  }
}

void reduce_rows_typed(const std::vector<const void*>& rows, int64_t n, ReduceOp op, void* out,
                       torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat: return reduce_rows(rows, n, op, static_cast<float*>(out));
    case torch::kDouble: return reduce_rows(rows, n, op, static_cast<double*>(out));
    case torch::kInt: return reduce_rows(rows, n, op, static_cast<int32_t*>(out));
    case torch::kLong: return reduce_rows(rows, n, op, static_cast<int64_t*>(out));
    default: throw Error("mpi backend: unsupported dtype in reduction");
  }
}

void all_reduce_piece(char* data, int64_t n, torch::ScalarType dtype, ReduceOp op, MPI_Comm comm,
                      int rank, int world, std::vector<char>& scratch) {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  const MPI_Datatype dt = mpi_type(dtype);
  if (n * elem <= kAllGatherPathMaxBytes || n < world) {
    scratch.resize(static_cast<size_t>(n * elem * world));
    MPI_Request req;
    check_mpi(MPI_Iallgather(data, static_cast<int>(n), dt, scratch.data(), static_cast<int>(n), dt,
                             comm, &req),
              "MPI_Iallgather (all_reduce)", rank);
    wait_request(&req, "MPI_Iallgather (all_reduce)", rank);
    std::vector<const void*> rows(world);
    for (int r = 0; r < world; ++r) rows[r] = scratch.data() + int64_t{r} * n * elem;
    reduce_rows_typed(rows, n, op, data, dtype);
    return;
  }
  // Slice r = [displs[r], displs[r] + counts[r]) is reduced by rank r.
  std::vector<int> counts(world), displs(world);
  const int64_t base = n / world, rem = n % world;
  int64_t off = 0;
  for (int r = 0; r < world; ++r) {
    counts[r] = static_cast<int>(base + (r < rem ? 1 : 0));
    displs[r] = static_cast<int>(off);
    off += counts[r];
  }
  // This rank's own contribution to its slice is read in place, not sent to itself.
  const int mine = counts[rank];
  std::vector<int> send_counts(counts), recv_counts(world, mine), recv_displs(world);
  send_counts[rank] = 0;
  recv_counts[rank] = 0;
  for (int r = 0; r < world; ++r) recv_displs[r] = r * mine;
  scratch.resize(static_cast<size_t>(int64_t{mine} * world * elem));
  MPI_Request req;
  check_mpi(MPI_Ialltoallv(data, send_counts.data(), displs.data(), dt, scratch.data(),
                           recv_counts.data(), recv_displs.data(), dt, comm, &req),
            "MPI_Ialltoallv (all_reduce)", rank);
  wait_request(&req, "MPI_Ialltoallv (all_reduce)", rank);
  char* my_slice = data + displs[rank] * elem;
  std::vector<const void*> rows(world);
  for (int r = 0; r < world; ++r)
    rows[r] = r == rank ? my_slice : scratch.data() + int64_t{r} * mine * elem;
  reduce_rows_typed(rows, mine, op, my_slice, dtype);
  check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), displs.data(),
                            dt, comm, &req),
            "MPI_Iallgatherv (all_reduce)", rank);
  wait_request(&req, "MPI_Iallgatherv (all_reduce)", rank);
}

// The tensor MPI actually works on: `t` itself when it is a contiguous CPU tensor of an MPI
// dtype, else a contiguous CPU copy (float32 for half types) copied back afterwards.
torch::Tensor staging_for(const torch::Tensor& t) {
  const auto st = t.scalar_type();
  const bool native = st == torch::kFloat || st == torch::kDouble || st == torch::kInt ||
                      st == torch::kLong;
  if (native && t.device().is_cpu() && t.is_contiguous()) return t;
  auto opts = torch::TensorOptions().device(torch::kCPU).dtype(native ? st : torch::kFloat);
  return t.to(opts, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

std::string describe(const char* what, const torch::Tensor& t) {
  return fmt::format("{} of {} {} elements", what, t.numel(), c10::toString(t.scalar_type()));
}

}  // namespace

void rank_ordered_all_reduce(void* data, int64_t count, torch::ScalarType dtype, ReduceOp op,
                             MPI_Comm comm, int rank, int world, std::vector<char>& scratch) {
  if (count == 0) return;
  if (world == 1) {
    // Nothing to combine; kAvg divides by 1.
    return;
  }
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  char* p = static_cast<char*>(data);
  for (int64_t start = 0; start < count; start += kMaxPieceElems) {
    const int64_t n = std::min(kMaxPieceElems, count - start);
    all_reduce_piece(p + start * elem, n, dtype, op, comm, rank, world, scratch);
  }
}

namespace {
// Counts and displacements of the shard_range slices of `count` elements, as MPI ints.
void shard_layout(int64_t count, int world, std::vector<int>& counts, std::vector<int>& displs) {
  if (count > INT_MAX)
    throw Error(fmt::format("mpi backend: a sharded buffer of {} elements is over MPI's int counts "
                            "({}); use smaller buckets (dist.bucket_mb)",
                            count, INT_MAX));
  counts.resize(world);
  displs.resize(world);
  for (int r = 0; r < world; ++r) {
    const ShardRange s = shard_range(count, world, r);
    counts[r] = static_cast<int>(s.numel());
    displs[r] = static_cast<int>(s.begin);
  }
}
}  // namespace

void rank_ordered_reduce_scatter(const void* in, int64_t count, torch::ScalarType dtype, ReduceOp op,
                                 void* out, MPI_Comm comm, int rank, int world,
                                 std::vector<char>& scratch) {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<int> counts, displs;
  shard_layout(count, world, counts, displs);
  const int mine = counts[rank];
  const char* my_slice = static_cast<const char*>(in) + int64_t{displs[rank]} * elem;
  if (world == 1 || count == 0) {
    if (mine > 0 && out != my_slice) std::memmove(out, my_slice, static_cast<size_t>(mine * elem));
    return;
  }
  // As all_reduce_piece's large path: each rank's slice of every buffer goes to its owner, which
  // reduces the rows in rank order (its own row read in place).
  std::vector<int> send_counts(counts), recv_counts(world, mine), recv_displs(world);
  send_counts[rank] = 0;
  recv_counts[rank] = 0;
  for (int r = 0; r < world; ++r) recv_displs[r] = r * mine;
  scratch.resize(static_cast<size_t>(std::max<int64_t>(int64_t{mine} * world * elem, 1)));
  const MPI_Datatype dt = mpi_type(dtype);
  MPI_Request req;
  check_mpi(MPI_Ialltoallv(in, send_counts.data(), displs.data(), dt, scratch.data(),
                           recv_counts.data(), recv_displs.data(), dt, comm, &req),
            "MPI_Ialltoallv (reduce_scatter)", rank);
  wait_request(&req, "MPI_Ialltoallv (reduce_scatter)", rank);
  if (mine == 0) return;
  std::vector<const void*> rows(world);
  for (int r = 0; r < world; ++r)
    rows[r] = r == rank ? static_cast<const void*>(my_slice) : scratch.data() + int64_t{r} * mine * elem;
  reduce_rows_typed(rows, mine, op, out, dtype);
}

void shard_all_gather(const void* in, int64_t count, torch::ScalarType dtype, void* out,
                      MPI_Comm comm, int rank, int world) {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<int> counts, displs;
  shard_layout(count, world, counts, displs);
  char* my_slice = static_cast<char*>(out) + int64_t{displs[rank]} * elem;
  if (world == 1 || count == 0) {
    if (in != my_slice && counts[rank] > 0)
      std::memmove(my_slice, in, static_cast<size_t>(counts[rank] * elem));
    return;
  }
  const MPI_Datatype dt = mpi_type(dtype);
  MPI_Request req;
  if (in == my_slice) {
    check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, counts.data(), displs.data(),
                              dt, comm, &req),
              "MPI_Iallgatherv (all_gather)", rank);
  } else {
    check_mpi(MPI_Iallgatherv(in, counts[rank], dt, out, counts.data(), displs.data(), dt, comm, &req),
              "MPI_Iallgatherv (all_gather)", rank);
  }
  wait_request(&req, "MPI_Iallgatherv (all_gather)", rank);
}

}  // namespace detail

MpiCommunicator::MpiCommunicator(double timeout_s) : timeout_s_(timeout_s) {
  ensure_mpi_initialized();
  run_blocking("communicator set-up (MPI_Comm_dup, MPI_Comm_split_type)", [this] {
    int world_rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup", world_rank);
    // Return codes instead of MPI's default abort, so failures become CommErrors with context.
    detail::check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
                      world_rank);
    detail::check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", world_rank);
    detail::check_mpi(MPI_Comm_size(comm_, &world_), "MPI_Comm_size", world_rank);
    MPI_Comm local = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
                      "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", rank_);
    detail::check_mpi(MPI_Comm_rank(local, &local_rank_), "MPI_Comm_rank(local)", rank_);
    detail::check_mpi(MPI_Comm_size(local, &local_size_), "MPI_Comm_size(local)", rank_);
    detail::check_mpi(MPI_Comm_free(&local), "MPI_Comm_free(local)", rank_);
  });
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ == MPI_COMM_NULL) return;
  try {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      // Queued behind any collective still pending on this communicator (they use its members),
      // and waited for so that none of them outlives it.
      detail::submit_mpi_task("MPI_Comm_free", rank_, timeout_s_, [this] { MPI_Comm_free(&comm_); })
          ->wait();
    }
  } catch (...) {
    // At exit after shutdown began: nothing left to free.
  }
}

void MpiCommunicator::run_blocking(const std::string& what, std::function<void()> body) {
  detail::submit_mpi_task(what, rank_, timeout_s_, std::move(body))->wait();
}

std::shared_ptr<Work> MpiCommunicator::all_reduce_async(torch::Tensor& t, ReduceOp op) {
  detail::check_all_reduce_args(t, op, "mpi");
  count_collective();
  torch::Tensor target = t;
  const std::string what =
      detail::describe(fmt::format("all_reduce({})", reduce_op_name(op)).c_str(), t);
  if (t.device().is_cuda()) {
    // Several ranks sharing a GPU, or no NCCL: staged through pinned host memory. The copy to
    // the host is queued on LibTorch's current stream without blocking this thread (backward
    // goes on); the communication thread waits for it (an event), reduces, and copies back.
    const auto st = t.scalar_type();
    const bool native = st == torch::kFloat || st == torch::kDouble || st == torch::kInt ||
                        st == torch::kLong;
    torch::Tensor host = torch::empty(
        t.sizes(), torch::TensorOptions().dtype(native ? st : torch::kFloat).pinned_memory(true));
    host.copy_(t, /*non_blocking=*/true);
    auto copied = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
    copied->record(c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(t.device()));
    const c10::Device device = t.device();
    return detail::submit_mpi_task(what, rank_, timeout_s_, [=]() mutable {
      // The communication thread's first CUDA call must find this rank's device current, and
      // it stays current (no guard that restores device 0 afterwards): otherwise the event's
      // synchronisation and destruction, here, would create a CUDA context on GPU 0 for every
      // rank, hundreds of MB each on a node of 8 GPUs.
      c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(device);
      copied->synchronize();
      detail::rank_ordered_all_reduce(host.data_ptr(), host.numel(), host.scalar_type(), op,
                                      comm_, rank_, world_, scratch_);
      torch::NoGradGuard no_grad;
      target.copy_(host);  // blocking: done before wait() returns
    });
  }
  torch::Tensor work = detail::staging_for(t);
  return detail::submit_mpi_task(what, rank_, timeout_s_, [=]() mutable {
    detail::rank_ordered_all_reduce(work.data_ptr(), work.numel(), work.scalar_type(), op, comm_,
                                    rank_, world_, scratch_);
    if (!work.is_same(target)) {
      torch::NoGradGuard no_grad;
      target.copy_(work);
    }
  });
}

void MpiCommunicator::all_reduce(torch::Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }

namespace {
// True when MPI can work on `t` in place: a contiguous CPU tensor of an MPI dtype.
bool mpi_native(const torch::Tensor& t) {
  const auto st = t.scalar_type();
  return t.device().is_cpu() && t.is_contiguous() &&
         (st == torch::kFloat || st == torch::kDouble || st == torch::kInt || st == torch::kLong);
}
}  // namespace

std::shared_ptr<Work> MpiCommunicator::reduce_scatter_async(const torch::Tensor& input,
                                                            torch::Tensor& output, ReduceOp op) {
  detail::check_shard_args(input, output, world_, rank_, "reduce_scatter", "mpi");
  detail::check_all_reduce_args(input, op, "mpi");
  count_collective();
  // Blocking copies for CPU staging (other dtypes, devices or strides): the data must be in
  // place before the communication thread reads it.
  torch::Tensor in = detail::staging_for(input);
  torch::Tensor out = mpi_native(output) && output.scalar_type() == in.scalar_type()
                          ? output
                          : torch::empty({output.numel()}, in.options());
  torch::Tensor target = output;
  const std::string what =
      detail::describe(fmt::format("reduce_scatter({})", reduce_op_name(op)).c_str(), input);
  return detail::submit_mpi_task(what, rank_, timeout_s_, [=]() mutable {
    detail::rank_ordered_reduce_scatter(in.data_ptr(), in.numel(), in.scalar_type(), op,
                                        out.data_ptr(), comm_, rank_, world_, scratch_);
    if (!out.is_same(target)) {
      torch::NoGradGuard no_grad;
      target.copy_(out.view(target.sizes()));
    }
  });
}

std::shared_ptr<Work> MpiCommunicator::all_gather_async(const torch::Tensor& input,
                                                        torch::Tensor& output) {
  detail::check_shard_args(output, input, world_, rank_, "all_gather", "mpi");
  count_collective();
  torch::Tensor out = detail::staging_for(output);
  torch::Tensor flat = out.view({-1});
  const ShardRange mine = shard_range(output.numel(), world_, rank_);
  // In place when `input` is `output`'s own slice and MPI works on `output` directly.
  const bool in_place = out.is_same(output) && mine.numel() > 0 && input.is_contiguous() &&
                        input.data_ptr() == flat.narrow(0, mine.begin, mine.numel()).data_ptr();
  torch::Tensor in = in_place ? flat.narrow(0, mine.begin, mine.numel())
                              : input.to(out.options(), /*non_blocking=*/false, /*copy=*/true)
                                    .contiguous()
                                    .view({-1});
  torch::Tensor target = output;
  const std::string what = detail::describe("all_gather", output);
  return detail::submit_mpi_task(what, rank_, timeout_s_, [=]() mutable {
    detail::shard_all_gather(in.data_ptr(), flat.numel(), flat.scalar_type(), flat.data_ptr(),
                             comm_, rank_, world_);
    if (!out.is_same(target)) {
      torch::NoGradGuard no_grad;
      target.copy_(out.view(target.sizes()));
    }
  });
}

void MpiCommunicator::broadcast(torch::Tensor& t, int root) {
  detail::check_root(root, world_, "mpi");
  MLLM_CHECK(t.defined(), "broadcast of an undefined tensor");
  count_collective();
  torch::Tensor work = (t.device().is_cpu() && t.is_contiguous()) ? t : t.to(torch::kCPU).contiguous();
  run_blocking(detail::describe("broadcast", t), [&] {
    char* p = static_cast<char*>(work.data_ptr());
    const int64_t bytes = work.numel() * static_cast<int64_t>(work.element_size());
    for (int64_t start = 0; start < bytes; start += detail::kMaxBcastPieceBytes) {
      const int64_t n = std::min(detail::kMaxBcastPieceBytes, bytes - start);
      detail::check_mpi(MPI_Bcast(p + start, static_cast<int>(n), MPI_BYTE, root, comm_),
                        "MPI_Bcast", rank_);
    }
  });
  if (!work.is_same(t)) {
    torch::NoGradGuard no_grad;
    t.copy_(work);
  }
}

void MpiCommunicator::barrier() {
  count_collective();
  // Non-blocking + wait_request: the ranks waiting here sleep instead of spinning, so a rank
  // that works meanwhile (the node's peak-FLOP/s measurement, train/mfu.h) has the cores.
  run_blocking("barrier", [&] {
    MPI_Request req;
    detail::check_mpi(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", rank_);
    detail::wait_request(&req, "MPI_Ibarrier", rank_);
  });
}

std::vector<int64_t> MpiCommunicator::all_gather(int64_t value) {
  count_collective();
  std::vector<int64_t> out(world_);
  run_blocking("all_gather(int64)", [&] {
    detail::check_mpi(MPI_Allgather(&value, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, comm_),
                      "MPI_Allgather(int64)", rank_);
  });
  return out;
}

std::vector<double> MpiCommunicator::all_gather(double value) {
  count_collective();
  std::vector<double> out(world_);
  run_blocking("all_gather(double)", [&] {
    detail::check_mpi(MPI_Allgather(&value, 1, MPI_DOUBLE, out.data(), 1, MPI_DOUBLE, comm_),
                      "MPI_Allgather(double)", rank_);
  });
  return out;
}

std::vector<std::string> MpiCommunicator::all_gather(const std::string& value) {
  if (value.size() > static_cast<size_t>(INT_MAX / 2))
    throw Error("all_gather(string): string too long for a small-value gather");
  count_collective();
  std::vector<std::string> out(world_);
  run_blocking("all_gather(string)", [&] {
    int len = static_cast<int>(value.size());
    std::vector<int> lens(world_), displs(world_);
    detail::check_mpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_),
                      "MPI_Allgather(string lengths)", rank_);
    int64_t total = 0;
    for (int r = 0; r < world_; ++r) {
      displs[r] = static_cast<int>(total);
      total += lens[r];
    }
    if (total > INT_MAX) throw CommError("all_gather(string): strings too long in total");
    std::vector<char> buf(static_cast<size_t>(std::max<int64_t>(total, 1)));
    detail::check_mpi(MPI_Allgatherv(value.data(), len, MPI_CHAR, buf.data(), lens.data(),
                                     displs.data(), MPI_CHAR, comm_),
                      "MPI_Allgatherv(string)", rank_);
    for (int r = 0; r < world_; ++r) out[r].assign(buf.data() + displs[r], lens[r]);
  });
  return out;
}

}  // namespace mllm
