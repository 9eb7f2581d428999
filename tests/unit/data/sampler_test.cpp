// DistributedSampler: resume, coverage, epoch order and world-size invariance (the acceptance
// test of issue 3), plus the RNG against an independent Python implementation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "mllm/core/error.h"
#include "mllm/data/sampler.h"

namespace mllm {
namespace {

TEST(Splitmix64, MatchesReferenceOutputs) {
  // splitmix64.c seeded with 0: first two outputs.
  uint64_t s = 0;
  EXPECT_EQ(splitmix64(s), 0xe220a8397b1dcdafull);
  EXPECT_EQ(splitmix64(s), 0x6e789e6aa1b965f4ull);
}

TEST(SeededPermutation, MatchesIndependentPython) {
  // From a 20-line Python re-implementation of splitmix64 + rejection + Fisher-Yates.
  EXPECT_EQ(seeded_permutation(10, 12345), (std::vector<int64_t>{8, 6, 7, 2, 1, 3, 9, 5, 0, 4}));
  auto p0 = seeded_permutation(40, epoch_seed(7, 0));
  auto p1 = seeded_permutation(40, epoch_seed(7, 1));
  EXPECT_EQ(std::vector<int64_t>(p0.begin(), p0.begin() + 8),
            (std::vector<int64_t>{22, 33, 10, 31, 9, 38, 37, 13}));
  EXPECT_EQ(std::vector<int64_t>(p1.begin(), p1.begin() + 8),
            (std::vector<int64_t>{35, 39, 27, 26, 16, 24, 36, 22}));
}

// (step, rank, micro-batch ids) of every rank for steps [from, to), 1-based steps.
using Trace = std::vector<std::tuple<int, int, std::vector<int64_t>>>;

Trace run(std::vector<DistributedSampler>& ranks, int from, int to) {
  Trace t;
  for (int step = from; step < to; ++step)
    for (size_t r = 0; r < ranks.size(); ++r)
      for (auto& micro : ranks[r].next_step()) t.emplace_back(step, int(r), micro);
  return t;
}

std::vector<DistributedSampler> make_ranks(int world, int64_t n = 40, int64_t global = 8,
                                           int64_t micro = 2) {
  std::vector<DistributedSampler> v;
  for (int r = 0; r < world; ++r) v.emplace_back(n, global, micro, r, world, 7);
  return v;
}

TEST(DistributedSampler, ResumeAfterStep13MatchesUninterrupted) {
  // 40 sequences, 2 ranks, micro-batch 2, seed 7; global batch 8 -> 5 steps per epoch,
  // accumulation 2.
  auto full = make_ranks(2);
  ASSERT_EQ(full[0].steps_per_epoch(), 5);
  ASSERT_EQ(full[0].accumulation_steps(), 2);
  run(full, 1, 14);
  const Trace want = run(full, 14, 31);

  auto first = make_ranks(2);
  run(first, 1, 14);
  const SamplerState saved = first[0].state();
  EXPECT_EQ(saved.epoch, 2);          // 13 steps = 2 epochs of 5 + 3
  EXPECT_EQ(saved.step_in_epoch, 3);
  EXPECT_EQ(first[1].state().epoch, saved.epoch);
  EXPECT_EQ(first[1].state().step_in_epoch, saved.step_in_epoch);

  auto resumed = make_ranks(2);
  for (auto& s : resumed) s.load_state(saved);
  EXPECT_EQ(run(resumed, 14, 31), want);
}

TEST(DistributedSampler, EveryIdOncePerEpochAndEpochsDiffer) {
  auto ranks = make_ranks(2);
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> seen;
    for (int s = 0; s < 5; ++s)
      for (auto& r : ranks)
        for (auto& m : r.next_step()) {
          EXPECT_EQ(m.size(), 2u);
          seen.insert(seen.end(), m.begin(), m.end());
        }
    std::vector<int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(40);
    for (int i = 0; i < 40; ++i) all[size_t(i)] = i;
    EXPECT_EQ(sorted, all) << "epoch " << e;
    epochs.push_back(seen);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
}

TEST(DistributedSampler, WorldSizesOneTwoFourGiveTheSameGlobalBatches) {
  std::vector<std::vector<std::vector<int64_t>>> per_world;  // [world][step] -> global batch ids
  for (int world : {1, 2, 4}) {
    auto ranks = make_ranks(world);
    std::vector<std::vector<int64_t>> steps;
    for (int s = 0; s < 12; ++s) {
      std::vector<int64_t> global;  // rank 0's micro-batches, then rank 1's, ...
      for (auto& r : ranks)
        for (auto& m : r.next_step()) global.insert(global.end(), m.begin(), m.end());
      EXPECT_EQ(global.size(), 8u);
      steps.push_back(global);
    }
    per_world.push_back(steps);
  }
  EXPECT_EQ(per_world[0], per_world[1]);
  EXPECT_EQ(per_world[0], per_world[2]);
  // And it is the documented slice of the epoch permutation.
  const auto perm = seeded_permutation(40, epoch_seed(7, 0));
  EXPECT_EQ(per_world[0][1], std::vector<int64_t>(perm.begin() + 8, perm.begin() + 16));
  // A state saved at world size 4 resumes at world size 2 with the same global batches.
  auto four = make_ranks(4);
  for (int s = 0; s < 7; ++s)
    for (auto& r : four) r.next_step();
  auto two = make_ranks(2);
  for (auto& r : two) r.load_state(four[0].state());
  std::vector<int64_t> g;
  for (auto& r : two)
    for (auto& m : r.next_step()) g.insert(g.end(), m.begin(), m.end());
  EXPECT_EQ(g, per_world[0][7]);
}

TEST(DistributedSampler, DropsTheIncompleteLastBatch) {
  DistributedSampler s(43, 8, 2, 0, 2, 1);
  EXPECT_EQ(s.steps_per_epoch(), 5);  // 3 sequences left out each epoch
  for (int i = 0; i < 5; ++i) s.next_step();
  EXPECT_EQ(s.state().epoch, 1);
  EXPECT_EQ(s.state().step_in_epoch, 0);
}

TEST(DistributedSampler, BadSettingsAreConfigErrors) {
  EXPECT_THROW(DistributedSampler(40, 6, 2, 0, 2, 1), ConfigError);   // 6 % 4 != 0
  EXPECT_THROW(DistributedSampler(7, 8, 2, 0, 2, 1), ConfigError);    // no full global batch
  EXPECT_THROW(DistributedSampler(40, 8, 2, 2, 2, 1), ConfigError);   // bad rank
  DistributedSampler s(40, 8, 2, 0, 2, 1);
  EXPECT_THROW(s.load_state({0, 5}), CheckpointError);
  EXPECT_THROW(s.load_state({-1, 0}), CheckpointError);
}

TEST(ValBatchIndices, FixedOrderEachSequenceOnce) {
  // 11 sequences, micro-batch 2: batches [0,1] [2,3] [4,5] [6,7] [8,9] [10].
  EXPECT_EQ(val_batch_indices(11, 0, 2), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(val_batch_indices(11, 1, 2), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(val_batch_indices(11, 5, 2), (std::vector<int64_t>{10}));
  EXPECT_TRUE(val_batch_indices(11, 6, 2).empty());
  EXPECT_EQ(val_batch_count(11, 2), 6);
  EXPECT_THROW(val_batch_indices(11, 0, 0), ConfigError);
}

TEST(ValBatchIndices, SameSequencesAtAnyWorldSize) {
  // 4 batches of an 11-sequence split at micro-batch 2 = sequences 0..7, whatever the ranks.
  EXPECT_EQ(val_batches_of_rank(4, 11, 2, 0, 2), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(val_batches_of_rank(4, 11, 2, 1, 2), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(val_batches_of_rank(4, 11, 2, 3, 4), (std::vector<int64_t>{3}));
  EXPECT_EQ(val_batches_of_rank(4, 11, 2, 3, 8), (std::vector<int64_t>{3}));
  EXPECT_TRUE(val_batches_of_rank(4, 11, 2, 5, 8).empty());
  // More batches asked for than exist: capped at the 6 that hold sequences.
  EXPECT_EQ(val_batches_of_rank(100, 11, 2, 0, 4), (std::vector<int64_t>{0, 4}));
  for (int world : {1, 2, 3, 4, 8}) {
    std::multiset<int64_t> seen;
    for (int r = 0; r < world; ++r)
      for (int64_t b : val_batches_of_rank(4, 11, 2, r, world))
        for (int64_t i : val_batch_indices(11, b, 2)) seen.insert(i);
    EXPECT_EQ(seen, (std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7})) << "world " << world;
  }
  EXPECT_THROW(val_batches_of_rank(4, 11, 2, 2, 2), ConfigError);
}

}  // namespace
}  // namespace mllm

namespace mllm {
namespace {

// Every rank's ids of one step of a mixture, in rank order (the global batch).
std::vector<int64_t> global_ids(std::vector<MixtureSampler>& ranks) {
  std::vector<int64_t> out;
  for (auto& s : ranks)
    for (const auto& micro : s.next_step()) out.insert(out.end(), micro.begin(), micro.end());
  return out;
}

std::vector<MixtureSampler> mixture_ranks(int world, const std::vector<int64_t>& sizes,
                                          const std::vector<double>& weights) {
  std::vector<MixtureSampler> out;
  for (int r = 0; r < world; ++r) out.emplace_back(sizes, weights, 16, 2, r, world, 1337);
  return out;
}

TEST(MixtureSampler, DrawsFollowTheWeightsWithinSamplingError) {
  // Sources of 50, 400 and 1000 sequences, weights 1 : 3 : 6; 2,000 steps of 16 slots.
  const std::vector<int64_t> sizes = {50, 400, 1000};
  const std::vector<double> weights = {1, 3, 6};
  auto ranks = mixture_ranks(1, sizes, weights);
  std::vector<int64_t> counts(3, 0);
  const int64_t steps = 2000, slots = steps * 16;
  for (int64_t k = 0; k < steps; ++k)
    for (int64_t id : global_ids(ranks)) ++counts[size_t(ranks[0].source_of(id))];
  for (size_t s = 0; s < 3; ++s) {
    const double p = weights[s] / 10.0;
    const double sigma = std::sqrt(slots * p * (1 - p));  // binomial
    EXPECT_NEAR(double(counts[s]), slots * p, 4 * sigma) << "source " << s;
    EXPECT_EQ(counts[s], ranks[0].drawn()[s]);
  }
}

TEST(MixtureSampler, WeightsWhoseSumOverflowsKeepTheirShares) {
  // 1e308 + 1e308 is inf in a double: before, every u * inf compared past the first running sum,
  // every draw came from the last source, and the start-up line printed "-nan%". Shares by hand:
  // 1/2 and 1/2; 1e308 : 5e307 is 2/3 : 1/3; 1.7e308 : 1e300 : 1.7e308 about 1/2 : 3e-9 : 1/2.
  const std::vector<double> equal = {1e308, 1e308};
  EXPECT_EQ(mixture_shares(equal), (std::vector<double>{0.5, 0.5}));
  const auto thirds = mixture_shares({1e308, 5e307});
  EXPECT_NEAR(thirds[0], 2.0 / 3.0, 1e-15);
  EXPECT_NEAR(thirds[1], 1.0 / 3.0, 1e-15);
  for (double c : cumulative_weights({1.7e308, 1e300, 1.7e308})) EXPECT_TRUE(std::isfinite(c));
  // A sum that does not overflow keeps the plain running sums (the draws of earlier versions).
  EXPECT_EQ(cumulative_weights({1, 3, 6}), (std::vector<double>{1, 4, 10}));
  EXPECT_EQ(mixture_shares({1, 3, 6}), (std::vector<double>{0.1, 0.3, 0.6}));

  auto ranks = mixture_ranks(1, {100, 100}, equal);
  std::vector<int64_t> counts(2, 0);
  const int64_t steps = 500, slots = steps * 16;
  for (int64_t k = 0; k < steps; ++k)
    for (int64_t id : global_ids(ranks)) ++counts[size_t(ranks[0].source_of(id))];
  const double sigma = std::sqrt(slots * 0.25);  // binomial, p = 1/2
  EXPECT_NEAR(double(counts[0]), slots * 0.5, 4 * sigma);
  EXPECT_NEAR(double(counts[1]), slots * 0.5, 4 * sigma);
  // A weight that is not finite is refused by name.
  EXPECT_THROW(MixtureSampler({10, 10}, {1.0, INFINITY}, 16, 2, 0, 1, 1337), ConfigError);
}

TEST(MixtureSampler, EachSourceUsesEverySequenceOncePerEpochAndWraps) {
  const std::vector<int64_t> sizes = {7, 300};
  auto ranks = mixture_ranks(1, sizes, {1, 1});
  std::vector<std::vector<int64_t>> small;  // draws of source 0, in order
  std::vector<std::pair<int, int64_t>> epochs;
  while (small.size() < 3 * 7) {
    for (int64_t id : global_ids(ranks))
      if (ranks[0].source_of(id) == 0) small.push_back({id});
    for (auto e : ranks[0].take_new_epochs()) epochs.push_back(e);
  }
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 7; ++i) ids.push_back(small[size_t(e * 7 + i)][0]);
    std::sort(ids.begin(), ids.end());
    EXPECT_EQ(ids, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6})) << "epoch " << e;
  }
  ASSERT_GE(epochs.size(), 2u);
  EXPECT_EQ(epochs[0], (std::pair<int, int64_t>{0, 1}));
  EXPECT_EQ(epochs[1], (std::pair<int, int64_t>{0, 2}));
  // Global ids of source 1 are offset by the size of source 0.
  for (int k = 0; k < 20; ++k)
    for (int64_t id : global_ids(ranks)) EXPECT_LT(id, 307);
}

TEST(MixtureSampler, SameGlobalBatchesAtAnyWorldSizeAndAfterAResume) {
  const std::vector<int64_t> sizes = {37, 500};
  auto one = mixture_ranks(1, sizes, {2, 1});
  auto four = mixture_ranks(4, sizes, {2, 1});
  std::vector<std::vector<int64_t>> want;
  for (int k = 0; k < 30; ++k) {
    want.push_back(global_ids(one));
    EXPECT_EQ(global_ids(four), want.back()) << "step " << k;
  }
  // Saved by 1 rank after 10 steps, resumed by 2.
  auto a = mixture_ranks(1, sizes, {2, 1});
  for (int k = 0; k < 10; ++k) global_ids(a);
  const SamplerState st = a[0].state();
  EXPECT_EQ(st.step_in_epoch, 10);
  EXPECT_EQ(st.drawn[0] + st.drawn[1], 160);
  auto b = mixture_ranks(2, sizes, {2, 1});
  for (auto& s : b) s.load_state(st);
  for (int k = 10; k < 30; ++k) EXPECT_EQ(global_ids(b), want[size_t(k)]) << "step " << k;
  // A mixture's state does not fit one corpus, nor a mixture of another size, and back.
  DistributedSampler plain(537, 16, 2, 0, 1, 1337);
  EXPECT_THROW(plain.load_state(st), CheckpointError);
  auto three = mixture_ranks(1, {37, 500, 9}, {1, 1, 1});
  EXPECT_THROW(three[0].load_state(st), CheckpointError);
  EXPECT_THROW(b[0].load_state(plain.state()), CheckpointError);
  EXPECT_THROW(MixtureSampler({37, 0}, {1, 1}, 16, 2, 0, 1, 1), ConfigError);
  EXPECT_THROW(MixtureSampler({37, 5}, {1, 0}, 16, 2, 0, 1, 1), ConfigError);
}

}  // namespace
}  // namespace mllm

namespace mllm {
namespace {

TEST(InterleavedIds, RoundRobinOverSourcesSkippingThoseThatRanOut) {
  // Sources of 3, 1 and 2 sequences: ids 0-2, 3, 4-5. By hand: round 0: 0, 3, 4; round 1: 1, 5;
  // round 2: 2.
  const std::vector<int64_t> want = {0, 3, 4, 1, 5, 2};
  EXPECT_EQ(interleaved_ids({3, 1, 2}, 0, 100), want);
  for (int64_t first = 0; first < 6; ++first)
    for (int64_t count = 0; count <= 6 - first; ++count)
      EXPECT_EQ(interleaved_ids({3, 1, 2}, first, count),
                std::vector<int64_t>(want.begin() + first, want.begin() + first + count));
  EXPECT_EQ(interleaved_ids({0, 2}, 0, 5), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(interleaved_ids({4}, 4, 3).empty());
  EXPECT_THROW(interleaved_ids({4}, -1, 1), ConfigError);
}

}  // namespace
}  // namespace mllm
