// Dropout as a module of the model families: a drop-in for torch::nn::Dropout(p) that runs the
// op of kernels/dropout.h (mllm's counter-based kernel on the CPU, LibTorch's on CUDA).
#pragma once

#include <torch/torch.h>

#include "mllm/kernels/dropout.h"

namespace mllm {

// No parameters or buffers, so state dicts and checkpoints are unchanged against
// torch::nn::Dropout. Throws mllm::Error for p outside [0, 1).
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
