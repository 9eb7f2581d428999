// Checkpoint pieces that need no MPI: the safetensors export read back byte by byte, and the
// manifest check on a hand-made folder.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "mllm/core/error.h"
#include "mllm/train/checkpoint.h"

namespace fs = std::filesystem;

namespace {
struct Tiny : torch::nn::Module {
  Tiny() {
    w = register_parameter("w", torch::tensor({{1.5f, -2.0f, 0.25f}, {4.0f, 5.0f, -6.0f}}));
    b = register_parameter("b", torch::tensor({0.5f, -0.5f}));
  }
  torch::Tensor w, b;
};
std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST(Checkpoint, SafetensorsLayout) {
  const fs::path p = fs::temp_directory_path() / ("mllm_st_" + std::to_string(::getpid()));
  Tiny m;
  mllm::export_safetensors(m, p.string());
  const std::string bytes = read_all(p);
  fs::remove(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_EQ(n % 8, 0u);  // data 8-byte aligned
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["w"]["dtype"], "F32");
  EXPECT_EQ(header["w"]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(header["b"]["shape"], nlohmann::json::array({2}));
  auto read_floats = [&](const std::string& name) {
    auto off = header[name]["data_offsets"];
    const uint64_t begin = off[0], end = off[1];
    std::vector<float> v((end - begin) / 4);
    std::memcpy(v.data(), bytes.data() + 8 + n + begin, end - begin);
    return v;
  };
  EXPECT_EQ(read_floats("w"), (std::vector<float>{1.5f, -2.0f, 0.25f, 4.0f, 5.0f, -6.0f}));
  EXPECT_EQ(read_floats("b"), (std::vector<float>{0.5f, -0.5f}));
  EXPECT_EQ(bytes.size(), 8 + n + 8 * 4);
}

TEST(Checkpoint, VerifyNamesTheBadFile) {
  const fs::path dir = fs::temp_directory_path() / ("mllm_ck_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "a.bin") << "hello";
  // CRC-32 of "hello" is 0x3610a686 (zlib / IEEE 802.3), computed independently.
  std::ofstream(dir / "manifest.json")
      << R"({"files": {"a.bin": {"bytes": 5, "crc32": 907060870}}})";
  EXPECT_NO_THROW(mllm::verify_checkpoint(dir.string()));
  std::ofstream(dir / "a.bin") << "hellO";
  try {
    mllm::verify_checkpoint(dir.string());
    FAIL();
  } catch (const mllm::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("a.bin fails its CRC-32 check"), std::string::npos);
  }
  std::ofstream(dir / "a.bin") << "hell";
  try {
    mllm::verify_checkpoint(dir.string());
    FAIL();
  } catch (const mllm::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("a.bin is truncated"), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, ResumePathsAcceptLatestAndNameWhatIsMissing) {
  // run/checkpoints/step_000002 is a valid (one-file) checkpoint, named by run/checkpoints/latest.
  const fs::path run = fs::temp_directory_path() / ("mllm_run_" + std::to_string(::getpid()));
  const fs::path ck = run / "checkpoints" / "step_000002";
  fs::create_directories(ck);
  std::ofstream(ck / "a.bin") << "hello";
  std::ofstream(ck / "manifest.json")
      << R"({"files": {"a.bin": {"bytes": 5, "crc32": 907060870}}})";
  std::ofstream(run / "checkpoints" / "latest") << "step_000002\n";
  for (const fs::path& p : {run, run / "checkpoints", run / "checkpoints" / "latest", ck})
    EXPECT_EQ(mllm::find_resume_checkpoint(p.string(), "").value(), ck.string()) << p;

  auto message_for = [](const fs::path& p) {
    try {
      mllm::find_resume_checkpoint(p.string(), "");
    } catch (const mllm::CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Step folders but no `latest`: names the newest one to use instead.
  fs::remove(run / "checkpoints" / "latest");
  EXPECT_NE(message_for(run).find("no `latest` file"), std::string::npos) << message_for(run);
  EXPECT_NE(message_for(run).find("step_000002"), std::string::npos);
  // A run folder that saved nothing.
  fs::remove_all(ck);
  EXPECT_NE(message_for(run).find("a run folder without checkpoints"), std::string::npos)
      << message_for(run);
  EXPECT_NE(message_for(run / "nope").find("no such file or folder"), std::string::npos);
  fs::remove_all(run);
}
