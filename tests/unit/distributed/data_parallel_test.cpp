// DataParallel in one process: bucket launches from autograd hooks (recorded by a fake
// communicator), the (N, K) = (1, 4) accumulation case against a full-batch reference, loss
// normalisation, clipping, unused parameters, and misuse errors.
#include <cmath>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "distributed/tiny_lm.h"
#include "mllm/core/error.h"
#include "mllm/distributed/data_parallel.h"

using namespace mllm;
using mllm::test::make_batch;
using mllm::test::make_tiny_lm;

namespace {

std::shared_ptr<Communicator> single() {
  DistConfig cfg;
  cfg.backend = "single";
  return make_communicator(cfg);
}

// Records every all_reduce_async: element count and, through `probe`, what the model looked
// like at that moment. Acts as rank 0 of a world of `world` whose other ranks contribute nothing
// (the collectives leave the values as they are): with world > 1 DataParallel takes its bucketed
// multi-rank path, at world 1 its local one.
class RecordingComm : public Communicator {
 public:
  explicit RecordingComm(int world = 2) : world_(world) {}
  std::function<void()> probe;
  std::vector<int64_t> launched_numel;
  int waits = 0;

  std::string backend() const override { return "recording"; }
  int rank() const override { return 0; }
  int world_size() const override { return world_; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  void all_reduce(torch::Tensor& t, ReduceOp op) override { count_collective(); }
  std::shared_ptr<Work> all_reduce_async(torch::Tensor& t, ReduceOp op) override {
    count_collective();
    launched_numel.push_back(t.numel());
    if (probe) probe();
    struct W : Work {
      RecordingComm* c;
      explicit W(RecordingComm* c) : c(c) {}
      void wait() override { ++c->waits; }
    };
    return std::make_shared<W>(this);
  }
  void broadcast(torch::Tensor& t, int root) override { count_collective(); }
  void barrier() override { count_collective(); }
  std::vector<int64_t> all_gather(int64_t v) override { count_collective(); return {v}; }
  std::vector<double> all_gather(double v) override { count_collective(); return {v}; }
  std::vector<std::string> all_gather(const std::string& v) override {
    count_collective();
    return {v};
  }

 private:
  int world_;
};

struct Chain : torch::nn::Module {
  Chain() {
    l1 = register_module("l1", torch::nn::Linear(4, 4));
    l2 = register_module("l2", torch::nn::Linear(4, 4));
    l3 = register_module("l3", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return l3(torch::relu(l2(torch::relu(l1(x))))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};

}  // namespace

TEST(DataParallel, BucketsLaunchDuringBackwardInReverseOrder) {
  torch::manual_seed(0);
  auto model = std::make_shared<Chain>();
  auto comm = std::make_shared<RecordingComm>();
  // One Linear(4, 4) = 16 + 4 floats = 80 bytes: a cap of 80 bytes gives one bucket per layer,
  // l3 first (reverse registration order).
  DataParallel dp(model, comm, 80);
  ASSERT_EQ(dp.num_buckets(), 3);
  std::vector<bool> l1_grad_seen;
  comm->probe = [&] { l1_grad_seen.push_back(model->l1->weight.grad().defined()); };
  auto loss = model->forward(torch::ones({2, 4})).sum();
  loss.backward();
  // All three launched by the hooks, before finish_gradient_sync; l1's gradient did not exist yet
  // when l3's and l2's buckets went out, so those overlapped the rest of backward.
  ASSERT_EQ(comm->launched_numel.size(), 3u);
  EXPECT_EQ(comm->launched_numel, (std::vector<int64_t>{20 + 2, 20 + 2, 20 + 2}));  // + flags
  EXPECT_EQ(l1_grad_seen, (std::vector<bool>{false, false, true}));
  EXPECT_EQ(comm->waits, 0);
  dp.finish_gradient_sync();
  EXPECT_EQ(comm->waits, 3);
  EXPECT_EQ(dp.collectives_issued(), 3);
}

TEST(DataParallel, OneRankNeedsNoBucketsHooksOrCollectives) {
  // World size 1: the gradient autograd accumulated is already the average over all ranks. No
  // collective is issued, .grad is autograd's own tensor (no copy into a bucket), and the values
  // are d(sum of l3's outputs)/d(l3.bias) = 2 per entry for 2 rows, accumulated over 2 micro-steps.
  torch::manual_seed(0);
  auto model = std::make_shared<Chain>();
  auto comm = std::make_shared<RecordingComm>(/*world=*/1);
  DataParallel dp(model, comm, 80);
  EXPECT_TRUE(dp.local_only());
  EXPECT_EQ(dp.num_buckets(), 3);  // the plan, unused
  for (int a = 0; a < 2; ++a) {
    dp.set_sync(a == 1);
    model->forward(torch::ones({2, 4})).sum().backward();
  }
  const void* grad_before = model->l3->bias.grad().data_ptr();
  dp.finish_gradient_sync();
  EXPECT_EQ(comm->collectives_issued(), 0);
  EXPECT_EQ(dp.collectives_issued(), 0);
  EXPECT_EQ(model->l3->bias.grad().data_ptr(), grad_before);
  EXPECT_TRUE(torch::equal(model->l3->bias.grad(), torch::full({4}, 4.0f)));
  // Footprint: parameters and their gradients, no "used" flags.
  const int64_t bytes = 3 * (16 + 4) * 4;
  EXPECT_EQ(dp.footprint().param_bytes, bytes);
  EXPECT_EQ(dp.footprint().grad_bytes, bytes);
  DataParallel bucketed(model, std::make_shared<RecordingComm>(2), 80);
  EXPECT_FALSE(bucketed.local_only());
  EXPECT_EQ(bucketed.footprint().grad_bytes, bytes + 3 * 2 * 4);  // + 2 flags per bucket
}

TEST(DataParallel, NoCommunicationWhileSyncIsOff) {
  torch::manual_seed(0);
  auto model = std::make_shared<Chain>();
  auto comm = std::make_shared<RecordingComm>();
  DataParallel dp(model, comm, 80);
  dp.set_sync(false);
  model->forward(torch::ones({2, 4})).sum().backward();
  dp.finish_gradient_sync();  // no-op while sync is off
  EXPECT_EQ(comm->collectives_issued(), 0);
  dp.set_sync(true);
  model->forward(torch::ones({2, 4})).sum().backward();
  EXPECT_EQ(comm->collectives_issued(), 3);
  EXPECT_THROW(dp.set_sync(false), Error);          // a sync is in flight
  EXPECT_THROW(dp.clip_grad_norm(1.0), Error);
  dp.finish_gradient_sync();
}

TEST(DataParallel, SecondSyncedBackwardWithoutFinishIsAnError) {
  torch::manual_seed(0);
  auto model = std::make_shared<Chain>();
  DataParallel dp(model, std::make_shared<RecordingComm>(), 1 << 20);
  model->forward(torch::ones({1, 4})).sum().backward();
  EXPECT_THROW(model->forward(torch::ones({1, 4})).sum().backward(), std::exception);
}

TEST(DataParallel, OneRankFourMicroStepsEqualsFullBatch) {
  // (N, K) = (1, 4): 8 sequences, 2 per micro-batch, uneven real-token counts. In float64: the
  // two sides sum in different orders (four scaled micro-batch sums against one mean), and in
  // float32 one CI run under load differed by 2e-5 of the largest entry (not reproduced in 80
  // runs alone: the products' sums were probably split differently), past the 1e-6 bound.
  const std::vector<int64_t> real = {10, 3, 7, 1, 9, 4, 2, 8};
  auto batch = make_batch(real, 10, 13, 42);
  auto ref = make_tiny_lm(7);
  ref->to(torch::kDouble);
  mllm::test::mean_loss(*ref, batch.inputs, batch.targets).backward();

  auto model = make_tiny_lm(7);
  model->to(torch::kDouble);
  auto comm = single();
  DataParallel dp(model, comm, 1024);
  dp.broadcast_and_verify();
  int64_t global = 0;
  const double scale = dp.loss_scale(batch.real_tokens, &global);
  EXPECT_EQ(global, 44);
  EXPECT_DOUBLE_EQ(scale, 1.0 / 44.0);
  for (int k = 0; k < 4; ++k) {
    dp.set_sync(k == 3);
    const int64_t before = comm->collectives_issued();
    auto mb = mllm::test::slice(batch, 2 * k, 2);
    (mllm::test::summed_loss(*model, mb.inputs, mb.targets) * scale).backward();
    if (k < 3) EXPECT_EQ(comm->collectives_issued(), before) << "micro-step " << k;
  }
  dp.finish_gradient_sync();
  auto ref_params = ref->named_parameters();
  for (const auto& kv : model->named_parameters()) {
    const auto& want = ref_params[kv.key()].grad();
    const auto& got = kv.value().grad();
    const double scale_ref = want.abs().max().item<double>();
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-12 * scale_ref) << kv.key();
  }
}

// Large gradients (many of the norm's 65,536-element blocks, and a tail that fills only some
// of a block's 8 lanes): the norm against independent sums, and the same bits whatever the
// thread count.
TEST(DataParallel, GradNormOfLargeGradientsIsExactAndThreadCountFree) {
  struct W : torch::nn::Module {
    W() {
      a = register_parameter("a", torch::zeros({3 * 65536 + 13}));
      b = register_parameter("b", torch::zeros({1000, 777}));
    }
    torch::Tensor a, b;
  };
  auto m = std::make_shared<W>();
  DataParallel dp(m, single(), 1 << 20);
  // a: every element 0.5 (each square 0.25, every partial sum exact in float64); b: random.
  const int64_t na = 3 * 65536 + 13;
  torch::manual_seed(7);
  const torch::Tensor gb = torch::randn({1000, 777});
  ((m->a * 0.5f).sum() + (m->b * gb).sum()).backward();
  dp.finish_gradient_sync();
  // Reference: the squares of b summed in long double, element by element, plus a's 0.25 * na.
  long double ref = 0.25L * na;
  const float* p = gb.data_ptr<float>();
  for (int64_t i = 0; i < gb.numel(); ++i) ref += static_cast<long double>(p[i]) * p[i];
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const double one = dp.clip_grad_norm(0.0);
  at::set_num_threads(2);
  const double two = dp.clip_grad_norm(0.0);
  at::set_num_threads(threads);
  EXPECT_EQ(one, two);  // bitwise
  EXPECT_NEAR(one, std::sqrt(static_cast<double>(ref)), 1e-13 * one);
  // a alone: exact.
  m->b.grad().zero_();
  EXPECT_EQ(dp.clip_grad_norm(0.0), std::sqrt(0.25 * na));
}

TEST(DataParallel, ClipsByGlobalNorm) {
  struct W : torch::nn::Module {
    W() { w = register_parameter("w", torch::zeros({2})); }
    torch::Tensor w;
  };
  auto m = std::make_shared<W>();
  DataParallel dp(m, single(), 1024);
  (m->w * torch::tensor({3.0f, 4.0f})).sum().backward();
  dp.finish_gradient_sync();
  EXPECT_NEAR(dp.clip_grad_norm(1.0), 5.0, 1e-12);
  EXPECT_NEAR(m->w.grad()[0].item<double>(), 0.6, 1e-7);
  EXPECT_NEAR(m->w.grad()[1].item<double>(), 0.8, 1e-7);
  EXPECT_NEAR(dp.clip_grad_norm(0.0), 1.0, 1e-6);  // reports, clips nothing
  EXPECT_NEAR(dp.clip_grad_norm(2.0), 1.0, 1e-6);  // below the cap: unchanged
  EXPECT_NEAR(m->w.grad()[1].item<double>(), 0.8, 1e-7);
}

TEST(DataParallel, UnusedParameterKeepsUndefinedGradAndOthersSync) {
  struct TwoHeads : torch::nn::Module {
    TwoHeads() {
      used = register_module("used", torch::nn::Linear(3, 1));
      unused = register_module("unused", torch::nn::Linear(3, 1));
    }
    torch::nn::Linear used{nullptr}, unused{nullptr};
  };
  // At world 1 (local path) and as rank 0 of 2 (bucketed: its flags are a mix of 0 and 1).
  for (int world : {1, 2}) {
    torch::manual_seed(1);
    auto m = std::make_shared<TwoHeads>();
    DataParallel dp(m, std::make_shared<RecordingComm>(world), 1 << 20);  // one bucket: launched in finish
    m->used(torch::ones({1, 3})).sum().backward();
    dp.finish_gradient_sync();
    EXPECT_FALSE(m->unused->weight.grad().defined()) << "world " << world;
    ASSERT_TRUE(m->used->weight.grad().defined()) << "world " << world;
    EXPECT_TRUE(torch::equal(m->used->weight.grad(), torch::ones({1, 3}))) << "world " << world;
  }
}

TEST(DataParallel, ZeroRealTokensGiveZeroScale) {
  auto m = make_tiny_lm(1);
  DataParallel dp(m, single(), 1024);
  int64_t global = -1;
  EXPECT_EQ(dp.loss_scale(0, &global), 0.0);
  EXPECT_EQ(global, 0);
  EXPECT_THROW(dp.loss_scale(-1), Error);
}

TEST(DataParallel, RejectsBadArguments) {
  auto m = make_tiny_lm(1);
  EXPECT_THROW(DataParallel(m, single(), 0), Error);
  EXPECT_THROW(DataParallel(nullptr, single(), 1024), Error);
  EXPECT_THROW(DataParallel(m, nullptr, 1024), Error);
}

TEST(DataParallel, TiedWeightsCountOnce) {
  struct Tied : torch::nn::Module {
    Tied() {
      w = register_parameter("w", torch::zeros({2, 2}));
      register_parameter("head_w", w);  // the same tensor under a second name (tied weights)
      b = register_parameter("b", torch::zeros({2}));
    }
    torch::Tensor w, b;
  };
  auto m = std::make_shared<Tied>();
  auto comm = std::make_shared<RecordingComm>();
  DataParallel dp(m, comm, 1 << 20);
  // Used twice: d/dw = 2 per entry; d/db = 1 per entry.
  ((m->w * 1.0).sum() + (m->w * 1.0).sum() + m->b.sum()).backward();
  dp.finish_gradient_sync();
  // w and b once each: 4 + 2 elements + 2 flags in the single bucket.
  EXPECT_EQ(comm->launched_numel, (std::vector<int64_t>{8}));
  EXPECT_NEAR(dp.clip_grad_norm(0), std::sqrt(4 * 4.0 + 2), 1e-9);
}

TEST(DataParallel, GradsStayUsableByOptimizersAndZeroGradAcrossSteps) {
  // After the first sync .grad aliases the bucket; optimizer and module zero_grad (which detach
  // grads) must work on it, and a second step must still produce the right gradient.
  torch::manual_seed(0);
  auto model = std::make_shared<Chain>();
  auto comm = single();
  DataParallel dp(model, comm, 80);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.0));
  for (int step = 0; step < 3; ++step) {
    if (step == 1) opt.zero_grad();
    if (step == 2) model->zero_grad(/*set_to_none=*/true);
    model->forward(torch::ones({2, 4})).sum().backward();
    dp.finish_gradient_sync();
    // d/d l3.bias of sum over 2 rows and 4 outputs = 2 per entry (lr 0: parameters unchanged).
    EXPECT_TRUE(torch::equal(model->l3->bias.grad(), torch::full({4}, 2.0f))) << "step " << step;
    opt.step();
  }
}
