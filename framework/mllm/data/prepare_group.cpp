// WireReader: reads back what put_u64 / put_str wrote.
#include "mllm/data/prepare_group.h"

#include "mllm/core/error.h"

namespace mllm {

uint64_t WireReader::u64() {
  if (bytes_.size() - pos_ < 8) throw Error("prepare: a gathered record is truncated (u64)");
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(bytes_[pos_ + i])) << (8 * i);
  pos_ += 8;
  return v;
}

std::string_view WireReader::str() {
  const uint64_t n = u64();
  if (bytes_.size() - pos_ < n) throw Error("prepare: a gathered record is truncated (string)");
  const std::string_view s = bytes_.substr(pos_, n);
  pos_ += n;
  return s;
}

}  // namespace mllm
