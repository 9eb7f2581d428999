// Activation checkpointing: a custom autograd function that keeps the input, rewinds the random
// generators and recomputes in backward.
#include "mllm/model/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <mutex>
#include <utility>

#include "mllm/core/error.h"

namespace mllm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A generator's state, taken and put back under its lock.
torch::Tensor generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
void set_generator_state(at::Generator gen, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// What the recomputation needs besides the input; held by the autograd node until backward.
struct State : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  torch::Device device{torch::kCPU};
  torch::Tensor cpu_rng, device_rng;  // generator states at the forward (device_rng: CUDA only)
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
  bool used = false;
};

// Sets the generators to the forward's states for the scope, then back to where they were.
class RewoundGenerators {
 public:
  explicit RewoundGenerators(const State& s) : device_(s.device) {
    auto cpu = at::detail::getDefaultCPUGenerator();
    now_cpu_ = generator_state(cpu);
    set_generator_state(cpu, s.cpu_rng);
    if (s.device_rng.defined()) {
      auto dev = at::globalContext().defaultGenerator(device_);
      now_device_ = generator_state(dev);
      set_generator_state(dev, s.device_rng);
    }
  }
  ~RewoundGenerators() {
    set_generator_state(at::detail::getDefaultCPUGenerator(), now_cpu_);
    if (now_device_.defined()) set_generator_state(at::globalContext().defaultGenerator(device_), now_device_);
  }
  RewoundGenerators(const RewoundGenerators&) = delete;
  RewoundGenerators& operator=(const RewoundGenerators&) = delete;

 private:
  torch::Device device_;
  torch::Tensor now_cpu_, now_device_;
};

// Autocast for one device type as given, for the scope; the previous state back on exit.
class AutocastAs {
 public:
  AutocastAs(at::DeviceType type, bool enabled, at::ScalarType dtype)
      : type_(type), prev_enabled_(at::autocast::is_autocast_enabled(type)),
        prev_dtype_(at::autocast::get_autocast_dtype(type)) {
    at::autocast::increment_nesting();
    at::autocast::set_autocast_dtype(type_, dtype);
    at::autocast::set_autocast_enabled(type_, enabled);
  }
  ~AutocastAs() {
    at::autocast::set_autocast_enabled(type_, prev_enabled_);
    at::autocast::set_autocast_dtype(type_, prev_dtype_);
    // The weights' casts made by the recomputation must not outlive it (the next forward,
    // after the optimizer step, would read stale casts): leaving the outermost autocast region
    // clears them, as torch.autocast's __exit__ does.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  }
  AutocastAs(const AutocastAs&) = delete;
  AutocastAs& operator=(const AutocastAs&) = delete;

 private:
  at::DeviceType type_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // Runs without grad mode (Function::apply turns it off): nothing inside fn is kept.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               c10::intrusive_ptr<State> state) {
    ctx->save_for_backward({x});
    torch::Tensor y = state->fn(x);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<State>(ctx->saved_data["state"].toCapsule());
    if (state->used)
      throw Error("activation checkpointing: backward ran twice through one checkpointed block; "
                  "the recomputation is kept for one backward only");
    state->used = true;
    const torch::Tensor x = ctx->get_saved_variables()[0];
    torch::Tensor input = x.detach().requires_grad_(true);
    torch::Tensor y;
    {
      RewoundGenerators rewound(*state);
      AutocastAs autocast(state->device.type(), state->autocast, state->autocast_dtype);
      torch::AutoGradMode grad_mode(true);
      // Through a view: autocast caches its casts of leaves that require grad (meant for
      // weights), and would cast the leaf `input` once for all the layers that read it and sum
      // their gradients in bf16; the plain forward's input is no leaf, so each layer casts it
      // and the gradients are summed in float32. A view is never cached: the same as the plain.
      y = state->fn(input.view_as(input));
    }
    // Reentrant backward (as torch.utils.checkpoint's default): accumulates into the parameters'
    // .grad (firing their hooks) and into input.grad.
    torch::autograd::backward({y}, {grad_outputs[0]});
    state->fn = nullptr;  // what the closure captured is no longer needed
    return {input.grad(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpointed(const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                           const torch::Tensor& x) {
  if (!x.requires_grad() || !torch::GradMode::is_enabled()) return fn(x);
  auto state = c10::make_intrusive<State>();
  state->fn = fn;
  state->device = x.device();
  state->cpu_rng = generator_state(at::detail::getDefaultCPUGenerator());
  if (x.is_cuda()) state->device_rng = generator_state(at::globalContext().defaultGenerator(x.device()));
  state->autocast = at::autocast::is_autocast_enabled(x.device().type());
  state->autocast_dtype = at::autocast::get_autocast_dtype(x.device().type());
  return CheckpointFunction::apply(x, std::move(state));
}

ActivationCheckpointing::ActivationCheckpointing(std::string m, int64_t n)
    : mode(std::move(m)), every(n) {
  if (mode != "none" && mode != "full" && mode != "every_n")
    throw ConfigError(fmt::format("model.activation_checkpointing: expected none, full or "
                                  "every_n, got '{}'", mode));
  if (mode == "every_n" && every < 1)
    throw ConfigError(fmt::format("model.checkpoint_every: expected >= 1 with "
                                  "activation_checkpointing: every_n, got {}", every));
}

bool ActivationCheckpointing::applies_to(int64_t layer) const {
  if (mode == "full") return true;
  if (mode == "every_n") return layer % every == 0;
  return false;
}

int64_t ActivationCheckpointing::count(int64_t n_layers) const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers; ++l) n += applies_to(l) ? 1 : 0;
  return n;
}

}  // namespace mllm
