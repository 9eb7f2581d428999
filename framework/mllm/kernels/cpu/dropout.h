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
// The op, with its choice between this kernel and LibTorch's, is kernels/dropout.h.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace mllm {

// One dropout call's mask parameters, for a fused kernel that applies mllm::dropout's mask itself
// (cpu/attention.h, cpu/norm.h): `seed` is one draw from the default CPU generator (as each
// dropout call in training takes), `threshold` the 24-bit drop threshold round(p * 2^24), `scale`
// 1 / (1 - p). Element i of the kernel's contiguous output is kept when its field of
// dropout_bits::pair_bits(seed, i / 2) (.even for even i, .odd for odd i) is >= threshold —
// the mask mllm::dropout would draw for that output. Throws mllm::Error for p outside [0, 1).
struct DropoutDraw {
  uint64_t seed;
  uint32_t threshold;
  float scale;
};
DropoutDraw draw_dropout(double p);

namespace cpu {

// x * keep * draw.scale with draw's mask: x any shape, float32 / bfloat16 / float16 on the CPU ->
// the same shape and dtype, contiguous (the product rounded once to x's dtype). Differentiable in
// x: the backward regenerates the mask from the seed and applies it to the gradient.
torch::Tensor dropout(const torch::Tensor& x, const DropoutDraw& draw);

// Whether dropout_add below takes these: a float32 residual and a bf16 branch of one shape, both
// contiguous on the CPU (the residual stream and a block's output under bf16 autocast).
bool dropout_add_applies(const torch::Tensor& residual, const torch::Tensor& branch);

// residual + dropout(branch) in one pass, with draw's mask (nullptr: every element kept, no
// hash): the branch dropped, scaled, rounded to bf16 as dropout rounds it, and added in float32
// -> float32 [residual's shape]. Backward: the residual's gradient passes through, the branch's
// is rounded to bf16 and masked in one pass. Requires dropout_add_applies.
torch::Tensor dropout_add(const torch::Tensor& residual, const torch::Tensor& branch,
                          const DropoutDraw* draw);

// Whether softmax_dropout below takes scores: bf16, contiguous, on the CPU, with an even last
// dimension.
bool softmax_dropout_applies(const torch::Tensor& scores);

// dropout(softmax(scores, -1)) with draw's mask: the forward LibTorch's softmax and this mask (the
// same values); the backward one pass (the mask, then (g - sum(g * y)) * y in float32, rounded
// once to bf16) instead of two. scores [..., keys] bf16 -> [..., keys] bf16. Requires
// softmax_dropout_applies.
torch::Tensor softmax_dropout(const torch::Tensor& scores, const DropoutDraw& draw);

}  // namespace cpu
}  // namespace mllm
