// The MFU denominator measured on the job's hardware (see mfu.h).
#include "mllm/train/mfu.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "mllm/core/blas.h"
#include "mllm/distributed/communicator.h"
#include "mllm/kernels/cpu/bf16_linear.h"
#include "mllm/train/device.h"

namespace mllm {

namespace {

// Two random [n, n] operands of `dtype` on `device`, drawn from a copy of the device's default
// generator, so the default one (dropout, bit-exact resume) does not move.
std::pair<torch::Tensor, torch::Tensor> random_operands(int64_t n, torch::ScalarType dtype,
                                                        const torch::Device& device) {
  at::Generator gen;
  {
    at::Generator source = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(source.mutex());
    gen = source.clone();
  }
  const auto opts = torch::TensorOptions().dtype(dtype).device(device);
  torch::Tensor a = torch::randn({n, n}, gen, opts);
  torch::Tensor b = torch::randn({n, n}, gen, opts);
  return {a, b};
}

// The best time (seconds) of each product over `timed` rounds, after `warmups` rounds; each
// round runs the products in turn, `device` synchronized around each.
std::vector<double> best_seconds(const std::vector<std::function<void()>>& products, int warmups,
                                 int timed, const torch::Device& device) {
  for (int i = 0; i < warmups; ++i)
    for (const auto& product : products) product();
  synchronize(device);
  std::vector<double> best_s(products.size(), 1e30);
  for (int i = 0; i < timed; ++i)
    for (size_t k = 0; k < products.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      products[k]();
      synchronize(device);
      best_s[k] = std::min(
          best_s[k], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  return best_s;
}

}  // namespace

double measure_peak_flops(bool bf16, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const int64_t n = device.is_cuda() ? 8192 : 2048;
  // Random operands, as the model's are: a GPU multiplies constant ones faster (fewer toggling
  // bits; an H200's 8192^3 bf16 product ran 894 TFLOP/s on zeros, 788 on random data), which
  // would inflate the peak and deflate MFU.
  const auto operands = random_operands(n, bf16 ? torch::kBFloat16 : torch::kFloat32, device);
  const torch::Tensor& a = operands.first;
  const torch::Tensor& b = operands.second;
  // Warm-up: thread pool, oneDNN / cuBLAS handles and kernels, and a GPU's clocks ramping up
  // (a few ms on an H200, so a few more products there).
  const double best_s =
      best_seconds({[&] { torch::mm(a, b); }}, device.is_cuda() ? 3 : 1, 5, device)[0];
  return 2.0 * n * n * n / best_s;
}

CpuGemmRates measure_cpu_gemm_rates(bool bf16, bool mkl_bf16) {
  torch::NoGradGuard no_grad;
  const int n = 2048;
  const torch::Device cpu(torch::kCPU);
  const GemmBf16Bf16F32 gemm = mkl_bf16 ? mkl_gemm_bf16bf16f32() : nullptr;
  const auto operands = random_operands(n, torch::kFloat32, cpu);
  const torch::Tensor& a = operands.first;
  const torch::Tensor& b = operands.second;
  torch::Tensor a16, b16;  // bf16 copies of the same operands, for the two bf16 products
  if (bf16 || gemm != nullptr) {
    a16 = a.to(torch::kBFloat16);
    b16 = b.to(torch::kBFloat16);
  }
  const torch::Tensor c = gemm != nullptr ? torch::empty({n, n}, torch::kFloat32) : torch::Tensor();
  std::vector<std::function<void()>> products{[&] { torch::mm(a, b); }};
  if (bf16) products.emplace_back([&] { torch::mm(a16, b16); });
  if (gemm != nullptr)
    products.emplace_back([&] {
      gemm(cblas::kRowMajor, cblas::kNoTrans, cblas::kNoTrans, n, n, n, 1.0f, a16.const_data_ptr(),
           n, b16.const_data_ptr(), n, 0.0f, c.data_ptr<float>(), n);
    });
  const std::vector<double> best_s = best_seconds(products, 1, 5, cpu);
  const double flop = 2.0 * n * n * n;
  CpuGemmRates r;
  r.fp32 = flop / best_s[0];
  if (bf16) r.bf16 = flop / best_s[1];
  if (gemm != nullptr) r.mkl_bf16 = flop / best_s.back();
  return r;
}

namespace {

// Whether the ranks on this process's node are bound to pairwise disjoint CPU sets (mpirun's
// default --bind-to core for up to 2 ranks and --bind-to socket above, srun --cpu-bind): then each
// rank has cores that no other rank of the node can use, and no single rank can time the
// node. Collective; every rank of a node gets the same answer; false for a rank alone on its node.
bool node_ranks_bound_apart(Communicator& comm) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  cpu_set_t mine;
  CPU_ZERO(&mine);
  sched_getaffinity(0, sizeof(mine), &mine);
  std::string placement(host);  // the node's name, a NUL, the affinity mask's bytes
  placement.push_back('\0');
  placement.append(reinterpret_cast<const char*>(&mine), sizeof(mine));
  const std::vector<std::string> all = comm.all_gather(placement);
  std::vector<cpu_set_t> node;
  for (const std::string& p : all) {
    if (p.size() != placement.size() || std::strcmp(p.c_str(), host) != 0) continue;
    cpu_set_t set;
    std::memcpy(&set, p.data() + p.size() - sizeof(set), sizeof(set));
    node.push_back(set);
  }
  if (node.size() < 2) return false;
  for (size_t i = 0; i < node.size(); ++i)
    for (size_t j = i + 1; j < node.size(); ++j) {
      cpu_set_t both;
      CPU_AND(&both, &node[i], &node[j]);
      if (CPU_COUNT(&both) > 0) return false;
    }
  return true;
}

}  // namespace

JobPeak measure_job_peak_flops(Communicator& comm, bool bf16, const torch::Device& device) {
  const char* dtype = bf16 ? "bf16" : "fp32";
  JobPeak peak;
  double mine = 0, mine_fp32 = 0, mine_bf16 = 0, mine_mkl_bf16 = 0;
  bool measures = false;
  std::string where;
  const char* unit = "GPU(s)";
  comm.barrier();  // nobody is still building: the measurement has the node to itself
  if (device.is_cuda()) {
    // One rank per GPU (rank_device: cuda:(local_rank % GPUs)), all at once: GPUs share nothing.
    measures = comm.local_rank() < std::max(1, visible_gpus());
    if (measures) mine = measure_peak_flops(bf16, device);
    where = fmt::format("on each GPU in use ({})", device.str());
  } else {
    // One rank per node with all the node's usable cores; the others sleep in the barrier
    // below (a sleeping wait, mpi_runtime.h), so the GEMM is not sharing the cores with them.
    // Ranks bound to disjoint cores instead all time their own cores at once, as they train
    // (rank 0 alone would time only its share of the node: 2 ranks bound to a core each logged
    // an MFU of 130%).
    const bool bound_apart = node_ranks_bound_apart(comm);
    const int cores = usable_cpus();
    measures = bound_apart || comm.local_rank() == 0;
    if (measures) {
      const int before = at::get_num_threads();
      at::set_num_threads(cores);
      // The other dtype too, to compare the two; bf16 only where it may be the faster one: a CPU
      // without bf16 units runs it through conversions, seconds of start-up for a known answer.
      // oneMKL's bf16 GEMM where a bf16 run's path is chosen from it (choose_bf16_gemm).
      const CpuIsa isa = detect_cpu_isa();
      const CpuGemmRates rates = measure_cpu_gemm_rates(
          bf16 || isa.avx512_bf16 || isa.amx_bf16, bf16 && bf16_gemm_choice_reads_mkl_rate());
      mine_fp32 = rates.fp32;
      mine_bf16 = rates.bf16;
      mine_mkl_bf16 = rates.mkl_bf16;
      mine = bf16 ? mine_bf16 : mine_fp32;
      at::set_num_threads(before);
    }
    if (bound_apart)
      where = fmt::format("with {} {} by every rank at once on its own cores (the ranks of a "
                          "node are bound to disjoint cores; rank {} has {})",
                          probe_blas().library, probe_blas().path, comm.rank(), cores);
    else
      where = fmt::format("with {} {} on the {} usable core(s) of each node (affinity and cgroup "
                          "quota), while the node's other ranks waited", probe_blas().library,
                          probe_blas().path, cores);
    unit = bound_apart ? "rank(s)" : "node(s)";
  }
  comm.barrier();
  torch::Tensor sums = torch::tensor({mine, mine_fp32, mine_bf16, mine_mkl_bf16,
                                      measures ? 1.0 : 0.0, mine_mkl_bf16 > 0 ? 1.0 : 0.0},
                                     torch::kFloat64);
  comm.all_reduce(sums, ReduceOp::kSum);
  peak.flops = sums[0].item<double>();
  peak.cpu_fp32_flops = sums[1].item<double>();
  peak.cpu_bf16_flops = sums[2].item<double>();
  const int timed = static_cast<int>(sums[4].item<double>());
  // Only where every timing rank timed oneMKL too, so that it compares with the same nodes'
  // bf16 sum (a job mixing CPUs with and without AMX or avx512_bf16 gets 0).
  if (static_cast<int>(sums[5].item<double>()) == timed)
    peak.cpu_mkl_bf16_flops = sums[3].item<double>();
  peak.nodes = device.is_cuda() ? 0 : timed;
  peak.how = fmt::format("measured {} GEMM (n={}, random operands, best of 5) {}, summed over {} "
                         "{}", dtype, device.is_cuda() ? 8192 : 2048, where, timed, unit);
  return peak;
}

}  // namespace mllm
