// Seeded per-epoch permutations (splitmix64 + Fisher-Yates) and the rank-sharded batch sampler.
#include "mllm/data/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "mllm/core/error.h"

namespace mllm {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t uniform_below(uint64_t& state, uint64_t bound) {
  // Accept only draws below the largest multiple of `bound`, so every residue is equally likely.
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % bound);
  uint64_t x;
  do {
    x = splitmix64(state);
  } while (x >= limit);
  return x % bound;
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> perm(size_t(std::max<int64_t>(0, n)));
  std::iota(perm.begin(), perm.end(), int64_t(0));
  uint64_t state = seed;
  for (int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(uniform_below(state, uint64_t(i) + 1));
    std::swap(perm[size_t(i)], perm[size_t(j)]);
  }
  return perm;
}

uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  uint64_t state = seed + uint64_t(epoch) * 0xD1B54A32D192ED03ull;
  return splitmix64(state);
}

DistributedSampler::DistributedSampler(int64_t num_sequences, int64_t global_batch,
                                       int64_t micro_batch, int rank, int world_size,
                                       uint64_t seed)
    : num_sequences_(num_sequences),
      global_batch_(global_batch),
      micro_batch_(micro_batch),
      rank_(rank),
      world_size_(world_size),
      seed_(seed) {
  if (global_batch <= 0 || micro_batch <= 0 || world_size <= 0)
    throw ConfigError(fmt::format("sampler: global_batch ({}), micro_batch ({}) and world size "
                                  "({}) must be positive",
                                  global_batch, micro_batch, world_size));
  if (rank < 0 || rank >= world_size)
    throw ConfigError(fmt::format("sampler: rank {} is outside [0, {})", rank, world_size));
  if (global_batch % (micro_batch * world_size) != 0)
    throw ConfigError(fmt::format("train.global_batch = {} is not a multiple of train.micro_batch "
                                  "x world size = {} x {}; choose a global batch divisible by {}",
                                  global_batch, micro_batch, world_size, micro_batch * world_size));
  steps_per_epoch_ = num_sequences / global_batch;
  if (steps_per_epoch_ == 0)
    throw ConfigError(fmt::format("the training data has {} sequences, fewer than one global batch "
                                  "(train.global_batch = {}); use a smaller global batch, a "
                                  "shorter data.seq_len, or more data",
                                  num_sequences, global_batch));
}

const std::vector<int64_t>& DistributedSampler::permutation(int64_t epoch) const {
  if (epoch != cached_epoch_) {
    cached_perm_ = seeded_permutation(num_sequences_, epoch_seed(seed_, epoch));
    cached_epoch_ = epoch;
  }
  return cached_perm_;
}

std::vector<int64_t> DistributedSampler::global_batch_ids(int64_t epoch, int64_t step) const {
  MLLM_CHECK(step >= 0 && step < steps_per_epoch_, "global batch step out of range");
  const auto& perm = permutation(epoch);
  const auto first = perm.begin() + step * global_batch_;
  return std::vector<int64_t>(first, first + global_batch_);
}

std::vector<std::vector<int64_t>> DistributedSampler::next_step() {
  const auto& perm = permutation(state_.epoch);
  const int64_t per_rank = global_batch_ / world_size_;
  const int64_t begin = state_.step_in_epoch * global_batch_ + rank_ * per_rank;
  std::vector<std::vector<int64_t>> micro;
  for (int64_t m = 0; m < accumulation_steps(); ++m) {
    const auto first = perm.begin() + begin + m * micro_batch_;
    micro.emplace_back(first, first + micro_batch_);
  }
  if (++state_.step_in_epoch == steps_per_epoch_) {
    state_.step_in_epoch = 0;
    ++state_.epoch;
  }
  return micro;
}

void DistributedSampler::load_state(const SamplerState& s) {
  if (!s.drawn.empty())
    throw CheckpointError("the checkpoint's sampler drew from a mixture of data.sources; this "
                          "recipe trains on one corpus: restore data.sources or start a new run");
  if (s.epoch < 0 || s.step_in_epoch < 0 || s.step_in_epoch >= steps_per_epoch_)
    throw CheckpointError(fmt::format("sampler state (epoch {}, step {}) does not fit this data "
                                      "({} steps per epoch); the checkpoint was made with other "
                                      "data or batch settings",
                                      s.epoch, s.step_in_epoch, steps_per_epoch_));
  state_ = s;
}

namespace {

// What a mixture's weights are divided by before they are summed: 1, or, where their sum
// overflows a double (each weight is finite, so some are near DBL_MAX), the largest weight,
// which makes the sum at most the number of sources and keeps the shares.
double weight_scale(const std::vector<double>& weights) {
  if (weights.empty() || std::isfinite(std::accumulate(weights.begin(), weights.end(), 0.0)))
    return 1.0;
  return *std::max_element(weights.begin(), weights.end());
}

}  // namespace

std::vector<double> cumulative_weights(const std::vector<double>& weights) {
  const double scale = weight_scale(weights);
  double total = 0;
  std::vector<double> out;
  for (double w : weights) out.push_back(total += w / scale);
  return out;
}

std::vector<double> mixture_shares(const std::vector<double>& weights) {
  const std::vector<double> cumulative = cumulative_weights(weights);
  const double scale = weight_scale(weights);
  std::vector<double> out;
  for (double w : weights) out.push_back(w / scale / cumulative.back());
  return out;
}

MixtureSampler::MixtureSampler(std::vector<int64_t> sizes, std::vector<double> weights,
                               int64_t global_batch, int64_t micro_batch, int rank,
                               int world_size, uint64_t seed)
    : sizes_(std::move(sizes)),
      global_batch_(global_batch),
      micro_batch_(micro_batch),
      rank_(rank),
      world_size_(world_size),
      seed_(seed) {
  DistributedSampler check(global_batch, global_batch, micro_batch, rank, world_size, seed);
  if (sizes_.empty() || sizes_.size() != weights.size())
    throw ConfigError(fmt::format("mixture sampler: {} sources but {} weights", sizes_.size(),
                                  weights.size()));
  int64_t offset = 0;
  for (size_t s = 0; s < sizes_.size(); ++s) {
    if (sizes_[s] < 1)
      throw ConfigError(fmt::format("data.sources[{}] holds no training sequence (data.seq_len "
                                    "too long for its text?); give it more text or drop it",
                                    s));
    if (!(weights[s] > 0) || !std::isfinite(weights[s]))
      throw ConfigError(fmt::format("data.sources[{}].weight = {} must be positive and finite",
                                    s, weights[s]));
    offsets_.push_back(offset);
    offset += sizes_[s];
  }
  cumulative_ = cumulative_weights(weights);
  drawn_.assign(sizes_.size(), 0);
  cached_epoch_.assign(sizes_.size(), -1);
  cached_perm_.resize(sizes_.size());
}

const std::vector<int64_t>& MixtureSampler::permutation(int source, int64_t epoch) {
  const auto s = size_t(source);
  if (cached_epoch_[s] != epoch) {
    cached_perm_[s] = seeded_permutation(sizes_[s], epoch_seed(seed_ + 1 + uint64_t(source), epoch));
    cached_epoch_[s] = epoch;
  }
  return cached_perm_[s];
}

std::vector<int> MixtureSampler::slot_sources(int64_t step) const {
  uint64_t state = epoch_seed(seed_ ^ kMixtureSeed, step);
  const double total = cumulative_.back();
  std::vector<int> out(static_cast<size_t>(global_batch_));
  for (auto& src : out) {
    const double u = double(splitmix64(state) >> 11) * 0x1.0p-53 * total;
    src = int(std::upper_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin());
    src = std::min(src, int(cumulative_.size()) - 1);
  }
  return out;
}

std::vector<std::vector<int64_t>> MixtureSampler::next_step() {
  // Every rank draws the whole global batch, so the draws per source stay the same everywhere.
  std::vector<int64_t> ids;
  ids.reserve(size_t(global_batch_));
  for (int s : slot_sources(step_)) {
    const int64_t j = drawn_[size_t(s)]++;
    const int64_t n = sizes_[size_t(s)];
    const int64_t epoch = j / n;
    if (j > 0 && j % n == 0) new_epochs_.emplace_back(s, epoch);
    ids.push_back(offsets_[size_t(s)] + permutation(s, epoch)[size_t(j % n)]);
  }
  ++step_;
  const int64_t per_rank = global_batch_ / world_size_;
  std::vector<std::vector<int64_t>> micro;
  for (int64_t m = 0; m < accumulation_steps(); ++m) {
    const auto first = ids.begin() + rank_ * per_rank + m * micro_batch_;
    micro.emplace_back(first, first + micro_batch_);
  }
  return micro;
}

SamplerState MixtureSampler::state() const {
  SamplerState s;
  s.step_in_epoch = step_;
  s.drawn = drawn_;
  return s;
}

void MixtureSampler::load_state(const SamplerState& s) {
  if (s.drawn.size() != sizes_.size())
    throw CheckpointError(fmt::format(
        "the checkpoint's sampler drew from {} data source(s), this recipe has {}; the mixture "
        "cannot be continued (restore data.sources or start a new run)",
        s.drawn.empty() ? 1 : s.drawn.size(), sizes_.size()));
  for (int64_t d : s.drawn)
    if (d < 0) throw CheckpointError("sampler state: a negative draw count");
  if (s.step_in_epoch < 0) throw CheckpointError("sampler state: a negative step");
  step_ = s.step_in_epoch;
  drawn_ = s.drawn;
  new_epochs_.clear();
}

std::vector<std::pair<int, int64_t>> MixtureSampler::take_new_epochs() {
  std::vector<std::pair<int, int64_t>> out;
  out.swap(new_epochs_);
  return out;
}

int64_t MixtureSampler::source_of(int64_t id) const {
  return int64_t(std::upper_bound(offsets_.begin(), offsets_.end(), id) - offsets_.begin()) - 1;
}

std::vector<int64_t> interleaved_ids(const std::vector<int64_t>& sizes, int64_t first,
                                     int64_t count) {
  if (first < 0 || count < 0)
    throw ConfigError(fmt::format("interleaved_ids: negative position {} or count {}", first, count));
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (int64_t n : sizes) {
    if (n < 0) throw ConfigError("interleaved_ids: a negative source size");
    offsets.push_back(total);
    total += n;
  }
  // Rounds come in stretches with the same sources still active: [round_a, round_b) holds
  // |active| ids per round, starting at position pos.
  std::vector<int64_t> ends(sizes);
  std::sort(ends.begin(), ends.end());
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  std::vector<int64_t> out;
  int64_t round_a = 0, pos = 0;
  for (int64_t round_b : ends) {
    if (round_b <= round_a) continue;
    std::vector<size_t> active;
    for (size_t s = 0; s < sizes.size(); ++s)
      if (sizes[s] >= round_b) active.push_back(s);
    const int64_t per_round = int64_t(active.size());
    const int64_t stretch = (round_b - round_a) * per_round;
    for (int64_t i = std::max(first, pos); i < std::min(first + count, pos + stretch); ++i) {
      const int64_t k = i - pos;
      out.push_back(offsets[active[size_t(k % per_round)]] + round_a + k / per_round);
    }
    pos += stretch;
    round_a = round_b;
  }
  return out;
}

std::vector<int64_t> val_batch_indices(int64_t num_sequences, int64_t batch, int64_t micro_batch) {
  if (micro_batch <= 0 || batch < 0)
    throw ConfigError(fmt::format("val batch: need micro_batch > 0 and batch >= 0 (got "
                                  "micro_batch {}, batch {})", micro_batch, batch));
  const int64_t begin = batch * micro_batch;
  const int64_t end = std::min(begin + micro_batch, num_sequences);
  std::vector<int64_t> ids;
  for (int64_t i = begin; i < end; ++i) ids.push_back(i);
  return ids;
}

std::vector<int64_t> val_batches_of_rank(int64_t batches, int64_t num_sequences,
                                         int64_t micro_batch, int rank, int world_size) {
  if (world_size <= 0 || rank < 0 || rank >= world_size)
    throw ConfigError(fmt::format("val batches: need 0 <= rank < world size (got rank {}, world "
                                  "size {})", rank, world_size));
  const int64_t n = std::min(batches, val_batch_count(num_sequences, micro_batch));
  std::vector<int64_t> out;
  for (int64_t b = rank; b < n; b += world_size) out.push_back(b);
  return out;
}

int64_t val_batch_count(int64_t num_sequences, int64_t micro_batch) {
  return micro_batch > 0 ? (num_sequences + micro_batch - 1) / micro_batch : 0;
}

}  // namespace mllm
