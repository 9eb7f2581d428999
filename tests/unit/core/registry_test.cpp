// Registry: duplicates, unknown names with the known list, plugin loading success and failure.
#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/core/plugin.h"
#include "mllm/core/registry.h"
#include "mllm/optim/lr_schedule.h"

namespace {
struct Widget {
  int value;
};
using WidgetRegistry = mllm::Registry<Widget, int>;
}  // namespace

TEST(Registry, CreatesByName) {
  WidgetRegistry r("widget");
  r.add("double", [](int x) { return std::make_shared<Widget>(Widget{2 * x}); });
  r.add("triple", [](int x) { return std::make_shared<Widget>(Widget{3 * x}); });
  EXPECT_EQ(r.create("double", 21)->value, 42);
  EXPECT_EQ(r.create("triple", 5)->value, 15);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"double", "triple"}));
}

TEST(Registry, DuplicateThrows) {
  WidgetRegistry r("widget");
  r.add("a", [](int) { return std::make_shared<Widget>(); });
  try {
    r.add("a", [](int) { return std::make_shared<Widget>(); });
    FAIL();
  } catch (const mllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("widget 'a' is registered twice"), std::string::npos);
  }
}

TEST(Registry, UnknownListsKnownNames) {
  WidgetRegistry r("widget");
  r.add("double", [](int) { return std::make_shared<Widget>(); });
  r.add("triple", [](int) { return std::make_shared<Widget>(); });
  try {
    r.create("dobule", 1);
    FAIL();
  } catch (const mllm::ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("unknown widget 'dobule'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'double'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("known widget types: double, triple"), std::string::npos) << msg;
  }
}

TEST(Plugin, LoadsAndRegisters) {
  auto& reg = mllm::lr_schedule_registry();
  ASSERT_FALSE(reg.contains("plugin_half"));
  mllm::load_plugins({MLLM_BINARY_DIR "/tests/plugins/libmllm_test_plugin.so"});
  ASSERT_TRUE(reg.contains("plugin_half"));
  mllm::ScheduleConfig config;
  config.options.values["factor"] = 0.5;  // the plugin's declared default
  auto s = reg.create("plugin_half", config, 0.5, 10);
  EXPECT_DOUBLE_EQ(s->lr(3), 0.25);
  const mllm::OptionSchema* schema = mllm::find_options("schedule", "plugin_half");
  ASSERT_NE(schema, nullptr);
  ASSERT_EQ(schema->specs().size(), 1u);
  EXPECT_EQ(schema->specs()[0].key, "factor");
  // Loading again is a no-op, not a duplicate registration.
  EXPECT_NO_THROW(mllm::load_plugins({MLLM_BINARY_DIR "/tests/plugins/libmllm_test_plugin.so"}));
}

TEST(Plugin, FailuresNameLibraryAndReason) {
  try {
    mllm::load_plugins({"/nonexistent/libfoo.so"});
    FAIL();
  } catch (const mllm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/libfoo.so': no such file"),
              std::string::npos) << e.what();
  }
  const std::string noentry = MLLM_BINARY_DIR "/tests/plugins/libmllm_test_plugin_noentry.so";
  try {
    mllm::load_plugins({noentry});
    FAIL();
  } catch (const mllm::ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(noentry), std::string::npos) << msg;
    EXPECT_NE(msg.find("no entry point"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mllm_register_plugin"), std::string::npos) << msg;
  }
  // A file that is not a shared library: refused by the stamp reader before dlopen.
  const std::string not_so = MLLM_SOURCE_DIR "/CMakeLists.txt";
  try {
    mllm::load_plugins({not_so});
    FAIL();
  } catch (const mllm::ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("is not a 64-bit ELF shared library (no ELF magic)"), std::string::npos)
        << msg;
  }
}

// The stamp of a plugin built against another mllm names both versions, and no code of the
// plugin runs (its static initialiser would abort this test binary).
TEST(Plugin, RefusesAnotherMllmVersionBeforeLoading) {
  const std::string old = MLLM_BINARY_DIR "/tests/plugins/libmllm_test_plugin_oldstamp.so";
  EXPECT_EQ(mllm::read_plugin_stamp(old),
            "mllm_version=0.0.9;plugin_abi=1;torch=" MLLM_TORCH_VERSION_STRING ";cxx11_abi=1");
  try {
    mllm::load_plugins({old});
    FAIL();
  } catch (const mllm::ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("was built against mllm 0.0.9 (plugin ABI 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("but this is mllm " MLLM_VERSION_STRING " (plugin ABI " +
                       std::to_string(MLLM_PLUGIN_ABI)), std::string::npos) << msg;
    EXPECT_NE(msg.find(old), std::string::npos) << msg;
  }
  const std::string nostamp = MLLM_BINARY_DIR "/tests/plugins/libmllm_test_plugin_nostamp.so";
  EXPECT_EQ(mllm::read_plugin_stamp(nostamp), "");
  try {
    mllm::load_plugins({nostamp});
    FAIL();
  } catch (const mllm::ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("carries no mllm build stamp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MLLM_PLUGIN_STAMP()"), std::string::npos) << msg;
  }
}

// Any exception from the entry point, and a path that is not a regular file, are bad input
// (ConfigError, exit 2) naming the plugin.
TEST(Plugin, EntryPointExceptionsAndNonFilesAreConfigErrors) {
  const std::string throws = MLLM_BINARY_DIR "/tests/plugins/libmllm_test_plugin_throws.so";
  try {
    mllm::load_plugins({throws});
    FAIL();
  } catch (const mllm::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "plugin '" + throws + "': mllm_register_plugin() failed: boom from the plugin");
  }
  for (const std::string& path : {std::string(MLLM_BINARY_DIR "/tests/plugins"), std::string("/dev/null")}) {
    try {
      mllm::load_plugins({path});
      FAIL() << path;
    } catch (const mllm::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + path + "' is not a regular file"),
                std::string::npos) << e.what();
    }
  }
}

// A plugin built in this tree carries exactly this libmllm's stamp.
TEST(Plugin, StampMatchesThisBuild) {
  const std::string ok = MLLM_BINARY_DIR "/tests/plugins/libmllm_test_plugin.so";
  EXPECT_EQ(mllm::read_plugin_stamp(ok), mllm::plugin_stamp());
  EXPECT_EQ(std::string(mllm::plugin_stamp()),
            "mllm_version=" MLLM_VERSION_STRING ";plugin_abi=" + std::to_string(MLLM_PLUGIN_ABI) +
                ";torch=" MLLM_TORCH_VERSION_STRING ";cxx11_abi=1");
}
