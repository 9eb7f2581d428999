// All-reduce throughput by message size: our mpi backend (communication thread + rank-ordered
// reduction) against a plain MPI_Allreduce on the same ranks. Run: mpirun -np 2 mllm_bench_allreduce
// Prints, on rank 0, time per call and bandwidth: algbw = bytes / time, busbw = algbw * 2 (N-1) / N
// (the nccl-tests convention: what each rank's links carry for a ring all-reduce).
#include <chrono>
#include <cstdio>


#include "mllm/distributed/communicator.h"
#include "mllm/distributed/mpi_communicator.h"  // brings <mpi.h> (C API only)

using Clock = std::chrono::steady_clock;

namespace {

// Seconds per call, the max over ranks (the collective is as slow as its slowest rank).
template <typename F>
double time_per_call(mllm::Communicator& comm, int iters, F&& call) {
  call();  // warm-up: buffers, scratch, connections
  comm.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) call();
  const double local = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  double worst = 0;
  for (double x : comm.all_gather(local)) worst = std::max(worst, x);
  return worst;
}

}  // namespace

int main() {
  mllm::DistConfig cfg;
  cfg.backend = "mpi";
  auto comm = mllm::make_communicator(cfg);
  auto* mpi = dynamic_cast<mllm::MpiCommunicator*>(comm.get());
  const int n = comm->world_size();
  at::set_num_threads(1);
  if (comm->rank() == 0) {
    std::printf("all-reduce (sum, float32), %d ranks\n", n);
    std::printf("%10s | %10s %9s %9s | %10s %9s %9s | %6s\n", "bytes", "mllm us", "algbw", "busbw",
                "MPI us", "algbw", "busbw", "ratio");
  }
  for (int64_t bytes = 4 << 10; bytes <= (int64_t{64} << 20); bytes *= 4) {
    const int64_t count = bytes / 4;
    auto t = torch::ones({count});
    std::vector<float> plain(static_cast<size_t>(count), 1.0f);
    // About 0.3 s per measurement, at least 3 calls.
    const int iters = static_cast<int>(std::max<int64_t>(3, std::min<int64_t>(2000, (int64_t{300} << 20) / bytes)));
    const double ours = time_per_call(*comm, iters, [&] { comm->all_reduce(t, mllm::ReduceOp::kSum); });
    const double ref = time_per_call(*comm, iters, [&] {
      MPI_Allreduce(MPI_IN_PLACE, plain.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    mpi->mpi_comm());
    });
    if (comm->rank() == 0) {
      const double bus = 2.0 * (n - 1) / n;
      std::printf("%10lld | %10.1f %8.2fG %8.2fG | %10.1f %8.2fG %8.2fG | %6.2f\n",
                  static_cast<long long>(bytes), ours * 1e6, bytes / ours / 1e9,
                  bytes / ours / 1e9 * bus, ref * 1e6, bytes / ref / 1e9, bytes / ref / 1e9 * bus,
                  ours / ref);
    }
  }
  return 0;
}
