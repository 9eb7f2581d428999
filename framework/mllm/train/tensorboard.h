// TensorBoard event files: what metrics.jsonl holds, plus text (samples, the recipe), for a live
// `tensorboard --logdir RUN/tensorboard`.
//
// Format: TFRecord framing (uint64 length, masked CRC-32C of it, the bytes, masked CRC-32C of
// them; tensorflow/core/lib/io/record_writer.cc) around tensorboard.Event protos
// (tensorboard/compat/proto/event.proto, summary.proto). The few fields written are encoded
// here: LibTorch exports its own protobuf runtime's symbols, so linking a second libprotobuf
// into the same process would risk the two interposing each other.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mllm {

class CheckedFile;

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`; crc32c("123456789") is
// 0xE3069283 (RFC 3720, B.4).
uint32_t crc32c(std::string_view data);

// The TensorBoard tag of a metrics.jsonl key: "train/<key>" for the step values, "eval/<key>"
// for val_*, "time/<key>" for *_ms, "memory/<key>" for *_bytes; "<key>/<name>" for the members
// of an object value (source_tokens/<source>).
std::string tensorboard_tag(const std::string& key);

// One events file: RUN/tensorboard/events.out.tfevents.<unix seconds>.<host>.<pid>, written by
// one process (rank 0). Every write is flushed to the file (the interval is a log line).
class TensorBoardWriter {
 public:
  // Creates `dir` and a new events file in it, named after the newest existing one when the
  // clock says otherwise (TensorBoard reads the files of a folder in name order). `purge_step`
  // >= 0 (a resumed run): first writes the marker PyTorch's SummaryWriter(purge_step=) writes,
  // a SessionLog START at that step, so TensorBoard drops the earlier files' events at steps >=
  // purge_step (logged after the checkpoint this run resumed from, and logged again now).
  // Throws mllm::Error naming the file when it cannot be created.
  TensorBoardWriter(const std::string& dir, int64_t purge_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // The writes below throw mllm::Error naming the file on a write failure (disk full).
  // A scalar (stored as float32: TensorBoard's simple_value) at global step `step`.
  void add_scalar(const std::string& tag, double value, int64_t step);
  // Text for TensorBoard's text plugin (rendered as markdown) at `step`.
  void add_text(const std::string& tag, const std::string& text, int64_t step);
  // One metrics.jsonl object: every number and bool (1/0) except "step" as a scalar named by
  // tensorboard_tag(); an object with "event" (resume, source_epoch) as text "events/<event>".
  // A line without "step" is ignored.
  void add_metrics(const nlohmann::json& line);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::string path_;
  std::unique_ptr<CheckedFile> file_;
};

}  // namespace mllm
