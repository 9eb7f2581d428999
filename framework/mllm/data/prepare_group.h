// The ranks that prepare a corpus together (mllm-prepare under mpirun, or every rank of
// mllm-train): the few collectives distributed preparation needs, as an interface, so that the
// data layer knows nothing of MPI. distributed/prepare_group.h makes the MPI one.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace mllm {

// Every rank of the group must make the same calls in the same order. The waits have no
// timeout: preparing a large corpus, or training a tokenizer on one rank, can take far longer
// than a training collective may (dist.timeout_s); a rank that dies ends the job through the
// launcher.
class PrepareGroup {
 public:
  virtual ~PrepareGroup() = default;
  virtual int rank() const = 0;  // in [0, size())
  virtual int size() const = 0;  // >= 1
  // Every rank's `mine`, indexed by rank, identical on every rank (lengths may differ; at most
  // 2^31 - 1 bytes per rank). Throws mllm::Error when the transfer fails.
  virtual std::vector<std::string> all_gather(const std::string& mine) = 0;
  // Returns once every rank has called it.
  virtual void barrier() { all_gather(std::string()); }
};

// The group of one: rank 0 of 1, every collective local.
class SingleGroup : public PrepareGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<std::string> all_gather(const std::string& mine) override { return {mine}; }
};

// Little-endian records for the all_gather payloads: put_* appends, WireReader reads back in the
// same order (throws mllm::Error when a payload is shorter than its reader expects).
inline void put_u64(std::string& out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = char((v >> (8 * i)) & 0xFF);
  out.append(b, 8);
}
inline void put_str(std::string& out, std::string_view s) {
  put_u64(out, s.size());
  out.append(s.data(), s.size());
}
class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : bytes_(bytes) {}
  uint64_t u64();
  std::string_view str();
  bool done() const { return pos_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

}  // namespace mllm
