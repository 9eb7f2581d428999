// The host synchronisations of a CUDA training step, found with LibTorch's sync debug mode
// (train.sync_debug): the C++ form of torch.cuda.set_sync_debug_mode("warn"). Each warning
// LibTorch raises at a synchronising CUDA call (a blocking copy, .item(), a stream sync) is
// counted by where it came from: its call stack and the trainer's phase at the time.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

namespace mllm {

// One place that synchronised: how often, in which phase, the first mllm frame and the LibTorch
// operation on its stack, and the stack itself (innermost first, absolute addresses stripped).
struct SyncSite {
  std::string phase;                // forward | backward | gradient sync | optimizer | ... (set_phase)
  std::string mllm_frame;           // e.g. "mllm::Trainer::train_step()"; "" when none
  std::string op_frame;             // e.g. "at::native::_local_scalar_dense_cuda(at::Tensor const&)"
  std::vector<std::string> stack;
  int64_t count = 0;
};

// Collects sync warnings while active. One instance per process (the trainer's).
//
// Limitation (LibTorch's): c10 warning handlers are per thread, and the autograd engine runs a
// CUDA backward on its own device thread, collects that thread's warnings and replays them on the
// thread that called backward() once it returns. Those arrive without their original stack; they
// are counted under phase "backward" with the replay's stack.
class SyncDebug : public c10::WarningHandler {
 public:
  SyncDebug() = default;
  ~SyncDebug() override;
  SyncDebug(const SyncDebug&) = delete;
  SyncDebug& operator=(const SyncDebug&) = delete;

  // Starts collecting on the calling thread; `cuda` also switches LibTorch's CUDA sync debug
  // mode to warn (c10::cuda::warning_state). Returns false, changing nothing, when `cuda` is asked
  // for but this LibTorch was built without CUDA. Other warnings go on to the handler before.
  bool start(bool cuda);
  // Mode back to disabled and the previous warning handler back. Idempotent.
  void stop();
  bool active() const { return active_; }

  // The phase the next warnings are counted under (the trainer sets it around each part of a
  // step); "" outside a step.
  void set_phase(const std::string& phase);

  // Distinct sites, most frequent first.
  std::vector<SyncSite> sites() const;
  // {"steps": steps, "total": n, "per_step": n / steps, "sites": [{phase, mllm_frame, op_frame,
  // count, per_step, stack}]}: what <run>/sync_debug.json holds.
  nlohmann::json report(int64_t steps) const;

  // c10::WarningHandler: counts "called a synchronizing CUDA operation" warnings, passes the
  // others on.
  void process(const c10::Warning& warning) override;

 private:
  mutable std::mutex mu_;
  std::vector<SyncSite> sites_;
  std::string phase_;
  c10::WarningHandler* previous_ = nullptr;
  bool active_ = false;
  bool cuda_ = false;
};

// Whether `message` is the warning LibTorch's sync debug mode raises.
bool is_sync_debug_warning(const std::string& message);

// The frames of a c10::get_backtrace() text, innermost first, as "symbol + 0xOFFSET (in
// library)" without the absolute addresses (which differ per process), starting after the warning
// machinery (c10::warn, WarningHandler, this collector).
std::vector<std::string> clean_backtrace(const std::string& backtrace);

}  // namespace mllm
