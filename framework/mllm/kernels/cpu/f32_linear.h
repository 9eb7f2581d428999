// Float32 linear layers on the CPU for training, in one product each and with the layers that
// read one input as one product (the float32 counterparts of bf16_linear.h's training path).
//
// ATen's linear with a bias is addmm: it first copies the bias, broadcast, into every row of the
// output, then runs the GEMM with beta = 1 over it. Its broadcast copy ran at ~7 GB/s (0.07 ms
// of a 0.27 ms [1024, 128] x [128, 128] product at mini's shape on one thread of a 2-vCPU Xeon);
// here the rows are filled with plain row copies and the same GEMM (alpha = beta = 1) runs over
// them: the same values, bit for bit. Q/K/V (and SwiGLU's gate and up) are one product over the
// concatenated weights, whose backward reads the three output gradients in place when they lie
// side by side in one buffer (the fused CPU attention writes dq, dk, dv so: attention.h) and
// gives the input gradient from one product instead of three summed.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace mllm {

// Whether f32_linear / f32_linears take this call: x and weight float32 on the CPU, CPU
// autocast off. In grad mode and out of it alike, so that a forward pass without grad mode
// (activation checkpointing's first pass, evaluation) computes what training does bit for bit:
// one product over concatenated weights can differ in the last bit from separate ones.
bool f32_cpu_linear(const torch::Tensor& x, const torch::Tensor& weight);

// y = x @ weight^T + bias, or max(0, y) with `relu`: x [..., in] float32, weight [out, in]
// float32, bias [out] float32 or undefined -> [..., out] float32 (a plain tensor). The same
// values as torch::linear (and torch::relu of it) bit for bit where torch::linear is one addmm
// (a 2-D or contiguous x; for a strided 3-D x it is matmul and add_, which may round
// differently). Differentiable in x, weight and
// bias: dx = g weight, dweight = g^T x, dbias = the sum of g's rows (AddmmBackward's products;
// ReLU's gradient as threshold_backward(g, y, 0)). With `relu` the output is saved for the
// backward: modifying it in place makes the backward throw (autograd's version check). Outside
// grad mode, or when nothing requires grad, the forward pass alone. Throws mllm::Error unless
// f32_cpu_linear(x, weight) and the shapes agree.
torch::Tensor f32_linear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias, bool relu = false);

// f32_linear(x, weights[i], biases[i]) for each i as one product: weights [out_i, in] float32
// (concatenated, [sum out_i, in]), biases [out_i] float32 (all or none: empty) -> outputs
// [..., out_i] float32, views of one [..., sum out_i] tensor (not to be modified in place:
// autograd forbids it for views made in a custom Function). Backward: the outputs' gradients
// side by side (in place where they already lie so, else concatenated; zeros for an output no
// loss reads), one input-gradient product, one weight-gradient product and one bias sum, split
// back to the layers. Outside grad mode, or when nothing requires grad, the forward pass alone.
// Throws mllm::Error unless f32_cpu_linear(x, weights[i]) for every i, the in-features agree
// and there is one bias [out_i] per weight or none.
std::vector<torch::Tensor> f32_linears(const torch::Tensor& x,
                                       const std::vector<torch::Tensor>& weights,
                                       const std::vector<torch::Tensor>& biases);

// parts (at least one) [rows, out_i], 2-D, of one dtype -> [rows, sum out_i], part i in its
// columns: a view of their buffer where they already lie side by side in it, in order, with one
// row stride, else their concatenation (at::cat). Used by the backward passes of f32_linears
// and bf16_autocast_linears. Throws mllm::Error for no parts.
torch::Tensor side_by_side(const std::vector<torch::Tensor>& parts);

}  // namespace mllm
