// DataParallel: keeps full model replicas identical across ranks. Start-up broadcast and model
// check; gradient buckets all-reduced (averaged) from autograd hooks while backward still runs;
// no communication on non-final micro-steps; global-token loss normalisation; global-norm
// clipping. Design after PyTorch DDP's c10d reducer (reverse-order buckets by bytes).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mllm/distributed/communicator.h"

namespace mllm {

class DataParallel {
 public:
  // `model`: any torch::nn::Module (pass holder.ptr() for ModuleHolder types); its parameters
  // that require grad are packed into buckets of at most `bucket_bytes` (dist.bucket_mb * 2^20)
  // in reverse registration order, and an autograd hook is registered on each (on its gradient
  // accumulator, so it fires once the parameter's .grad holds this backward's contribution).
  // Parameters shared under two names count once. Sync starts enabled. Build it after the model
  // is on its device and in its final dtype (buckets are planned per dtype and device).
  // Throws Error when bucket_bytes <= 0 or model/comm is null.
  //
  // `zero_stage` 1 (ZeRO stage 1, Rajbhandari et al. 2020, "optimizer state partitioning"): each
  // bucket's gradient is reduce-scattered instead of all-reduced, so this rank ends the step with
  // the averaged gradient of its contiguous slice of every flat bucket (shard_range) only. The
  // slices are exposed as shard_segments(), one per (parameter, slice) intersection, which an
  // optimizer updates in place (they alias the parameters' memory); all_gather_params() then
  // brings every rank's updated slices back into every replica.
  //
  // `zero_stage` 2 (ZeRO stage 2, "gradient partitioning"): as stage 1, and the gradients too are
  // kept only for this rank's slices. Every backward (every micro-step of an accumulation, so
  // call finish_gradient_sync() after each; set_sync(false) has no effect) copies each bucket's
  // gradients into a full-size buffer that lives while its reduce-scatter is in flight (at most
  // two buckets at once), frees the parameters' .grad, and adds the averaged slice into a
  // persistent gradient shard (1/N of the gradients). zero_grad() starts a new accumulation.
  //
  // `zero_stage` 3 (ZeRO stage 3, "parameter partitioning"; PyTorch FSDP's full sharding): as
  // stage 2, and the parameters too are kept only as this rank's slices (shard_segments() alias
  // them). `unit_of` (required) maps a parameter name to its block (0-based) or to -1 for the
  // parameters outside the blocks (embeddings, final norm, head: the "root" unit). Buckets are
  // the units, one each, whatever bucket_bytes says (last block first, the root last, backward's
  // order). A block's parameters exist in full only between pre_forward(block) and
  // post_forward(block), and between pre_backward(block) and the launch of its bucket's
  // reduce-scatter (the model calls these through its BlockHooks); the root's from
  // pre_model_forward() to the launch of its bucket (the end of backward) or release_params().
  // At other times their storage is freed (the tensors keep their shapes but hold no memory: do
  // not read them). They start whole (this rank's own values) and are cut into shards by
  // broadcast_and_verify (rank 0's values) or, without it, by the first pre_model_forward. The
  // pre_ calls also start the gather of the unit that runs next, so the all-gather overlaps
  // compute. Anything that reads or writes the weights outside a training step holds a
  // FullParams scope.
  // Throws Error when `unit_of` is missing at stage 3, a block mixes dtypes or devices, or a
  // parameter is not contiguous.
  //
  // Throws Error for a zero_stage other than 0, 1, 2 or 3.
  //
  // World size 1 at stage 0: nothing to average, so no hooks, buckets or collectives at all;
  // .grad stays what autograd accumulated (the same values the bucketed path would give).
  DataParallel(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<Communicator> comm,
               int64_t bucket_bytes, int zero_stage = 0,
               std::function<int64_t(const std::string&)> unit_of = {});
  // Removes the hooks.
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Collective. Compares a hash of every parameter's and buffer's name, dtype and shape across
  // ranks, then copies all parameters and buffers from rank 0 to every rank. Throws CommError
  // naming the ranks that differ from rank 0 and their first differing tensor (on every rank,
  // so nobody is left waiting).
  void broadcast_and_verify();

  // Collective (one all-reduce of one int64). `local_real_tokens`: this rank's real (non-PAD)
  // target tokens over all micro-batches of the optimizer step. Returns the factor each
  // micro-batch's *summed* per-token loss must be multiplied by before backward:
  // world_size / global_real_tokens. With the averaging all-reduce this makes the step's gradient
  // grad(sum of per-token losses over the global batch) / global_real_tokens, i.e. the token mean
  // over the whole global batch, not a mean of per-micro-batch means. Returns 0 when the global
  // batch has no real token. `global_real_tokens` (optional) receives the global count.
  // Throws Error for a negative count.
  double loss_scale(int64_t local_real_tokens, int64_t* global_real_tokens = nullptr);

  // Collective (one all-reduce of one double): the global-batch mean loss for logging,
  // sum over ranks of `local_loss_sum` (this rank's summed, unscaled per-token loss for the step)
  // divided by `global_real_tokens` (from loss_scale). Returns 0 when global_real_tokens is 0.
  double global_mean_loss(double local_loss_sum, int64_t global_real_tokens);

  // enabled = false: the next backward passes do no communication at all (non-final micro-steps
  // of gradient accumulation; gradients keep accumulating in .grad locally). enabled = true
  // before the last micro-step's backward. Throws Error while a sync is in flight (between a
  // synced backward and finish_gradient_sync).
  // (At world size 1, stage 0, there is no sync to be in flight: only the flag is kept.)
  // At stage 2 every backward reduce-scatters whatever the flag says.
  void set_sync(bool enabled);
  bool sync_enabled() const { return sync_enabled_.load(); }

  // Call after the last micro-step's backward: launches the buckets that backward did not
  // complete (parameters that got no gradient in that backward contribute their accumulated .grad
  // from earlier micro-steps, or zeros), waits for every bucket, and writes the averaged values
  // into each parameter's .grad. A parameter with no gradient on any rank keeps an undefined
  // .grad. Afterwards .grad is bitwise identical on every rank. No-op while sync is disabled.
  // After the first synced step each .grad aliases its bucket's buffer (no copies in or out).
  // zero_grad(/*set_to_none=*/false) keeps that; LibTorch's default zero_grad() (set_to_none,
  // which the trainer calls) resets the grads to undefined, which costs one copy per parameter
  // at the next sync.
  // No-op at world size 1, stage 0 (see the constructor).
  // Throws CommError when a collective fails.
  void finish_gradient_sync();

  // Call at the start of every optimizer step (before its first backward). Stage 2: the next
  // finish_gradient_sync writes the gradient shards afresh instead of adding to them, and the
  // segments' .grad are undefined until then. No-op at stages 0 and 1.
  void zero_grad();

  // Stages 1 and 2. A contiguous piece of one parameter that this rank updates: elements
  // [begin, end) of the flattened parameter `name`. `param` is a 1-D tensor [end - begin] (the
  // parameter's dtype and device) aliasing the parameter's own memory; after
  // finish_gradient_sync its .grad aliases the averaged gradient of those elements, or is
  // undefined when no rank had a gradient for the parameter. Segments are in bucket order, then
  // parameter order within the bucket; the same on every run with the same model, bucket size
  // and world size.
  struct ShardSegment {
    std::string name;
    int64_t begin = 0, end = 0;
    int64_t param_numel = 0;  // elements of the whole parameter
    torch::Tensor param;
  };
  const std::vector<ShardSegment>& shard_segments() const { return segments_; }
  int zero_stage() const { return zero_stage_; }

  // Stage 1, collective: after the optimizer updated this rank's segments, starts one all-gather
  // per bucket (all in flight at once, in place: at stage 1 each bucket's parameters are views
  // of one flat buffer) that brings every rank's updated slices into every replica, and returns
  // without waiting, so the gathers overlap whatever the caller does before it next reads the
  // weights (logging, loading the next batch). No-op at stage 0. Throws CommError.
  void all_gather_params();
  // Waits for the all-gathers all_gather_params started; afterwards every rank's parameters are
  // bitwise identical. Call before anything reads the weights (a forward, eval, a checkpoint).
  // Returns at once when none is in flight. Throws CommError when a gather failed.
  void wait_params();

  // Stage 3, collective (every rank must call them alike). pre_forward(block): the block's
  // parameters are gathered (waiting for a prefetched gather) and the next block's gather is
  // started; post_forward(block): its storage is freed; pre_backward(block): gathered again
  // (prefetching block - 1); they are freed once the block's gradients have been copied into
  // its bucket. No-ops at stages 0-2 and while a FullParams scope is open (then everything is
  // gathered). Throws CommError when a gather fails, Error for a block out of range.
  void pre_forward(int64_t block);
  void post_forward(int64_t block);
  void pre_backward(int64_t block);
  // Stage 3, collective: call before every training forward (each micro-step): gathers the root
  // unit (embeddings, final norm, head) and starts block 0's gather. No-op at stages 0-2.
  void pre_model_forward();
  // Stage 3: frees every gathered unit (after a forward that has no backward). No-op at stages
  // 0-2 and in a FullParams scope.
  void release_params();

  // Stage 3, collective: gathers every block's parameters (waiting for the gathers) and keeps
  // them until the matching release; nested scopes count. At release, the values the full
  // parameters hold then become the shards (so a load into the model, or a broadcast, lands in
  // the shards) and the blocks' storage is freed. Memory: one full replica of the weights for
  // the scope's duration (checkpoint saves, sampling, the replica check). No-op at stages 0-2
  // (the parameters are always whole there). Not thread-safe against a running backward.
  class FullParams {
   public:
    explicit FullParams(DataParallel& dp);
    ~FullParams();
    FullParams(const FullParams&) = delete;
    FullParams& operator=(const FullParams&) = delete;

   private:
    DataParallel& dp_;
  };

  // Bytes this rank stores for the parameters and the gradients (the bucket buffers, or .grad
  // alone at world size 1; at stage 1 the averaged slice is reduce-scattered in place into the
  // buckets; at stage 2 the gradient shards), the bytes of full-size gradient buffers that exist
  // only during backward (stages 2 and 3: the two largest buckets; 0 otherwise), and the number
  // of elements whose AdamW moments it keeps (all parameters at stage 0, its slices at stages
  // 1-3). Stage 3: param_bytes are the shards, and transient_param_bytes what is gathered at
  // most during a step: the root unit (embeddings, head) plus the two largest blocks (the one
  // computing and the one prefetched). For the start-up memory log.
  struct Footprint {
    int64_t param_bytes = 0, grad_bytes = 0, transient_grad_bytes = 0, optimizer_elements = 0;
    int64_t transient_param_bytes = 0;
  };
  Footprint footprint() const;

  // Global L2 norm of the (synced) gradients, sqrt(sum of squares) accumulated in float64 in a
  // fixed order, so identical on all ranks without communication. When max_norm > 0 and the norm
  // exceeds it, every gradient is multiplied by max_norm / norm (as torch.nn.utils.
  // clip_grad_norm_, without its 1e-6 guard, which only matters for norms near 0 where nothing is
  // clipped). A non-finite norm is returned without clipping. Returns the pre-clip norm.
  // Stage 1: the sum of squares of this rank's gradient slices (float64, fixed order) is
  // all-reduced (one collective, rank-ordered), so every rank gets the same norm; it can differ
  // from stage 0's in the last bits (another summation order). Clipping scales the slices.
  double clip_grad_norm(double max_norm);

  // Collectives DataParallel itself has started (buckets, loss_scale, start-up checks).
  int64_t collectives_issued() const { return collectives_issued_.load(); }

  // Introspection for tests and logs. num_buckets() is the plan (also at world size 1, where
  // no bucket is used); local_only() is true at world size 1, stage 0.
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  bool local_only() const { return local_only_; }
  int64_t bucket_bytes() const { return bucket_bytes_; }
  const std::shared_ptr<Communicator>& communicator() const { return comm_; }

 private:
  struct Param {
    std::string name;
    torch::Tensor tensor;   // shares the module's parameter
    size_t bucket = 0;
    int64_t offset = 0;     // element offset in the bucket buffer
    bool ready = false;     // its hook fired (or was stood in for) in the current synced step
    bool used = false;      // some rank had a gradient for it (stage 1: this step; stage 2:
                            // since zero_grad())
  };
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    int64_t numel = 0;           // gradient elements; a "used" flag per parameter follows them
    int pending = 0;             // parameters not ready yet in the current synced step
    bool launched = false;
    bool all_local = false;      // every parameter had a gradient on this rank (flags all 1)
    torch::Tensor buffer;        // [numel + params.size()], allocated on first launch
    std::shared_ptr<Work> work;
    // Stage 1: this rank's slice of the bucket, its averaged gradient, the flags' all-reduce.
    ShardRange shard;
    torch::Tensor grad_shard;      // [shard.numel()], a view of buffer at shard (in place)
    std::shared_ptr<Work> flags_work;
    std::vector<size_t> segments;  // indices into segments_
    torch::Tensor param_flat;      // [numel]: the bucket's parameters are views of it (stage 1)
    std::shared_ptr<Work> gather_work;
    // Stage 2: the accumulated averaged gradient of this rank's slice [shard.numel()], and
    // whether it holds this step's sum yet (false after zero_grad: the next fold copies).
    torch::Tensor grad_acc;
    bool acc_valid = false;
    bool folded = true;  // launched and folded into grad_acc (or never launched)
    // Stage 3: the block this bucket holds (-1: the parameters outside the blocks), and this
    // unit's own slice of the parameters [shard.numel()] (the master copy the optimizer
    // updates; param_flat holds storage only while gathered). Stages 1-2: param_flat is always
    // whole and the shard a view of it.
    int64_t unit = -1;
    bool gathered = true;  // param_flat has storage (its gather may still be in flight)
    torch::Tensor shard_param;
  };

  void on_grad_ready(size_t param_index);          // the autograd hook
  void launch_ready_buckets_locked();              // in bucket order, as the prefix completes
  void launch_bucket_locked(Bucket& b);
  void reset_step_locked();
  // Stages 1-2: sets `used` for the parameters of b that some rank had a gradient for (the
  // averaged flags; read back only when this rank lacked one). Call after b's flags arrived.
  void mark_used_locked(const Bucket& b);
  // Stage 2: waits for bucket b's reduce-scatter, adds its slice into grad_acc, frees the buffer.
  void fold_bucket_locked(Bucket& b);
  // The averaged gradient of this rank's slice of bucket b (stage 1: in the bucket; stage 2:
  // grad_acc); undefined when the slice is empty.
  const torch::Tensor& shard_grad(const Bucket& b) const;

  // Stage 3: start the gather of bucket b's parameters into param_flat (allocating its storage)
  // unless they are there or on their way; wait for it; free the storage (stage 3 only, unless a
  // FullParams scope is open).
  void gather_locked(Bucket& b);
  void wait_gather_locked(Bucket& b);
  void release_locked(Bucket& b);
  Bucket* block_bucket(int64_t block);  // throws Error for a block out of range
  // The name of bucket b's collective `op` in a profiler trace ("bucket 3 reduce-scatter",
  // stage 3 "block 5 all-gather"); "" when no trace is recorded (core/trace.h).
  std::string trace_label(const Bucket& b, const char* op) const;
  void begin_full_params();
  void end_full_params();
  void end_initial_full();  // closes the constructor's FullParams scope (stage 3), once

  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<Communicator> comm_;
  int64_t bucket_bytes_;
  int zero_stage_ = 0;
  bool local_only_ = false;  // world size 1, stage 0: no hooks, no buckets, no collectives
  std::vector<ShardSegment> segments_;
  std::vector<size_t> segment_param_;  // segments_[i] belongs to params_[segment_param_[i]]
  // Stages 1 and 2: makes every parameter a view of its bucket's param_flat again (Module::load, on a
  // resume, replaces parameters' storage; the values are copied in first) and aims the segments
  // at the flat buffers.
  void adopt_params();
  std::vector<Param> params_;    // parameters that require grad, registration order
  std::vector<Bucket> buckets_;  // launch order (the same on every rank)
  std::vector<size_t> block_bucket_;  // stage 3: the bucket of block i (SIZE_MAX: none)
  size_t root_bucket_ = SIZE_MAX;     // stage 3: the bucket of the parameters outside the blocks
  int full_params_ = 0;               // open FullParams scopes (+1 for the initial one)
  bool initial_full_ = false;         // stage 3: the constructor's scope is still open
  size_t next_launch_ = 0;       // buckets before this one have been launched this step
  bool in_flight_ = false;       // a synced step has started (a hook fired) and is not finished
  std::atomic<bool> sync_enabled_{true};
  std::atomic<int64_t> collectives_issued_{0};
  // Why a mutex: the autograd engine may call hooks from its device threads concurrently.
  std::mutex mu_;
  // (gradient accumulator, hook key) pairs; holding the accumulators keeps them (and so the
  // hooks) alive across backward passes, as the c10d reducer does.
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
};

}  // namespace mllm
