// The distributed sampler: a seeded permutation of all sequences per epoch; global batch k of an
// epoch is permutation[k*G, (k+1)*G) whatever the world size, and rank r takes the contiguous
// block [r*G/W, (r+1)*G/W) of it, cut into micro-batches. The incomplete last global batch of an
// epoch is dropped. The RNG is implemented here (splitmix64 + Fisher-Yates) so the order is the
// same on every platform and library version.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace mllm {

// splitmix64 (Steele, Lea, Flood 2014; the reference from https://prng.di.unimi.it/splitmix64.c):
// advances `state` by 0x9E3779B97F4A7C15 and returns the mixed output.
uint64_t splitmix64(uint64_t& state);

// Uniform integer in [0, bound) from splitmix64 by rejection (no modulo bias). bound >= 1.
uint64_t uniform_below(uint64_t& state, uint64_t bound);

// A permutation of 0..n-1: Fisher-Yates (Knuth 3.4.2 Algorithm P, i from n-1 down to 1, j =
// uniform_below(i + 1)) over a splitmix64 stream started at `seed`.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

// Seed of epoch `epoch`'s permutation: splitmix64 applied to (seed + epoch * 0xD1B54A32D192ED03).
uint64_t epoch_seed(uint64_t seed, int64_t epoch);

// Position in the sequence of global batches; the same for every rank and world size.
struct SamplerState {
  int64_t epoch = 0;          // MixtureSampler: 0
  int64_t step_in_epoch = 0;  // MixtureSampler: global batches drawn so far
  std::vector<int64_t> drawn; // MixtureSampler: sequences drawn from each source so far
};

// What the trainer draws its batches from: this rank's micro-batches of each optimizer step.
class BatchSampler {
 public:
  virtual ~BatchSampler() = default;
  // This rank's micro-batches for the next optimizer step: accumulation_steps() vectors of
  // micro_batch sequence ids. Advances one step.
  virtual std::vector<std::vector<int64_t>> next_step() = 0;
  virtual int64_t accumulation_steps() const = 0;
  virtual SamplerState state() const = 0;
  // Continues from `s` (saved by any world size). Throws CheckpointError when s does not fit.
  virtual void load_state(const SamplerState& s) = 0;
};

class DistributedSampler : public BatchSampler {
 public:
  // Throws ConfigError when global_batch % (micro_batch * world_size) != 0, any size is not
  // positive, rank is outside [0, world_size), or num_sequences < global_batch (an epoch
  // without one full global batch).
  DistributedSampler(int64_t num_sequences, int64_t global_batch, int64_t micro_batch, int rank,
                     int world_size, uint64_t seed);

  // This rank's micro-batches for the next optimizer step: accumulation_steps() vectors of
  // micro_batch sequence ids. Advances one step (into the next epoch after the last full
  // global batch).
  std::vector<std::vector<int64_t>> next_step() override;

  // All ids of global batch `step` of epoch `epoch` (every rank's part, in rank order).
  std::vector<int64_t> global_batch_ids(int64_t epoch, int64_t step) const;

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t accumulation_steps() const override {
    return global_batch_ / (micro_batch_ * world_size_);
  }
  SamplerState state() const override { return state_; }
  // Continues from `s` (saved by any world size). Throws CheckpointError when s is not a
  // position of this dataset (negative, step_in_epoch >= steps_per_epoch(), or a mixture's).
  void load_state(const SamplerState& s) override;

 private:
  const std::vector<int64_t>& permutation(int64_t epoch) const;

  int64_t num_sequences_, global_batch_, micro_batch_;
  int rank_, world_size_;
  uint64_t seed_;
  int64_t steps_per_epoch_;
  SamplerState state_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_perm_;
};

// A mixture of sources (data.sources) drawn by weight. Global batch k: each of its G slots picks
// a source with probability weight / sum of weights, from a splitmix64 stream seeded by
// epoch_seed(seed ^ kMixtureSeed, k) (u = top 53 bits / 2^53, the first source whose cumulative
// weight exceeds u * total); a source's j-th draw is sequence perm_e[j mod n] of its own epoch
// e = j / n, perm_e = seeded_permutation(n, epoch_seed(seed + 1 + source, e)) — a source that runs
// out wraps into its next epoch, every sequence used once per epoch. Ids are global: source s's
// sequence i is offsets[s] + i (offsets = prefix sums of the source sizes). Rank r takes the
// block [r G/W, (r+1) G/W) of the slots, as DistributedSampler. The state (step, draws per source)
// is independent of the world size, so a checkpoint resumes exactly at any world size.
inline constexpr uint64_t kMixtureSeed = 0x4D49585455524531ull;  // "MIXTURE1"

// The running sums of a mixture's weights (each > 0 and finite), the scale the draws compare
// against. Where the sum overflows a double (weights near DBL_MAX), the sums of the weights over
// the largest one: the same shares, a finite total. Otherwise the plain running sums.
std::vector<double> cumulative_weights(const std::vector<double>& weights);
// weight / sum of weights of each source, computed as the draws see it (cumulative_weights), in
// [0, 1] and summing to 1 up to rounding, for any positive finite weights.
std::vector<double> mixture_shares(const std::vector<double>& weights);

class MixtureSampler : public BatchSampler {
 public:
  // `sizes`: sequences per source (each >= 1); `weights`: > 0 and finite, one per source (any
  // such weights: their sum may overflow, cumulative_weights). Throws ConfigError as
  // DistributedSampler does, and for a source without a sequence or a weight that is not
  // positive and finite.
  MixtureSampler(std::vector<int64_t> sizes, std::vector<double> weights, int64_t global_batch,
                 int64_t micro_batch, int rank, int world_size, uint64_t seed);

  std::vector<std::vector<int64_t>> next_step() override;
  // The source of each slot of global batch `step` (every rank's part, in slot order).
  std::vector<int> slot_sources(int64_t step) const;
  int64_t accumulation_steps() const override {
    return global_batch_ / (micro_batch_ * world_size_);
  }
  SamplerState state() const override;
  // Throws CheckpointError when `s` was not saved by a mixture of as many sources.
  void load_state(const SamplerState& s) override;
  // Sequences drawn from each source so far (all ranks).
  const std::vector<int64_t>& drawn() const { return drawn_; }
  // (source, epoch) of every source that began a new epoch since the last call.
  std::vector<std::pair<int, int64_t>> take_new_epochs();
  int64_t source_of(int64_t id) const;  // the source of global id `id`

 private:
  const std::vector<int64_t>& permutation(int source, int64_t epoch);

  std::vector<int64_t> sizes_, offsets_;
  std::vector<double> cumulative_;  // running sums of the weights
  int64_t global_batch_, micro_batch_;
  int rank_, world_size_;
  uint64_t seed_;
  int64_t step_ = 0;
  std::vector<int64_t> drawn_;
  std::vector<int64_t> cached_epoch_;
  std::vector<std::vector<int64_t>> cached_perm_;
  std::vector<std::pair<int, int64_t>> new_epochs_;
};

// Positions [first, first + count) of the round-robin order over sources of `sizes` sequences
// each (source 0's first, source 1's first, ..., source 0's second, ...; a source that has run
// out is skipped), as global ids (sum of the earlier sources' sizes + index in the source).
// Clipped at the total. A mixture's validation reads its sources in this order, so that the
// first val batches hold every source. Throws ConfigError for a negative size or position.
std::vector<int64_t> interleaved_ids(const std::vector<int64_t>& sizes, int64_t first,
                                     int64_t count);

// Validation reads in a fixed order, each sequence at most once, and the same sequences at any
// world size: val batch `batch` (0-based) is sequences [batch*M, (batch+1)*M) clipped to
// num_sequences (M = micro_batch), empty past the end. An evaluation of B batches reads
// batches 0..B-1; rank r of W evaluates batches r, r+W, r+2W, ... (val_batches_of_rank), so the
// val loss (a sum over the same sequences) does not depend on W.
// Throws ConfigError for a non-positive micro_batch or a negative batch.
std::vector<int64_t> val_batch_indices(int64_t num_sequences, int64_t batch, int64_t micro_batch);

// The val batches rank `rank` of `world_size` evaluates out of batches 0..batches-1 that hold
// sequences (at most val_batch_count): rank, rank + world_size, ... Throws ConfigError for a
// bad rank or world size.
std::vector<int64_t> val_batches_of_rank(int64_t batches, int64_t num_sequences,
                                         int64_t micro_batch, int rank, int world_size);

// Number of val batches that cover all sequences: ceil(num_sequences / micro_batch).
int64_t val_batch_count(int64_t num_sequences, int64_t micro_batch);

}  // namespace mllm
