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
  auto s = reg.create("plugin_half", mllm::ScheduleConfig{}, 0.5, 10);
  EXPECT_DOUBLE_EQ(s->lr(3), 0.25);
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
  // A file that is not a shared library: dlopen's reason is passed on.
  const std::string not_so = MLLM_SOURCE_DIR "/CMakeLists.txt";
  try {
    mllm::load_plugins({not_so});
    FAIL();
  } catch (const mllm::ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("failed to load"), std::string::npos) << msg;
  }
}
