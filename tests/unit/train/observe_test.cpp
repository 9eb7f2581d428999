// train/tensorboard.h and train/profiler.h: the CRC-32C of TFRecord framing against RFC 3720's
// test vectors, the records' framing read back by hand, the metrics -> tag mapping, and the
// merge of mllm's ranges into a Kineto trace.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mllm/train/profiler.h"
#include "mllm/train/tensorboard.h"

namespace mllm {
namespace {

TEST(Crc32c, Rfc3720Vectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);                   // the CRC catalogue's check value
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);          // RFC 3720 B.4: 32 bytes of 0
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);        // 32 bytes of 0xff
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);                      // 0x00..0x1f
}

TEST(TensorBoard, TagsGroupTheMetricsKeys) {
  EXPECT_EQ(tensorboard_tag("loss"), "train/loss");
  EXPECT_EQ(tensorboard_tag("val_ppl"), "eval/val_ppl");
  EXPECT_EQ(tensorboard_tag("forward_ms"), "time/forward_ms");
  EXPECT_EQ(tensorboard_tag("peak_rss_bytes"), "memory/peak_rss_bytes");
}

// The TFRecord framing: [uint64 n][masked crc32c of those 8 bytes][n bytes][masked crc32c].
TEST(TensorBoard, RecordsAreFramedWithMaskedCrcs) {
  const auto dir = std::filesystem::temp_directory_path() / ("mllm_tb_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter w(dir.string(), /*purge_step=*/-1);
    w.add_scalar("train/loss", 2.5, 7);
    path = w.path();
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  auto mask = [](uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; };
  size_t at = 0;
  int records = 0;
  std::string last;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t n = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&n, bytes.data() + at, 8);
    std::memcpy(&len_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(len_crc, mask(crc32c(bytes.substr(at, 8))));
    ASSERT_LE(at + 12 + n + 4, bytes.size());
    last = bytes.substr(at + 12, n);
    std::memcpy(&data_crc, bytes.data() + at + 12 + n, 4);
    EXPECT_EQ(data_crc, mask(crc32c(last)));
    at += 12 + n + 4;
    ++records;
  }
  EXPECT_EQ(records, 2);  // file_version, then the scalar
  // The scalar event ends with summary (field 5) { value (1) { tag (1) "train/loss",
  // simple_value (2, fixed32) 2.5f } }; before it wall_time (1, fixed64) and step (2) = 7.
  const std::string tail = std::string("\x2a\x13\x0a\x11\x0a\x0atrain/loss\x15", 17) + std::string("\x00\x00\x20\x40", 4);
  ASSERT_GE(last.size(), tail.size());
  EXPECT_EQ(last.substr(last.size() - tail.size()), tail);
  EXPECT_EQ(last.substr(9, 2), std::string("\x10\x07", 2));  // after the 9 bytes of wall_time
  std::filesystem::remove_all(dir);
}

TEST(Profiler, RangesMergeOnKinetosClock) {
  const std::string kineto = R"({"schemaVersion": 1, "baseTimeNanoseconds": 1000000000,
    "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 5, "tid": 5,
                     "ts": 2.5, "dur": 1.0}]})";
  const std::vector<trace::Range> ranges = {{"forward", 1000002000, 1000005000, 5},
                                            {"bucket 0 all-reduce", 1000003000, 1000004500, 9}};
  const auto j = nlohmann::json::parse(merge_trace_ranges(kineto, ranges, 5));
  const auto& ev = j["traceEvents"];
  ASSERT_EQ(ev.size(), 4u);  // the op, two ranges, the communication thread's name
  EXPECT_EQ(ev[1]["name"], "forward");
  EXPECT_EQ(ev[1]["cat"], "mllm");
  EXPECT_DOUBLE_EQ(ev[1]["ts"].get<double>(), 2.0);   // (1000002000 - 1000000000) ns = 2 us
  EXPECT_DOUBLE_EQ(ev[1]["dur"].get<double>(), 3.0);
  EXPECT_EQ(ev[2]["tid"], 9);
  EXPECT_EQ(ev[3]["ph"], "M");
  EXPECT_EQ(ev[3]["args"]["name"], "mllm communication");
  EXPECT_THROW(merge_trace_ranges("[]", ranges, 5), std::exception);
}

}  // namespace
}  // namespace mllm
