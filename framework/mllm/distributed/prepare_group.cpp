// MpiPrepareGroup: all-gathers of byte strings over MPI, for distributed data preparation.
#include "mllm/distributed/prepare_group.h"

#include <fmt/format.h>

#include <climits>

#include "mllm/core/error.h"
#include "mllm/distributed/communicator.h"
#include "mllm/distributed/mpi_runtime.h"

namespace mllm {
namespace {

class MpiPrepareGroup : public PrepareGroup {
 public:
  MpiPrepareGroup() {
    ensure_mpi_initialized();
    run("prepare group set-up (MPI_Comm_dup)", [this] {
      int world_rank = -1;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup", world_rank);
      detail::check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN),
                        "MPI_Comm_set_errhandler", world_rank);
      detail::check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", world_rank);
      detail::check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", world_rank);
    });
  }
  ~MpiPrepareGroup() override {
    if (comm_ == MPI_COMM_NULL) return;
    try {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) run("MPI_Comm_free(prepare group)", [this] { MPI_Comm_free(&comm_); });
    } catch (...) {
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<std::string> all_gather(const std::string& mine) override {
    if (mine.size() > size_t(INT_MAX))
      throw Error(fmt::format("prepare: rank {} has {} bytes to gather, more than MPI's 2^31 - 1",
                              rank_, mine.size()));
    std::vector<std::string> out(static_cast<size_t>(size_));
    run("all_gather (data preparation)", [&] {
      int len = int(mine.size());
      std::vector<int> lens(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
      MPI_Request req = MPI_REQUEST_NULL;
      detail::check_mpi(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_, &req),
                        "MPI_Iallgather(lengths)", rank_);
      detail::wait_request(&req, "MPI_Iallgather(lengths)", rank_);
      int64_t total = 0;
      for (int r = 0; r < size_; ++r) {
        displs[size_t(r)] = int(total);
        total += lens[size_t(r)];
      }
      if (total > INT_MAX)
        throw CommError(fmt::format("prepare: {} bytes to gather in all, more than MPI's 2^31 - 1",
                                    total));
      std::vector<char> buf(size_t(std::max<int64_t>(total, 1)));
      detail::check_mpi(MPI_Iallgatherv(mine.data(), len, MPI_CHAR, buf.data(), lens.data(),
                                        displs.data(), MPI_CHAR, comm_, &req),
                        "MPI_Iallgatherv", rank_);
      detail::wait_request(&req, "MPI_Iallgatherv", rank_);
      for (int r = 0; r < size_; ++r)
        out[size_t(r)].assign(buf.data() + displs[size_t(r)], size_t(lens[size_t(r)]));
    });
    return out;
  }

 private:
  // On the communication thread (the only MPI caller), without a timeout.
  void run(const std::string& what, std::function<void()> body) {
    detail::submit_mpi_task(what, rank_, /*timeout_s=*/0, std::move(body))->wait();
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<PrepareGroup> make_prepare_group() {
  if (!launched_under_mpi()) return std::make_unique<SingleGroup>();
  return std::make_unique<MpiPrepareGroup>();
}

}  // namespace mllm
