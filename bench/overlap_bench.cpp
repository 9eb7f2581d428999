// How much of the gradient all-reduce DataParallel hides behind backward, on a d512/8-layer
// decoder stand-in (torch::nn layers with the parameter shapes of a GPT block: LayerNorm, qkv
// and output projections, 4x MLP; token + position embeddings, untied head).
// Run: mpirun -np 2 mllm_bench_overlap [vocab=8000] [batch=2] [seq=128] [iters=4] [bucket_mb=25]
// Per iteration, on every rank:
//   T_bwd   backward with sync off (no communication),
//   T_comm  the same gradients all-reduced alone (sync on after backward: finish launches all),
//   T_total backward with sync on + finish_gradient_sync (hooks launch buckets as they fill).
// hidden = (T_bwd + T_comm - T_total) / T_comm: 1 = communication entirely behind backward.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "mllm/distributed/communicator.h"
#include "mllm/distributed/data_parallel.h"

using Clock = std::chrono::steady_clock;

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t heads) : heads(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc = register_module("fc", torch::nn::Linear(d, 4 * d));
    out = register_module("out", torch::nn::Linear(4 * d, d));
  }
  // x [batch, seq, d] -> [batch, seq, d]; causal multi-head attention + GELU MLP.
  torch::Tensor forward(torch::Tensor x) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
    auto q_k_v = qkv(ln1(x)).chunk(3, -1);
    auto split = [&](const torch::Tensor& y) { return y.view({b, t, heads, hd}).transpose(1, 2); };
    auto q = split(q_k_v[0]), k = split(q_k_v[1]), v = split(q_k_v[2]);
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto mask = torch::ones({t, t}, torch::kBool).triu(1);
    att = torch::softmax(att.masked_fill(mask, -1e9), -1);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, d});
    x = x + proj(y);
    return x + out(torch::gelu(fc(ln2(x))));
  }
  int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
};
TORCH_MODULE(Block);

struct StandInImpl : torch::nn::Module {
  StandInImpl(int64_t vocab, int64_t seq, int64_t d, int64_t layers, int64_t heads) {
    tok = register_module("tok", torch::nn::Embedding(vocab, d));
    pos = register_module("pos", torch::nn::Embedding(seq, d));
    for (int64_t i = 0; i < layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), Block(d, heads)));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(d, vocab).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    auto x = tok(idx) + pos(torch::arange(idx.size(1), torch::kLong));
    for (auto& b : blocks) x = b(x);
    return head(ln_f(x));
  }
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(StandIn);

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t def) { return argc > i ? std::atoll(argv[i]) : def; };
  const int64_t vocab = arg(1, 8000), batch = arg(2, 2), seq = arg(3, 128), iters = arg(4, 4);
  const int64_t bucket_mb = arg(5, 25);
  mllm::DistConfig cfg;
  cfg.backend = "auto";
  auto comm = mllm::make_communicator(cfg);
  const int rank = comm->rank(), n = comm->world_size();
  // One intra-op thread per rank: the ranks share the machine's cores.
  at::set_num_threads(1);
  torch::manual_seed(0);
  auto model = StandIn(vocab, seq, 512, 8, 8);
  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  mllm::DataParallel dp(model.ptr(), comm, bucket_mb << 20);
  dp.broadcast_and_verify();
  auto idx = torch::randint(1, vocab, {batch, seq}, torch::kLong);
  auto targets = torch::randint(1, vocab, {batch, seq}, torch::kLong);
  auto loss_of = [&] {
    return torch::nn::functional::cross_entropy(model->forward(idx).view({-1, vocab}),
                                                targets.view({-1}));
  };
  if (rank == 0)
    std::printf("d512/8-layer stand-in: %.1f M parameters (%.0f MB fp32 gradients), %d ranks, "
                "%lld buckets of <= %lld MiB, batch %lld x %lld tokens, 1 thread/rank\n",
                n_params / 1e6, n_params * 4 / 1e6, n, static_cast<long long>(dp.num_buckets()),
                static_cast<long long>(bucket_mb), static_cast<long long>(batch),
                static_cast<long long>(seq));
  double sum_bwd = 0, sum_comm = 0, sum_total = 0, sum_tail = 0;
  for (int64_t it = -1; it < iters; ++it) {  // it = -1: warm-up
    // T_bwd: backward without communication.
    model->zero_grad();
    dp.set_sync(false);
    auto loss = loss_of();
    comm->barrier();
    auto t0 = Clock::now();
    loss.backward();
    const double t_bwd = seconds_since(t0);
    // T_comm: those gradients all-reduced on their own (finish launches every bucket).
    dp.set_sync(true);
    comm->barrier();
    t0 = Clock::now();
    dp.finish_gradient_sync();
    const double t_comm = seconds_since(t0);
    // T_total: backward with the hooks launching buckets, then the wait for the rest.
    model->zero_grad();
    loss = loss_of();
    comm->barrier();
    t0 = Clock::now();
    loss.backward();
    const auto t1 = Clock::now();
    dp.finish_gradient_sync();
    const double t_total = seconds_since(t0);
    const double t_tail = seconds_since(t1);
    if (it < 0) continue;
    sum_bwd += t_bwd;
    sum_comm += t_comm;
    sum_total += t_total;
    sum_tail += t_tail;
  }
  // Averages over iterations; ranks report the slowest rank's figures.
  auto worst = [&](double x) {
    double w = 0;
    for (double y : comm->all_gather(x / iters)) w = std::max(w, y);
    return w;
  };
  const double bwd = worst(sum_bwd), cm = worst(sum_comm), total = worst(sum_total),
               tail = worst(sum_tail);
  if (rank == 0) {
    const double hidden = (bwd + cm - total) / cm;
    std::printf("T_bwd   %8.1f ms  backward, no communication\n", bwd * 1e3);
    std::printf("T_comm  %8.1f ms  all-reduce of all buckets alone (%.2f GB/s algbw)\n", cm * 1e3,
                n_params * 4 / cm / 1e9);
    std::printf("T_total %8.1f ms  backward with bucketed all-reduce + finish (finish waited %.1f ms)\n",
                total * 1e3, tail * 1e3);
    std::printf("hidden  %8.1f %%   of the communication behind backward = (T_bwd + T_comm - T_total) / T_comm\n",
                100 * hidden);
    // Where the time went: how much of the all-reduce ran while backward was still running, and
    // how much longer backward itself took with the communication thread active (contention for
    // cores and memory bandwidth: on CPU, moving and summing gradients is itself CPU work).
    std::printf("        %8.1f %%   of T_comm ran concurrently with backward = 1 - finish wait / T_comm\n",
                100 * (1 - tail / cm));
    std::printf("        %8.1f ms  backward slowdown while communicating = T_total - finish wait - T_bwd\n",
                (total - tail - bwd) * 1e3);
  }
  return 0;
}
