// All-reduce throughput by message size: our mpi backend (communication thread + rank-ordered
// reduction) against a plain MPI_Allreduce on the same ranks. Run: mpirun -np 2 mllm_bench_allreduce
// Prints, on rank 0, time per call and bandwidth: algbw = bytes / time, busbw = algbw * 2 (N-1) / N
// (the nccl-tests convention: what each rank's links carry for a ring all-reduce).
// Options (all optional; without them the sweep and the table are as they always were):
//   --min-bytes B --max-bytes B --factor F   sizes B_min, B_min*F, ... <= B_max (4 KiB, 64 MiB, 4)
//   --target-ms T   time each measurement for about T ms, at least 3 calls (300)
//   --reps R        repeat every measurement R times, interleaved over sizes (1)
//   --which W       mllm | mpi | both (both)
//   --csv PATH      also write one CSV row per measurement (rank 0):
//                   impl,np,bytes,rep,iters,seconds (seconds per call, slowest rank)
// bench/scaling/measure.sh drives it over world sizes for the scaling model (docs/scaling.md).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>


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

struct Options {
  int64_t min_bytes = 4 << 10, max_bytes = int64_t{64} << 20, factor = 4;
  double target_ms = 300;
  int reps = 1;
  bool ours = true, ref = true;
  std::string csv;
};

// Exits with status 2 and a message on a bad option (every rank parses the same argv).
Options parse(int argc, char** argv) {
  Options o;
  auto fail = [](const std::string& msg) {
    // Every rank parses argv before MPI starts; only the first (or a lone process) says why.
    const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
    if (r == nullptr || std::strcmp(r, "0") == 0) std::fprintf(stderr, "mllm_bench_allreduce: %s\n", msg.c_str());
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(a + " needs a value");
      return argv[++i];
    };
    auto number = [&](const std::string& v) -> double {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(x > 0)) fail(a + ": not a positive number: " + v);
      return x;
    };
    if (a == "--min-bytes") o.min_bytes = static_cast<int64_t>(number(value()));
    else if (a == "--max-bytes") o.max_bytes = static_cast<int64_t>(number(value()));
    else if (a == "--factor") o.factor = static_cast<int64_t>(number(value()));
    else if (a == "--target-ms") o.target_ms = number(value());
    else if (a == "--reps") o.reps = static_cast<int>(number(value()));
    else if (a == "--csv") o.csv = value();
    else if (a == "--which") {
      const std::string w = value();
      if (w != "mllm" && w != "mpi" && w != "both") fail("--which: mllm, mpi or both, not " + w);
      o.ours = w != "mpi";
      o.ref = w != "mllm";
    } else {
      fail("unknown option " + a + " (see the comment at the top of bench/allreduce_bench.cpp)");
    }
  }
  if (o.min_bytes < 4 || o.min_bytes % 4 != 0 || o.max_bytes < o.min_bytes || o.factor < 2)
    fail("need --min-bytes a multiple of 4 (float32), --min-bytes <= --max-bytes, --factor >= 2");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  mllm::DistConfig cfg;
  cfg.backend = "mpi";
  auto comm = mllm::make_communicator(cfg);
  auto* mpi = dynamic_cast<mllm::MpiCommunicator*>(comm.get());
  const int n = comm->world_size();
  at::set_num_threads(1);
  FILE* csv = nullptr;
  if (comm->rank() == 0 && !opt.csv.empty()) {
    csv = std::fopen(opt.csv.c_str(), "w");
    if (csv != nullptr) std::fprintf(csv, "impl,np,bytes,rep,iters,seconds\n");
  }
  // Every rank learns whether rank 0 could open the CSV, so all stop together if not.
  if (!opt.csv.empty() && comm->all_gather(int64_t{csv != nullptr})[0] == 0) {
    if (comm->rank() == 0) std::fprintf(stderr, "mllm_bench_allreduce: cannot write %s\n", opt.csv.c_str());
    return 1;
  }
  if (comm->rank() == 0) {
    std::printf("all-reduce (sum, float32), %d ranks\n", n);
    std::printf("%10s | %10s %9s %9s | %10s %9s %9s | %6s\n", "bytes", "mllm us", "algbw", "busbw",
                "MPI us", "algbw", "busbw", "ratio");
  }
  for (int rep = 0; rep < opt.reps; ++rep) {
    for (int64_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= opt.factor) {
      const int64_t count = bytes / 4;
      auto t = torch::ones({count});
      std::vector<float> plain(static_cast<size_t>(count), 1.0f);
      // About target_ms per measurement at ~1 GB/s (0.3 s by default), at least 3 calls.
      const auto budget = static_cast<int64_t>(opt.target_ms * static_cast<double>(1 << 20)) / bytes;
      const int iters = static_cast<int>(std::max<int64_t>(3, std::min<int64_t>(2000, budget)));
      double ours = 0, ref = 0;
      if (opt.ours)
        ours = time_per_call(*comm, iters, [&] { comm->all_reduce(t, mllm::ReduceOp::kSum); });
      if (opt.ref)
        ref = time_per_call(*comm, iters, [&] {
          MPI_Allreduce(MPI_IN_PLACE, plain.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                        mpi->mpi_comm());
        });
      if (comm->rank() == 0) {
        const double bus = 2.0 * (n - 1) / n;
        auto us = [](double s) { return s * 1e6; };
        auto gbs = [&](double s) { return s > 0 ? bytes / s / 1e9 : 0.0; };
        if (opt.ours && opt.ref)
          std::printf("%10lld | %10.1f %8.2fG %8.2fG | %10.1f %8.2fG %8.2fG | %6.2f\n",
                      static_cast<long long>(bytes), us(ours), gbs(ours), gbs(ours) * bus, us(ref),
                      gbs(ref), gbs(ref) * bus, ours / ref);
        else if (opt.ours)
          std::printf("%10lld | %10.1f %8.2fG %8.2fG | %10s %9s %9s | %6s\n",
                      static_cast<long long>(bytes), us(ours), gbs(ours), gbs(ours) * bus, "-", "-",
                      "-", "-");
        else
          std::printf("%10lld | %10s %9s %9s | %10.1f %8.2fG %8.2fG | %6s\n",
                      static_cast<long long>(bytes), "-", "-", "-", us(ref), gbs(ref),
                      gbs(ref) * bus, "-");
        if (csv != nullptr) {
          if (opt.ours)
            std::fprintf(csv, "mllm,%d,%lld,%d,%d,%.9g\n", n, static_cast<long long>(bytes), rep,
                         iters, ours);
          if (opt.ref)
            std::fprintf(csv, "mpi,%d,%lld,%d,%d,%.9g\n", n, static_cast<long long>(bytes), rep,
                         iters, ref);
          std::fflush(csv);
        }
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
