// Dropout on the CPU without a Bernoulli draw per element. LibTorch's CPU dropout draws every
// mask element from the generator (about 10 ns per element here: 42 ms for the 4.2 M attention
// probabilities of one layer of the small shape, about a third of its forward pass). This one
// takes a single 64-bit seed from the default CPU generator per call and derives element i's
// keep bit from a counter-based hash of (seed, i / 2) — SplitMix64 (Steele, Lea, Flood, "Fast
// splittable pseudorandom number generators", OOPSLA 2014), two 24-bit fields of each 64-bit
// output for elements 2j and 2j + 1 — in parallel, so:
//   - the mask does not depend on the thread count, and resume stays exact (the generator
//     advances by one draw per call and is saved in checkpoints as before);
//   - backward regenerates the mask from the seed instead of keeping it in memory.
// CUDA tensors use at::dropout (LibTorch's GPU kernel is already a counter-based Philox).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace mllm {

// Inverted dropout: in training, y = x * keep / (1 - p) with keep ~ Bernoulli(1 - p) per
// element (P(keep) = 1 - round(p * 2^24) / 2^24); x otherwise, or when p == 0.
// x: any shape, float32 / bfloat16 / float16 (CPU) or any floating dtype (CUDA); y: same shape
// and dtype, contiguous. p in [0, 1). Differentiable in x. Throws mllm::Error for p outside
// [0, 1) or a non-floating x.
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

// residual + dropout(branch, p, training), the same values and the same random draws (one seed
// per call in training with p > 0, none otherwise). For a float32 residual and a bf16 branch of
// one shape, contiguous on the CPU (the residual stream and a block's output under bf16
// autocast) one pass: the branch dropped, scaled, rounded to bf16 as dropout rounds it, and
// added in float32; backward: the residual's gradient passes through, the branch's is rounded to
// bf16 and masked in one pass. Otherwise residual + dropout(branch). Result: the sum's shape
// and dtype (float32 for the fused case). Throws mllm::Error as dropout.
torch::Tensor dropout_add(const torch::Tensor& residual, const torch::Tensor& branch, double p,
                          bool training);

// dropout(softmax(scores, -1), p, training), the same values and random draws (attention's
// probabilities). For bf16 scores, contiguous, with an even last dimension, on the CPU in
// training with p > 0: a backward in one pass (the dropout's mask, then PyTorch's softmax
// backward (g - sum(g * y)) * y in float32, rounded once to bf16) instead of two, which agrees
// with the unfused backward to float32 rounding of the row sum (its summation order differs).
// scores [..., keys] -> [..., keys], scores' dtype. Throws mllm::Error as dropout.
torch::Tensor softmax_dropout(const torch::Tensor& scores, double p, bool training);

// One dropout call's mask parameters, for a fused kernel that applies mllm::dropout's mask itself
// (cpu_attention.h): `seed` is one draw from the default CPU generator (as each dropout call in
// training takes), `threshold` the 24-bit drop threshold round(p * 2^24), `scale` 1 / (1 - p).
// Element i of the kernel's contiguous output is kept when its field of
// dropout_bits::pair_bits(seed, i / 2) (.even for even i, .odd for odd i) is >= threshold —
// the mask mllm::dropout would draw for that output. Throws mllm::Error for p outside [0, 1).
struct DropoutDraw {
  uint64_t seed;
  uint32_t threshold;
  float scale;
};
DropoutDraw draw_dropout(double p);

// The module form, a drop-in for torch::nn::Dropout(p) (no parameters or buffers, so state
// dicts and checkpoints are unchanged).
class DropoutImpl : public torch::nn::Module {
 public:
  explicit DropoutImpl(double p = 0.5);
  torch::Tensor forward(const torch::Tensor& x);
  // forward(softmax(scores, -1)): softmax_dropout with this module's p and training flag.
  torch::Tensor of_softmax(const torch::Tensor& scores);
  // residual + forward(branch): dropout_add with this module's p and training flag.
  torch::Tensor add_to(const torch::Tensor& residual, const torch::Tensor& branch);
  double p() const { return p_; }

 private:
  double p_;
};
TORCH_MODULE(Dropout);

}  // namespace mllm
