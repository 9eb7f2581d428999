// TensorBoard event files (see tensorboard.h): TFRecord framing, hand-encoded Event protos.
#include "mllm/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/data/atomic_file.h"

namespace fs = std::filesystem;

namespace mllm {
namespace {

// Protobuf wire format (protobuf.dev/programming-guides/encoding): just what is written here.
class Proto {
 public:
  Proto& varint_field(int field, uint64_t v) {
    tag(field, 0);
    varint(v);
    return *this;
  }
  Proto& double_field(int field, double v) {
    tag(field, 1);
    raw(&v, 8);  // little-endian hosts (x86-64, aarch64)
    return *this;
  }
  Proto& float_field(int field, float v) {
    tag(field, 5);
    raw(&v, 4);
    return *this;
  }
  Proto& bytes_field(int field, std::string_view v) {
    tag(field, 2);
    varint(v.size());
    bytes_.append(v.data(), v.size());
    return *this;
  }
  Proto& message_field(int field, const Proto& m) { return bytes_field(field, m.bytes_); }
  const std::string& bytes() const { return bytes_; }

 private:
  void tag(int field, int wire_type) { varint((static_cast<uint64_t>(field) << 3) | wire_type); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      bytes_ += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    bytes_ += static_cast<char>(v);
  }
  void raw(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
  std::string bytes_;
};

// Field numbers of tensorboard/compat/proto/{event,summary,tensor,tensor_shape,types}.proto.
namespace event { constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7; }
namespace value { constexpr int kTag = 1, kSimpleValue = 2, kTensor = 8, kMetadata = 9; }
constexpr int kSummaryValue = 1, kSessionLogStatus = 1, kSessionLogStart = 1;
constexpr int kMetadataPluginData = 1, kPluginName = 1;
constexpr int kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8, kDtString = 7;

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Proto event_at(int64_t step) {
  Proto e;
  e.double_field(event::kWallTime, wall_time_now()).varint_field(event::kStep, static_cast<uint64_t>(step));
  return e;
}

uint32_t masked_crc(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;  // tensorflow/core/lib/hash/crc32c.h Mask
}

// Seconds in an events file name "events.out.tfevents.<seconds>.<...>"; -1 if not one.
int64_t seconds_in_name(const std::string& name) {
  static const std::string prefix = "events.out.tfevents.";
  if (name.rfind(prefix, 0) != 0) return -1;
  try {
    return std::stoll(name.substr(prefix.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : data) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

std::string tensorboard_tag(const std::string& key) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::strlen(s);
    return key.size() >= n && key.compare(key.size() - n, n, s) == 0;
  };
  if (key.rfind("val_", 0) == 0) return "eval/" + key;
  if (ends_with("_ms")) return "time/" + key;
  if (ends_with("_bytes")) return "memory/" + key;
  return "train/" + key;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t purge_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create {}: {}", dir, ec.message()));
  int64_t seconds = static_cast<int64_t>(wall_time_now());
  for (const auto& entry : fs::directory_iterator(dir, ec))
    seconds = std::max(seconds, seconds_in_name(entry.path().filename().string()) + 1);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  path_ = fmt::format("{}/events.out.tfevents.{:010d}.{}.{}", dir, seconds, host, ::getpid());
  file_ = std::make_unique<CheckedFile>(path_);
  Proto version = event_at(0);
  version.bytes_field(event::kFileVersion, "brain.Event:2");
  write_event(version.bytes());
  if (purge_step >= 0) {
    Proto start = event_at(purge_step);
    start.message_field(event::kSessionLog, Proto().varint_field(kSessionLogStatus, kSessionLogStart));
    write_event(start.bytes());
  }
}

TensorBoardWriter::~TensorBoardWriter() = default;

void TensorBoardWriter::write_event(const std::string& event) {
  const uint64_t length = event.size();
  std::string record(reinterpret_cast<const char*>(&length), 8);
  const uint32_t length_crc = masked_crc(record);
  record.append(reinterpret_cast<const char*>(&length_crc), 4);
  record += event;
  const uint32_t data_crc = masked_crc(event);
  record.append(reinterpret_cast<const char*>(&data_crc), 4);
  file_->write(record);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double v, int64_t step) {
  Proto val;
  val.bytes_field(value::kTag, tag).float_field(value::kSimpleValue, static_cast<float>(v));
  Proto e = event_at(step);
  e.message_field(event::kSummary, Proto().message_field(kSummaryValue, val));
  write_event(e.bytes());
}

void TensorBoardWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  Proto tensor;  // a scalar DT_STRING tensor: an empty shape
  tensor.varint_field(kTensorDtype, kDtString)
      .message_field(kTensorShape, Proto())
      .bytes_field(kTensorStringVal, text);
  Proto metadata;
  metadata.message_field(kMetadataPluginData, Proto().bytes_field(kPluginName, "text"));
  Proto val;
  val.bytes_field(value::kTag, tag).message_field(value::kMetadata, metadata).message_field(value::kTensor, tensor);
  Proto e = event_at(step);
  e.message_field(event::kSummary, Proto().message_field(kSummaryValue, val));
  write_event(e.bytes());
}

void TensorBoardWriter::add_metrics(const nlohmann::json& line) {
  if (!line.is_object() || !line.contains("step") || !line["step"].is_number_integer()) return;
  const int64_t step = line["step"].get<int64_t>();
  if (line.contains("event") && line["event"].is_string()) {
    add_text("events/" + line["event"].get<std::string>(), "    " + line.dump(), step);
    return;
  }
  for (const auto& [key, v] : line.items()) {
    if (key == "step") continue;
    if (v.is_number() || v.is_boolean()) {
      add_scalar(tensorboard_tag(key), v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>(), step);
    } else if (v.is_object()) {
      for (const auto& [name, x] : v.items())
        if (x.is_number()) add_scalar(key + "/" + name, x.get<double>(), step);
    }
  }
}

}  // namespace mllm
