// The residual step with a block's modules (model/norm.h).
#include "mllm/model/norm.h"

namespace mllm {

torch::Tensor dropout_add_layer_norm(const torch::Tensor& residual, const torch::Tensor& branch,
                                     DropoutImpl& drop, torch::nn::LayerNormImpl& norm) {
  const auto& o = norm.options;
  const bool last_dim = residual.dim() >= 1 && o.normalized_shape().size() == 1 &&
                        o.normalized_shape()[0] == residual.size(-1);
  if (!o.elementwise_affine() || !last_dim) return norm.forward(drop.add_to(residual, branch));
  // The op's composition, where its kernel does not apply, is norm.forward(drop.add_to(...)).
  // (drop.p() is in [0, 1): DropoutImpl's constructor checks it.)
  return dropout_add_layer_norm(residual, branch, drop.p(), drop.is_training(), norm.weight,
                                norm.bias, o.eps());
}

}  // namespace mllm
