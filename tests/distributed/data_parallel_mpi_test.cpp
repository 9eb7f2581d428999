// Issue 5 acceptance under mpirun -np N: one optimizer step at N ranks x K micro-steps equals a
// single process on the same global batch; replicas stay bitwise identical; padded-token
// normalisation; clipping; bucket sizes; no communication on non-final micro-steps; model check.
// Expected values depend on N (the global batch grows with N), so a world of one cannot pass.
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "distributed/mpi_test_util.h"
#include "distributed/tiny_lm.h"
#include "mllm/core/error.h"
#include "mllm/distributed/data_parallel.h"

using namespace mllm;
using mllm::test::Batch;
using mllm::test::make_batch;
using mllm::test::make_tiny_lm;
using mllm::test::TinyLMImpl;
using mllm::test::world;

namespace {

constexpr int64_t kSeqLen = 10, kVocab = 13, kMicro = 2;
constexpr double kLr = 0.5;

struct ModelShape {
  int64_t d_model = 16, d_hidden = 32;
};

// The global batch of N * K * kMicro sequences with 1..10 real targets each.
Batch global_batch(int n, int k) {
  std::vector<int64_t> real;
  for (int64_t i = 0; i < n * k * kMicro; ++i) real.push_back(1 + (i * 5 + 3) % 10);
  return make_batch(real, kSeqLen, kVocab, 1234);
}

// Rank r's micro-batch k of a global batch: rows [(k * N + r) * kMicro, + kMicro).
Batch micro_batch(const Batch& g, int n, int r, int k) {
  return mllm::test::slice(g, (static_cast<int64_t>(k) * n + r) * kMicro, kMicro);
}

// The reference: one process, the whole global batch, torch's mean over real targets, SGD.
std::shared_ptr<TinyLMImpl> reference_step(const Batch& g, ModelShape s) {
  auto ref = make_tiny_lm(11, kVocab, s.d_model, s.d_hidden);
  mllm::test::mean_loss(*ref, g.inputs, g.targets).backward();
  torch::NoGradGuard no_grad;
  for (auto& p : ref->parameters()) p.sub_(kLr * p.grad());
  return ref;
}

struct DpRun {
  std::shared_ptr<TinyLMImpl> model;
  int64_t launched_in_final_backward = 0;
  int64_t buckets = 0;
};

// One optimizer step through DataParallel with K micro-steps; each rank starts from its own
// initialisation, which broadcast_and_verify replaces by rank 0's.
DpRun dp_step(int k_steps, int64_t bucket_bytes, ModelShape s) {
  auto comm = world();
  const int n = comm->world_size(), r = comm->rank();
  DpRun run;
  run.model = make_tiny_lm(11 + 1000 * static_cast<uint64_t>(r), kVocab, s.d_model, s.d_hidden);
  DataParallel dp(run.model, comm, bucket_bytes);
  run.buckets = dp.num_buckets();
  dp.broadcast_and_verify();
  const Batch g = global_batch(n, k_steps);
  int64_t local_tokens = 0;
  for (int k = 0; k < k_steps; ++k) local_tokens += micro_batch(g, n, r, k).real_tokens;
  int64_t global_tokens = 0;
  const double scale = dp.loss_scale(local_tokens, &global_tokens);
  EXPECT_EQ(global_tokens, g.real_tokens);
  for (int k = 0; k < k_steps; ++k) {
    const bool last = k == k_steps - 1;
    dp.set_sync(last);
    const int64_t comm_before = comm->collectives_issued(), dp_before = dp.collectives_issued();
    auto mb = micro_batch(g, n, r, k);
    (mllm::test::summed_loss(*run.model, mb.inputs, mb.targets) * scale).backward();
    if (!last) {
      EXPECT_EQ(comm->collectives_issued(), comm_before) << "micro-step " << k;
      EXPECT_EQ(dp.collectives_issued(), dp_before) << "micro-step " << k;
    } else {
      run.launched_in_final_backward = dp.collectives_issued() - dp_before;
    }
  }
  dp.finish_gradient_sync();
  torch::NoGradGuard no_grad;
  for (auto& p : run.model->parameters()) p.sub_(kLr * p.grad());
  return run;
}

// |got - want| <= 1e-6 * max|want| per tensor (relative to the tensor's scale, fp32).
void expect_params_close(TinyLMImpl& got, TinyLMImpl& want, const std::string& what) {
  auto w = want.named_parameters();
  for (const auto& kv : got.named_parameters()) {
    const auto& ref = w[kv.key()];
    const double tol = 1e-6 * ref.abs().max().item<double>();
    EXPECT_LE((kv.value() - ref).abs().max().item<double>(), tol) << what << " " << kv.key();
  }
}

// Every rank's parameters and gradients have rank 0's bytes.
void expect_bitwise_identical_across_ranks(torch::nn::Module& m) {
  auto comm = world();
  for (const auto& kv : m.named_parameters()) {
    for (const auto& t : {kv.value(), kv.value().grad()}) {
      auto hashes = comm->all_gather(mllm::test::bytes_hash(t));
      for (size_t q = 1; q < hashes.size(); ++q)
        EXPECT_EQ(hashes[q], hashes[0]) << kv.key() << " differs on rank " << q;
    }
  }
}

}  // namespace

TEST(DataParallelMpi, AccumulationMatchesSingleProcess) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  const int n = world()->world_size();
  for (int k : {1, 2}) {  // (N, K) = (2, 1), (2, 2) at np=2; (4, 1), (4, 2) at np=4
    SCOPED_TRACE("N=" + std::to_string(n) + " K=" + std::to_string(k));
    auto ref = reference_step(global_batch(n, k), {});
    auto run = dp_step(k, 1024, {});
    expect_params_close(*run.model, *ref, "after the step:");
    expect_bitwise_identical_across_ranks(*run.model);
    // Every parameter is used, so all buckets went out from the hooks during backward.
    EXPECT_GT(run.buckets, 1);
    EXPECT_EQ(run.launched_in_final_backward, run.buckets);
  }
}

TEST(DataParallelMpi, BucketSizesGiveIdenticalResults) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  // ~96 KiB of parameters: 1 KiB gives a bucket per tensor, 64 KiB splits fc1.weight (64 KiB)
  // from the rest, 25 MiB one bucket; the last two take different MPI reduction paths.
  const ModelShape big{32, 512};
  const int n = world()->world_size();
  auto ref = reference_step(global_batch(n, 2), big);
  auto a = dp_step(2, 1 << 10, big);
  auto b = dp_step(2, 64 << 10, big);
  auto c = dp_step(2, 25 << 20, big);
  EXPECT_GT(a.buckets, b.buckets);
  EXPECT_GT(b.buckets, c.buckets);
  EXPECT_EQ(c.buckets, 1);
  auto pb = b.model->named_parameters(), pc = c.model->named_parameters();
  for (const auto& kv : a.model->named_parameters()) {
    EXPECT_TRUE(torch::equal(kv.value(), pb[kv.key()])) << kv.key() << " 1 KiB vs 64 KiB";
    EXPECT_TRUE(torch::equal(kv.value(), pc[kv.key()])) << kv.key() << " 1 KiB vs 25 MiB";
    EXPECT_TRUE(torch::equal(kv.value().grad(), pc[kv.key()].grad())) << kv.key();
  }
  expect_params_close(*c.model, *ref, "25 MiB buckets:");
  expect_bitwise_identical_across_ranks(*c.model);
}

TEST(DataParallelMpi, PaddedTokensNormaliseOverTheGlobalBatch) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto comm = world();
  const int n = comm->world_size(), r = comm->rank();
  // One sequence per micro-batch, 2 micro-steps, padded to 10. The case at np=2:
  // rank 0 has 3 then 9 real targets, rank 1 5 then 1 (18 in all); np=4 adds 7, 2 and 10, 4.
  const std::vector<std::vector<int64_t>> table = {{3, 9}, {5, 1}, {7, 2}, {10, 4}};
  ASSERT_LE(n, 4);
  std::vector<int64_t> real;
  for (int q = 0; q < n; ++q) real.insert(real.end(), table[q].begin(), table[q].end());
  const Batch g = make_batch(real, kSeqLen, kVocab, 99);
  EXPECT_EQ(g.real_tokens, n == 2 ? 18 : 41);

  auto ref = make_tiny_lm(5);
  auto ref_loss = mllm::test::mean_loss(*ref, g.inputs, g.targets);
  ref_loss.backward();
  // Sanity: the mean of per-micro-batch means is a different number, so the test can tell.
  double mean_of_means = 0;
  for (int64_t i = 0; i < 2 * n; ++i) {
    auto row = mllm::test::slice(g, i, 1);
    mean_of_means += mllm::test::mean_loss(*ref, row.inputs, row.targets).item<double>() / (2 * n);
  }
  EXPECT_GT(std::abs(mean_of_means - ref_loss.item<double>()), 1e-3);

  auto model = make_tiny_lm(5);
  DataParallel dp(model, comm, 25 << 20);
  dp.broadcast_and_verify();
  auto mb0 = mllm::test::slice(g, 2 * r, 1), mb1 = mllm::test::slice(g, 2 * r + 1, 1);
  int64_t global = 0;
  const double scale = dp.loss_scale(mb0.real_tokens + mb1.real_tokens, &global);
  EXPECT_EQ(global, g.real_tokens);
  double local_sum = 0;
  int k = 0;
  for (auto* mb : {&mb0, &mb1}) {
    dp.set_sync(k++ == 1);
    auto loss = mllm::test::summed_loss(*model, mb->inputs, mb->targets);
    local_sum += loss.item<double>();
    (loss * scale).backward();
  }
  dp.finish_gradient_sync();
  const double logged = dp.global_mean_loss(local_sum, global);
  EXPECT_NEAR(logged, ref_loss.item<double>(), 1e-6 * std::abs(ref_loss.item<double>()));
  auto rp = ref->named_parameters();
  for (const auto& kv : model->named_parameters()) {
    const auto& want = rp[kv.key()].grad();
    const double tol = 1e-6 * want.abs().max().item<double>();
    EXPECT_LE((kv.value().grad() - want).abs().max().item<double>(), tol) << kv.key();
  }
  expect_bitwise_identical_across_ranks(*model);
}

TEST(DataParallelMpi, ClipsTheSyncedGradientByItsGlobalNorm) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto comm = world();
  const int n = comm->world_size(), r = comm->rank();
  struct W : torch::nn::Module {
    W() { w = register_parameter("w", torch::zeros({2})); }
    torch::Tensor w;
  };
  auto m = std::make_shared<W>();
  DataParallel dp(m, comm, 1024);
  // Local gradients [3,0] and [0,4] (np=4 adds [6,0] and [0,8]). Averaged: [1.5, 2], norm 2.5
  // at np=2; [2.25, 3], norm 3.75 at np=4. Clipped to 1: [0.6, 0.8] either way.
  const std::vector<std::vector<float>> local = {{3, 0}, {0, 4}, {6, 0}, {0, 8}};
  ASSERT_LE(n, 4);
  (m->w * torch::tensor(local[r])).sum().backward();
  dp.finish_gradient_sync();
  const double norm = dp.clip_grad_norm(1.0);
  EXPECT_NEAR(norm, n == 2 ? 2.5 : 3.75, 1e-6);
  EXPECT_NEAR(m->w.grad()[0].item<double>(), 0.6, 1e-6);
  EXPECT_NEAR(m->w.grad()[1].item<double>(), 0.8, 1e-6);
  auto norms = comm->all_gather(norm);
  for (double x : norms) EXPECT_EQ(x, norms[0]);
  expect_bitwise_identical_across_ranks(*m);
}

TEST(DataParallelMpi, ParameterUsedOnSomeRanksOnlyIsAveragedEverywhere) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto comm = world();
  const int n = comm->world_size(), r = comm->rank();
  struct AB : torch::nn::Module {
    AB() {
      a = register_parameter("a", torch::zeros({2}));
      b = register_parameter("b", torch::zeros({2}));
      never = register_parameter("never", torch::zeros({2}));
    }
    torch::Tensor a, b, never;
  };
  auto m = std::make_shared<AB>();
  DataParallel dp(m, comm, 1 << 20);
  // d/da = [r, 1] on every rank; b only on ranks > 0 with d/db = [2, -2]; `never` nowhere.
  auto loss = (m->a * torch::tensor({static_cast<float>(r), 1.0f})).sum();
  if (r > 0) loss = loss + (m->b * torch::tensor({2.0f, -2.0f})).sum();
  loss.backward();
  dp.finish_gradient_sync();
  EXPECT_FLOAT_EQ(m->a.grad()[0].item<float>(), (n - 1) / 2.0f);  // mean of 0..n-1
  EXPECT_FLOAT_EQ(m->a.grad()[1].item<float>(), 1.0f);
  ASSERT_TRUE(m->b.grad().defined()) << "rank " << r;
  EXPECT_FLOAT_EQ(m->b.grad()[0].item<float>(), 2.0f * (n - 1) / n);
  EXPECT_FLOAT_EQ(m->b.grad()[1].item<float>(), -2.0f * (n - 1) / n);
  EXPECT_FALSE(m->never.grad().defined());
}

TEST(DataParallelMpi, DifferentModelOnOneRankIsNamedOnEveryRank) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto comm = world();
  const int n = comm->world_size(), r = comm->rank();
  auto model = make_tiny_lm(1, kVocab, 16, r == n - 1 ? 33 : 32);
  DataParallel dp(model, comm, 1024);
  try {
    dp.broadcast_and_verify();
    FAIL() << "expected CommError on rank " << r;
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank " + std::to_string(n - 1) + " built a different model than rank 0"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("fc1.weight"), std::string::npos) << msg;
  }
  comm->barrier();  // everybody got here: nobody was left waiting
}

TEST(DataParallelMpi, BroadcastReplacesEveryRanksInitialisation) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto comm = world();
  auto model = make_tiny_lm(100 + comm->rank());
  DataParallel dp(model, comm, 1024);
  dp.broadcast_and_verify();
  auto rank0 = make_tiny_lm(100)->named_parameters();
  for (const auto& kv : model->named_parameters())
    EXPECT_TRUE(torch::equal(kv.value(), rank0[kv.key()])) << kv.key();
}

namespace {
// After a synced backward at ZeRO stages 1-3: the gradient norm (unclipped), then SGD (kLr) on
// this rank's segments and the all-gather of the parameters, waited for. Returns the norm.
double sgd_step_on_segments(DataParallel& dp) {
  const double norm = dp.clip_grad_norm(0.0);
  {
    torch::NoGradGuard no_grad;
    for (const auto& seg : dp.shard_segments()) {
      EXPECT_TRUE(seg.param.grad().defined()) << seg.name;
      if (seg.param.grad().defined()) seg.param.sub_(kLr * seg.param.grad());
    }
  }
  dp.all_gather_params();
  dp.wait_params();  // the gathers run in the background until then
  return norm;
}

// The single-process reference of one SGD step (kLr) on the global batch `g`, from the rank-0
// initialisation (seed 11): `norm` must be its gradient norm (1e-6 relative) and `model`'s
// weights its updated weights (1e-5 relative).
void expect_reference_sgd_step(TinyLMImpl& model, const Batch& g, double norm, ModelShape s) {
  auto ref = make_tiny_lm(11, kVocab, s.d_model, s.d_hidden);
  mllm::test::mean_loss(*ref, g.inputs, g.targets).backward();
  double ref_sq = 0;
  for (const auto& p : ref->parameters()) ref_sq += p.grad().to(torch::kDouble).square().sum().item<double>();
  EXPECT_NEAR(norm, std::sqrt(ref_sq), 1e-6 * std::sqrt(ref_sq));
  torch::NoGradGuard no_grad;
  const auto ours = model.named_parameters(), theirs = ref->named_parameters();
  for (const auto& kv : theirs) {
    const torch::Tensor want = kv.value() - kLr * kv.value().grad();
    EXPECT_TRUE(torch::allclose(ours[kv.key()], want, 1e-5, 1e-6)) << kv.key();
  }
}
}  // namespace

// ZeRO stage 1 (issue 16): one SGD step through shard segments + all_gather_params equals the
// single-process reference step, with small buckets (several buckets, slices cutting through
// parameters); the segments of all ranks cover every parameter exactly once; the clipped norm
// is the reference's.
TEST(DataParallelZero1, SegmentsPartitionParametersAndStepMatchesReference) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto comm = world();
  const int n = comm->world_size(), r = comm->rank();
  const ModelShape s;
  auto model = make_tiny_lm(11 + 1000 * static_cast<uint64_t>(r), kVocab, s.d_model, s.d_hidden);
  DataParallel dp(model, comm, /*bucket_bytes=*/600, /*zero_stage=*/1);
  ASSERT_GT(dp.num_buckets(), 2);
  dp.broadcast_and_verify();

  // Coverage: every rank's (name, begin, end), gathered; per parameter they tile [0, numel).
  std::string mine;
  for (const auto& seg : dp.shard_segments())
    mine += seg.name + " " + std::to_string(seg.begin) + " " + std::to_string(seg.end) + " " +
            std::to_string(seg.param_numel) + "\n";
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> pieces;
  std::map<std::string, int64_t> numel;
  for (const auto& text : comm->all_gather(mine)) {
    std::istringstream in(text);
    std::string name;
    int64_t b = 0, e = 0, total = 0;
    while (in >> name >> b >> e >> total) {
      pieces[name].emplace_back(b, e);
      numel[name] = total;
    }
  }
  ASSERT_EQ(pieces.size(), model->parameters().size());
  for (auto& [name, list] : pieces) {
    std::sort(list.begin(), list.end());
    int64_t at = 0;
    for (const auto& [b, e] : list) {
      EXPECT_EQ(b, at) << name;
      at = e;
    }
    EXPECT_EQ(at, numel[name]) << name;
  }

  // One step, SGD on the segments, then the all-gather.
  const Batch g = global_batch(n, 1);
  auto mb = micro_batch(g, n, r, 0);
  const double scale = dp.loss_scale(mb.real_tokens);
  (mllm::test::summed_loss(*model, mb.inputs, mb.targets) * scale).backward();
  dp.finish_gradient_sync();
  const double norm = sgd_step_on_segments(dp);

  expect_reference_sgd_step(*model, g, norm, s);
  torch::NoGradGuard no_grad;
  // Every rank holds bitwise the same weights.
  std::string h;
  for (const auto& p : model->parameters()) h += mllm::test::bytes_hash(p);
  const auto all = comm->all_gather(h);
  for (int q = 1; q < n; ++q) EXPECT_EQ(all[q], all[0]) << "rank " << q;
}

// ZeRO stage 3 (issue 29): fc1 and fc2 are "blocks" 0 and 1, the embedding the root unit.
// Outside a forward/backward no parameter holds memory; two accumulation micro-steps driven
// through the hooks, then SGD on the segments, equal the single-process reference step; the
// norm is the reference's; FullParams shows every rank the same whole weights; the footprint
// counts 1/N of the parameters.
TEST(DataParallelZero3, GatherPerBlockAndStepMatchesReference) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto comm = world();
  const int n = comm->world_size(), r = comm->rank();
  const ModelShape s;
  auto model = make_tiny_lm(11 + 1000 * static_cast<uint64_t>(r), kVocab, s.d_model, s.d_hidden);
  auto unit_of = [](const std::string& name) -> int64_t {
    return name.rfind("fc1.", 0) == 0 ? 0 : name.rfind("fc2.", 0) == 0 ? 1 : -1;
  };
  DataParallel dp(model, comm, /*bucket_bytes=*/600, /*zero_stage=*/3, unit_of);
  EXPECT_EQ(dp.num_buckets(), 3);  // one per unit, whatever the bucket size
  dp.broadcast_and_verify();
  auto holds_memory = [&] {
    int64_t bytes = 0;
    for (const auto& p : model->parameters()) bytes += static_cast<int64_t>(p.storage().nbytes());
    return bytes;
  };
  EXPECT_EQ(holds_memory(), 0);
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  int64_t shard = 0;
  for (const auto& seg : dp.shard_segments()) shard += seg.end - seg.begin;
  EXPECT_EQ(comm->all_gather(shard).size(), static_cast<size_t>(n));
  int64_t sum = 0;
  for (int64_t v : comm->all_gather(shard)) sum += v;
  EXPECT_EQ(sum, total);  // the segments of all ranks cover every element once
  EXPECT_EQ(dp.footprint().param_bytes, shard * 4);

  const Batch g = global_batch(n, 2);
  int64_t local_tokens = 0;
  for (int k = 0; k < 2; ++k) local_tokens += micro_batch(g, n, r, k).real_tokens;
  const double scale = dp.loss_scale(local_tokens);
  dp.zero_grad();
  for (int k = 0; k < 2; ++k) {
    auto mb = micro_batch(g, n, r, k);
    dp.pre_model_forward();
    torch::Tensor x = model->emb(mb.inputs);
    dp.pre_forward(0);
    torch::Tensor h = torch::tanh(model->fc1(x));
    dp.post_forward(0);
    EXPECT_EQ(model->fc1->weight.storage().nbytes(), 0u);  // freed until backward
    h.register_hook([&dp](torch::Tensor grad) {
      dp.pre_backward(0);
      return grad;
    });
    dp.pre_forward(1);
    torch::Tensor logits = model->fc2(h);
    dp.post_forward(1);
    logits.register_hook([&dp](torch::Tensor grad) {
      dp.pre_backward(1);
      return grad;
    });
    auto loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, kVocab}), mb.targets.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(0).reduction(torch::kSum));
    (loss * scale).backward();
    dp.finish_gradient_sync();
    EXPECT_EQ(holds_memory(), 0) << "micro-step " << k;  // every unit freed at its launch
  }
  const double norm = sgd_step_on_segments(dp);

  {
    DataParallel::FullParams full(dp);
    EXPECT_GT(holds_memory(), 0);
    expect_reference_sgd_step(*model, g, norm, s);
    std::string h;
    for (const auto& p : model->parameters()) h += mllm::test::bytes_hash(p);
    const auto all = comm->all_gather(h);
    for (int q = 1; q < n; ++q) EXPECT_EQ(all[q], all[0]) << "rank " << q;
  }
  dp.wait_params();
  dp.release_params();  // the prefetched root and block 0 go too
  EXPECT_EQ(holds_memory(), 0);
}
