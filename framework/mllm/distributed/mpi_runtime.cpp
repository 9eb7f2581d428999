// MPI start-up/shutdown, return-code checks, abort_job, and the communication thread that runs
// the collectives of our MPI communicators (see mpi_runtime.h).
#include "mllm/distributed/mpi_runtime.h"

#include <chrono>
#include <cstdlib>
#include <deque>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "mllm/core/crash_report.h"
#include "mllm/core/error.h"
#include "mllm/core/trace.h"
#include "mllm/core/logging.h"

namespace mllm {
namespace detail {
namespace {

// The communication thread. Why a thread of our own: OpenMPI progresses a non-blocking
// collective only while some thread is inside an MPI call, so an MPI_Iallreduce started from
// an autograd hook would mostly sit idle until the final wait. A thread that runs the (blocking)
// collectives one after the other overlaps them with backward for real, and being the only
// thread that calls MPI while training runs, it needs no more than MPI_THREAD_SERIALIZED.
class MpiExecutor {
 public:
  MpiExecutor() : thread_([this] { loop(); }) {}

  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) throw CommError("collective submitted after MPI shutdown began (at exit)");
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

  // Stops the thread once the queue is empty. Returns false when it did not stop within
  // `grace_s` (a collective hanging because another rank left); the thread is then detached.
  bool shutdown(double grace_s) {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
    bool ok = cv_.wait_for(lock, std::chrono::duration<double>(grace_s), [&] { return exited_; });
    lock.unlock();
    if (ok)
      thread_.join();
    else
      thread_.detach();
    return ok;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping and drained
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();  // tasks catch their own exceptions (submit_mpi_task)
      lock.lock();
    }
    exited_ = true;
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  bool exited_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

std::mutex g_mpi_mu;             // guards the three below
int g_thread_level = -1;         // MPI_THREAD_* provided; -1 before init
bool g_we_initialised = false;   // we own MPI_Finalize
MpiExecutor* g_executor = nullptr;  // leaked on purpose: must outlive static destructors

MpiExecutor& executor() {
  std::lock_guard<std::mutex> lock(g_mpi_mu);
  if (!g_executor) g_executor = new MpiExecutor();
  return *g_executor;
}

// atexit: drain the communication thread, then finalise MPI if we started it.
void finalize_mpi_at_exit() {
  MpiExecutor* exec = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mpi_mu);
    exec = g_executor;
  }
  bool drained = true;
  if (exec) drained = exec->shutdown(5.0);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!g_we_initialised || finalized) return;
  if (!drained) {
    // A collective is still blocked inside MPI (another rank died or never joined): calling
    // MPI_Finalize would hang too, so we leave and let the launcher report the job as failed.
    spdlog::error("exiting with a collective still in flight; MPI_Finalize skipped");
    flush_logs();
    return;
  }
  MPI_Finalize();
}

}  // namespace

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS || len <= 0)
    return fmt::format("unknown MPI error {}", code);
  return std::string(text, static_cast<size_t>(len));
}

void check_mpi(int code, const char* op, int rank) {
  if (code == MPI_SUCCESS) return;
  throw CommError(fmt::format("{} failed on rank {}: MPI error {} ({})", op, rank, code,
                              mpi_error_string(code)));
}

// Polling schedule of wait_request (see mpi_runtime.h).
constexpr int kYieldPollUs = 1000, kMinSleepUs = 25, kMaxSleepUs = 200;

void wait_request(MPI_Request* request, const char* op, int rank) {
  using namespace std::chrono;
  const auto yield_until = steady_clock::now() + microseconds(kYieldPollUs);
  auto pause = microseconds(kMinSleepUs);
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(request, &done, MPI_STATUS_IGNORE), op, rank);
    if (done) return;
    if (steady_clock::now() < yield_until) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    if (pause < microseconds(kMaxSleepUs)) pause *= 2;
  }
}

AsyncWork::AsyncWork(std::string what, int rank, double timeout_s)
    : what_(std::move(what)), rank_(rank), timeout_s_(timeout_s) {}

void AsyncWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

bool AsyncWork::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void AsyncWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return done_; };
  if (timeout_s_ > 0) {
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), ready)) {
      lock.unlock();
      const int64_t step = current_step();
      std::string msg = fmt::format(
          "rank {}: {}{} did not finish within dist.timeout_s = {} s; another rank is probably "
          "stuck or dead (see its log). Aborting the job.",
          rank_, step > 0 ? fmt::format("step {}: ", step) : std::string(), what_, timeout_s_);
      spdlog::error(msg);
      flush_logs();
      abort_job(1);
      throw CommError(msg);  // abort_job returned: nobody else to stop
    }
  } else {
    cv_.wait(lock, ready);
  }
  if (error_) std::rethrow_exception(error_);
}

std::shared_ptr<AsyncWork> submit_mpi_task(std::string what, int rank, double timeout_s,
                                           std::function<void()> body) {
  // profile.steps: the collective appears in the trace on the communication thread, named by
  // the issuing thread's trace::Label ("bucket 3 reduce-scatter") or else by `what`.
  std::string range;
  if (trace::active()) range = trace::label().empty() ? what : trace::label();
  auto work = std::make_shared<AsyncWork>(std::move(what), rank, timeout_s);
  executor().submit([work, body = std::move(body), range = std::move(range)] {
    try {
      std::optional<trace::Scope> scope;
      if (!range.empty()) scope.emplace(range);
      body();
      work->finish(nullptr);
    } catch (...) {
      work->finish(std::current_exception());
    }
  });
  return work;
}

int mpi_thread_level() {
  std::lock_guard<std::mutex> lock(g_mpi_mu);
  return g_thread_level;
}

}  // namespace detail

void ensure_mpi_initialized() {
  std::lock_guard<std::mutex> lock(detail::g_mpi_mu);
  if (detail::g_thread_level >= 0) return;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw CommError("MPI was already finalised in this process; cannot start it again");
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    // MULTIPLE lets abort_job run on the training thread while the communication thread is
    // inside a hung collective; SERIALIZED is enough for everything else.
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    detail::check_mpi(rc, "MPI_Init_thread", -1);
    detail::g_we_initialised = true;
    // MPI_Init put OpenMPI's fatal-signal handlers in place; ours goes in front of them again.
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    install_crash_report(world_rank);
    std::atexit(detail::finalize_mpi_at_exit);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    throw CommError(fmt::format(
        "MPI provides thread level {} but mllm needs at least MPI_THREAD_SERIALIZED ({}) for its "
        "communication thread; if the program initialises MPI itself, use MPI_Init_thread with "
        "MPI_THREAD_MULTIPLE, or use an MPI built with thread support",
        provided, static_cast<int>(MPI_THREAD_SERIALIZED)));
  detail::g_thread_level = provided;
}

void abort_job(int exit_code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world <= 1) return;
  flush_logs();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort should not return; make sure this rank stops anyway
}

}  // namespace mllm
