// Recipe loading: typos with suggestions, misplaced keys, types, includes and precedence,
// include cycles, the resolved dump round trip, cross-field rules.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/core/recipe.h"

namespace fs = std::filesystem;
using mllm::ConfigError;
using mllm::load_recipe;
using mllm::load_recipe_string;

namespace {

const char* kBase = "data: {corpus: [x.txt]}\n";

// Returns the ConfigError message of loading `yaml`, or "" if it loaded.
std::string error_of(const std::string& yaml, std::vector<std::string> overrides = {}) {
  try {
    load_recipe_string(yaml, "r.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("mllm_recipe_test_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    fs::path p = path_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

TEST(Recipe, ProfileStepsIsARangeOrNull) {
  EXPECT_TRUE(load_recipe_string(kBase).profile.steps.empty());
  EXPECT_EQ(load_recipe_string(kBase, "r.yaml", {"profile.steps=[3,5]"}).profile.steps,
            (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(load_recipe_string(std::string(kBase) + "profile: {steps: null}\n").profile.steps.empty());
  EXPECT_NE(error_of(kBase, {"profile.steps=[5,3]"}).find("1 <= FIRST <= LAST, got [5, 3]"),
            std::string::npos) << error_of(kBase, {"profile.steps=[5,3]"});
  EXPECT_NE(error_of(kBase, {"profile.steps=[0,3]"}).find("got [0, 3]"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"profile.steps=4"}).find("profile.steps"), std::string::npos);
  EXPECT_FALSE(load_recipe_string(kBase).log.tensorboard);
}

// docs/recipe.md is --help-recipe's table: a '|' in a help text or a default must not add a cell
// (checkpoint.resume's "auto | none | PATH" did).
TEST(Recipe, ReferenceRowsHaveFourCells) {
  std::istringstream in(mllm::recipe_reference());
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    ++rows;
    int bars = 0;
    for (size_t i = 0; i < line.size(); ++i)
      if (line[i] == '|' && (i == 0 || line[i - 1] != '\\')) ++bars;
    EXPECT_EQ(bars, 5) << line;
  }
  EXPECT_GT(rows, 50);
  EXPECT_NE(mllm::recipe_reference().find("auto (latest if any) \\| none \\| PATH"), std::string::npos);
}

}  // namespace

TEST(Recipe, DefaultsMatchDesign) {
  auto r = load_recipe_string(kBase);
  EXPECT_EQ(r.model.d_model, 128);
  EXPECT_EQ(r.train.global_batch, 64);
  EXPECT_DOUBLE_EQ(r.optim.lr, 5e-4);
  EXPECT_EQ(r.optim.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(r.schedule.type, "warmup_cosine");
  EXPECT_EQ(r.sample.prompts, std::vector<std::string>{"春眠"});
  EXPECT_FALSE(r.train.stop_at_step.has_value());
}

TEST(Recipe, TypoGetsSuggestionWithLocation) {
  std::string msg = error_of(std::string(kBase) + "optim:\n  learnng_rate: 3e-4\n");
  EXPECT_NE(msg.find("r.yaml:3:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optim.learnng_rate"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean optim.lr?"), std::string::npos) << msg;

  msg = error_of(std::string(kBase) + "model: {d_modle: 64}\n");
  EXPECT_NE(msg.find("did you mean model.d_model?"), std::string::npos) << msg;

  msg = error_of(std::string(kBase) + "optimizer: {lr: 1.0}\n");
  EXPECT_NE(msg.find("unknown key 'optimizer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean optim?"), std::string::npos) << msg;
}

TEST(Recipe, MisplacedKeyNamesItsHome) {
  std::string msg = error_of(std::string(kBase) + "model:\n  lr: 1.0e-3\n");
  EXPECT_NE(msg.find("r.yaml:3:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model.lr'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("belongs at optim.lr"), std::string::npos) << msg;

  msg = error_of(std::string(kBase) + "seq_len: 32\n");
  EXPECT_NE(msg.find("belongs at data.seq_len"), std::string::npos) << msg;
}

TEST(Recipe, ScientificNotationIsDouble) {
  auto r = load_recipe_string(std::string(kBase) +
                              "optim: {lr: 3e-4, eps: 1e-4}\nschedule: {min_lr: 2.0e-5}\n");
  EXPECT_DOUBLE_EQ(r.optim.lr, 3e-4);
  EXPECT_DOUBLE_EQ(r.optim.eps, 1e-4);
  EXPECT_DOUBLE_EQ(r.schedule.min_lr, 2e-5);
}

TEST(Recipe, IntegerKeysRejectNonIntegers) {
  for (const char* bad : {"8.5", "\"eight\"", "true", "\"8\"", "[8]"}) {
    std::string msg = error_of(std::string(kBase) + "train: {micro_batch: " + bad + "}\n");
    EXPECT_NE(msg.find("train.micro_batch"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("expected an integer"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("r.yaml:2:"), std::string::npos) << bad << ": " << msg;
  }
  std::string msg = error_of(std::string(kBase) + "optim: {lr: fast}\n");
  EXPECT_NE(msg.find("expected a number"), std::string::npos) << msg;
  msg = error_of(std::string(kBase) + "model: {tie_embeddings: 1}\n");
  EXPECT_NE(msg.find("expected true or false"), std::string::npos) << msg;
}

// A key twice in one mapping is an error naming the key path and both lines (issue 12, item 6):
// yaml-cpp keeps both entries and a lookup would silently see one.
TEST(Recipe, DuplicateKeysAreErrors) {
  // lines: 1 data, 2 optim:, 3 lr, 4 lr
  std::string msg = error_of(std::string(kBase) + "optim:\n  lr: 1.0e-3\n  lr: 2.0e-3\n");
  EXPECT_NE(msg.find("r.yaml:4:3: optim.lr: duplicate key (first given on line 3)"), std::string::npos)
      << msg;
  msg = error_of(std::string(kBase) + "optim: {lr: 1.0e-3}\ntrain: {max_steps: 5}\noptim: {eps: 1.0e-6}\n");
  EXPECT_NE(msg.find("r.yaml:4:1: optim: duplicate key (first given on line 2)"), std::string::npos)
      << msg;
  msg = error_of(std::string(kBase) + "model: {d_model: 64, d_model: 32}\n");
  EXPECT_NE(msg.find("model.d_model: duplicate key (first given on line 2)"), std::string::npos)
      << msg;
  // In an included file too, named with its own path and line.
  TempDir dir;
  dir.write("base.yaml", "optim:\n  lr: 1.0e-3\n  lr: 2.0e-3\n");
  const std::string recipe = dir.write("r.yaml", std::string("defaults: [base.yaml]\n") + kBase);
  try {
    load_recipe(recipe);
    ADD_FAILURE() << "duplicate key in an included file accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("base.yaml:3:3: optim.lr: duplicate key"), std::string::npos)
        << e.what();
  }
}

TEST(Recipe, RangesAndCrossFieldRules) {
  std::string msg = error_of(std::string(kBase) + "optim: {lr: -1.0e-3}\n");
  EXPECT_NE(msg.find("optim.lr: must be in (0, 1e10], got -0.001"), std::string::npos) << msg;
  // 1e300 parses as a double but no float32 step could hold it (issue 12, item 4).
  msg = error_of(std::string(kBase) + "optim: {lr: 1.0e300}\n");
  EXPECT_NE(msg.find("r.yaml:2:9: optim.lr: must be in (0, 1e10], got 1e+300"), std::string::npos) << msg;
  msg = error_of(std::string(kBase) + "model: {d_model: 130, n_heads: 4}\n");
  EXPECT_NE(msg.find("not divisible by model.n_heads=4"), std::string::npos) << msg;
  // Warmup as long as the run, or longer, is allowed (the trainer warns): short runs of stock
  // recipes (recipes/mini.yaml train.max_steps=40, warmup 100) must work.
  EXPECT_NO_THROW(load_recipe_string(std::string(kBase) + "train: {max_steps: 50}\nschedule: {warmup_steps: 50}\n"));
  EXPECT_NO_THROW(load_recipe_string(std::string(kBase) + "train: {max_steps: 40}\nschedule: {warmup_steps: 100}\n"));
  msg = error_of(std::string(kBase) + "train: {global_batch: 60, micro_batch: 8}\n");
  EXPECT_NE(msg.find("not divisible by train.micro_batch=8"), std::string::npos) << msg;
  msg = error_of("data: {corpus: [x.txt], mode: stream}\n");
  EXPECT_NE(msg.find("one of packed, document"), std::string::npos) << msg;
}

TEST(Recipe, GlobalBatchCheckedAgainstWorldSize) {
  auto r = load_recipe_string(std::string(kBase) + "train: {global_batch: 64, micro_batch: 8}\n");
  EXPECT_NO_THROW(mllm::validate_for_world(r, 8));
  EXPECT_EQ(r.accumulation_steps(2), 4);
  try {
    mllm::validate_for_world(r, 3);
    FAIL() << "world size 3 accepted";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("micro_batch=8 x world size 3 = 24"), std::string::npos) << msg;
    EXPECT_NE(msg.find("multiple of 24 (e.g. 48 or 72)"), std::string::npos) << msg;
  }
}

TEST(Recipe, IncludePrecedenceAndNesting) {
  TempDir dir;
  dir.write("configs/model/base.yaml", "model: {d_model: 64, n_heads: 2, n_layers: 3}\n"
                                       "optim: {lr: 1.0e-3, weight_decay: 0.5}\n");
  dir.write("configs/model/tiny.yaml",
            "defaults: [base.yaml]\nmodel: {n_heads: 4}\noptim: {weight_decay: 0.25}\n");
  std::string recipe = dir.write("recipes/r.yaml",
                                 "defaults: [../configs/model/tiny.yaml]\n"
                                 "data: {corpus: [a.txt]}\noptim: {lr: 2.0e-3}\n");
  auto r = load_recipe(recipe, {"optim.weight_decay=0.125", "data.corpus=[b.txt,c.txt]"});
  EXPECT_EQ(r.model.d_model, 64);        // from the nested include
  EXPECT_EQ(r.model.n_heads, 4);         // the include's include is overridden by the include
  EXPECT_EQ(r.model.n_layers, 3);
  EXPECT_DOUBLE_EQ(r.optim.lr, 2e-3);    // the recipe beats its defaults
  EXPECT_DOUBLE_EQ(r.optim.weight_decay, 0.125);  // the command line beats everything
  EXPECT_EQ(r.data.corpus, (std::vector<std::string>{"b.txt", "c.txt"}));
}

// A copy of a bundled recipe elsewhere keeps its relative `defaults:`: what is not next to the
// copy comes from the bundled recipes folder (MLLM_SHARE_DIR/recipes); a file next to the copy
// still wins, and a file in neither place is reported with both paths.
TEST(Recipe, DefaultsFallBackToTheBundledRecipesFolder) {
  TempDir share, elsewhere;
  share.write("configs/model/tiny.yaml", "model: {d_model: 64, n_heads: 2}\n");
  share.write("recipes/r.yaml", "defaults: [../configs/model/tiny.yaml]\ndata: {corpus: [a.txt]}\n");
  const std::string copy = elsewhere.write("exp/r.yaml",
                                           "defaults: [../configs/model/tiny.yaml]\n"
                                           "data: {corpus: [a.txt]}\n");
  const std::string share_root = share.path();
  ::setenv("MLLM_SHARE_DIR", share_root.c_str(), 1);
  EXPECT_EQ(mllm::share_dir(), share_root);
  auto r = load_recipe(copy);
  EXPECT_EQ(r.model.d_model, 64);
  EXPECT_EQ(r.data.corpus_fallback_dir, share_root);
  elsewhere.write("configs/model/tiny.yaml", "model: {d_model: 32, n_heads: 2}\n");
  EXPECT_EQ(load_recipe(copy).model.d_model, 32);  // next to the file first
  const std::string missing = elsewhere.write("exp/m.yaml", "defaults: [../configs/nope.yaml]\n");
  try {
    load_recipe(missing);
    ADD_FAILURE() << "loaded a recipe whose defaults: exist nowhere";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cannot read recipe file '" + elsewhere.path() + "/exp/../configs/nope.yaml'"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("no such file, nor '" + share_root +
                       "/configs/nope.yaml' (the bundled recipes folder)"),
              std::string::npos) << msg;
  }
  ::unsetenv("MLLM_SHARE_DIR");
}

TEST(Recipe, ErrorInIncludeNamesThatFile) {
  TempDir dir;
  std::string inc = dir.write("inc.yaml", "model:\n  n_layer: 3\n");
  std::string recipe = dir.write("r.yaml", "defaults: [inc.yaml]\ndata: {corpus: [a.txt]}\n");
  try {
    load_recipe(recipe);
    FAIL();
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(inc + ":2:3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean model.n_layers?"), std::string::npos) << msg;
  }
}

TEST(Recipe, OverrideErrorsNameTheCommandLine) {
  std::string msg = error_of(kBase, {"optim.lr=abc"});
  EXPECT_NE(msg.find("<command line> optim.lr=abc"), std::string::npos) << msg;
  msg = error_of(kBase, {"optim.lrr=0.1"});
  EXPECT_NE(msg.find("did you mean optim.lr?"), std::string::npos) << msg;
  msg = error_of(kBase, {"optim.lr"});
  EXPECT_NE(msg.find("expected key.path=value"), std::string::npos) << msg;
}

TEST(Recipe, IncludeCycleIsReported) {
  TempDir dir;
  dir.write("a.yaml", "defaults: [b.yaml]\n");
  dir.write("b.yaml", "defaults: [a.yaml]\n");
  std::string recipe = dir.write("r.yaml", "defaults: [a.yaml]\ndata: {corpus: [x.txt]}\n");
  try {
    load_recipe(recipe);
    FAIL();
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("include cycle"), std::string::npos) << msg;
    EXPECT_NE(msg.find("a.yaml -> "), std::string::npos) << msg;
  }
}

TEST(Recipe, MissingIncludeAndSyntaxError) {
  std::string msg = error_of("defaults: [nope.yaml]\n");
  EXPECT_NE(msg.find("nope.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
  msg = error_of("model: {d_model: 3\n");
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
}

TEST(Recipe, ResolvedDumpRoundTrips) {
  auto r = load_recipe_string(
      "data: {corpus: [a.jsonl, 'b c.txt'], seq_len: 32}\n"
      "optim: {lr: 3e-4, betas: [0.9, 0.999], eps: 1e-8}\n"
      "train: {stop_at_step: 7, threads: 2, global_batch: 16, micro_batch: 4}\n"
      "sample: {prompts: ['春眠', 'x: y']}\nschedule: {min_lr: 0.1e-5}\n");
  std::string dumped = mllm::to_yaml(r);
  auto back = load_recipe_string(dumped, "resolved.yaml");
  EXPECT_EQ(mllm::to_yaml(back), dumped);
  EXPECT_EQ(back.data.corpus, r.data.corpus);
  EXPECT_EQ(back.optim.lr, r.optim.lr);  // bit-exact
  EXPECT_EQ(back.schedule.min_lr, 1e-6);
  EXPECT_EQ(back.optim.betas, r.optim.betas);
  EXPECT_EQ(back.train.stop_at_step, std::optional<int64_t>(7));
  EXPECT_EQ(back.train.threads, 2);
  EXPECT_EQ(back.sample.prompts, r.sample.prompts);
  EXPECT_EQ(mllm::recipe_hash(back), mllm::recipe_hash(r));
  EXPECT_NE(mllm::recipe_hash(back), mllm::recipe_hash(load_recipe_string(kBase)));
}

TEST(Recipe, ThreadsAuto) {
  EXPECT_EQ(load_recipe_string(std::string(kBase) + "train: {threads: auto}\n").train.threads, 0);
  EXPECT_NE(error_of(std::string(kBase) + "train: {threads: 0}\n").find("or auto"),
            std::string::npos);
}

TEST(Recipe, DataSourcesMixture) {
  auto r = load_recipe_string(
      "data:\n  sources:\n    - {corpus: [a.jsonl, 'b/*.parquet'], weight: 3}\n"
      "    - {name: web, corpus: c.txt}\n");
  ASSERT_EQ(r.data.sources.size(), 2u);
  EXPECT_EQ(r.data.sources[0].name, "source0");
  EXPECT_EQ(r.data.sources[0].corpus, (std::vector<std::string>{"a.jsonl", "b/*.parquet"}));
  EXPECT_EQ(r.data.sources[0].weight, 3.0);
  EXPECT_EQ(r.data.sources[1].name, "web");
  EXPECT_EQ(r.data.sources[1].weight, 1.0);
  EXPECT_TRUE(r.data.corpus.empty());
  // The resolved recipe loads back to the same sources.
  auto back = load_recipe_string(mllm::to_yaml(r));
  EXPECT_EQ(back.data.sources.size(), 2u);
  EXPECT_EQ(back.data.sources[1].corpus, (std::vector<std::string>{"c.txt"}));
  EXPECT_EQ(back.data.sources[0].weight, 3.0);
  // Errors name the key, the line and what is wrong.
  auto err = error_of("data: {sources: [{corpus: [a.txt], weight: 0}]}\n");
  EXPECT_NE(err.find("data.sources"), std::string::npos) << err;
  EXPECT_NE(err.find("weight must be > 0"), std::string::npos) << err;
  err = error_of("data: {sources: [{corpus: [a.txt], wieght: 2}]}\n");
  EXPECT_NE(err.find("unknown key 'wieght'"), std::string::npos) << err;
  err = error_of("data: {sources: [{weight: 2}]}\n");
  EXPECT_NE(err.find("no corpus"), std::string::npos) << err;
  err = error_of("data: {sources: [{name: a, corpus: x}, {name: a, corpus: y}]}\n");
  EXPECT_NE(err.find("two sources are named 'a'"), std::string::npos) << err;
  err = error_of("data: {corpus: [x.txt], sources: [{corpus: [a.txt]}]}\n");
  EXPECT_NE(err.find("r.yaml:1"), std::string::npos) << err;
  EXPECT_NE(err.find("data.corpus is set too"), std::string::npos) << err;
  // From the command line, as YAML.
  r = load_recipe_string("data: {corpus: []}\n", "r.yaml",
                         {"data.sources=[{corpus: [a.txt], weight: 0.5}]"});
  EXPECT_EQ(r.data.sources[0].weight, 0.5);
}
