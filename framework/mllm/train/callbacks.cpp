// Built-in callbacks: progress bar, metrics (console + metrics.jsonl), eval, samples, checkpoint.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "mllm/core/logging.h"
#include "mllm/data/atomic_file.h"
#include "mllm/train/callback.h"
#include "mllm/train/memory.h"
#include "mllm/train/trainer.h"

namespace mllm {
namespace {

using json = nlohmann::json;

// True when `every` > 0 and `step` is a multiple of it.
bool due(int64_t step, int64_t every) { return every > 0 && step % every == 0; }

// "step 120/2000 [=====>        ] 6% loss 3.214 lr 4.9e-04 12.3k tok/s eta 3m05s" on one
// terminal line below the log lines, redrawn in place (rank 0, when its console is a terminal,
// also under mpirun: core/logging.h console_is_terminal, set_console_status).
class ProgressCallback : public Callback {
 public:
  explicit ProgressCallback(const Recipe& r) : max_steps_(r.train.max_steps) {}
  void on_train_begin(Trainer& t) override {
    enabled_ = t.comm().rank() == 0 && console_is_terminal();
    first_step_ = t.step();
  }
  void on_step_end(Trainer& t, const StepMetrics& m) override {
    if (!enabled_) return;
    const int width = 24;
    const double frac = static_cast<double>(m.step) / static_cast<double>(max_steps_);
    const int filled = static_cast<int>(frac * width);
    const double rate = (m.step - first_step_) / std::max(1e-9, t.seconds_running());
    const double eta_s = (max_steps_ - m.step) / std::max(1e-9, rate);
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < width) bar += '>';
    bar.resize(width, ' ');
    // The eta as the periodic log line writes it (format_duration: "3m05s", "7h41m").
    set_console_status(fmt::format("step {}/{} [{}] {:3.0f}% loss {:.3f} lr {:.2e} {:.1f}k tok/s "
                                   "eta {}", m.step, max_steps_, bar, 100 * frac, m.loss,
                                   m.lr, m.tokens_per_s / 1000, format_duration(eta_s)));
  }
  void on_train_end(Trainer&, StopReason) override {
    if (enabled_) set_console_status("");
  }

 private:
  int64_t max_steps_;
  int64_t first_step_ = 0;
  bool enabled_ = false;
};

// Every log.every_steps: one console line and one metrics.jsonl object. The console line
// says how far the run is ("step 120/800 (15%)"), the wall time of this invocation so far and
// the time left at the rate of the last kEtaWindow steps.
class MetricsCallback : public Callback {
 public:
  explicit MetricsCallback(const Recipe& r) : every_(r.log.every_steps) {}
  CallbackPhase phase() const override { return CallbackPhase::kBeforeSave; }
  void on_train_begin(Trainer& t) override {
    recent_.assign(1, {t.seconds_running(), t.step()});
    reset_peak_memory(t.device());
  }
  void on_step_end(Trainer& t, const StepMetrics& m) override {
    recent_.emplace_back(t.seconds_running(), m.step);
    if (recent_.size() > kEtaWindow + 1) recent_.pop_front();
    // A skipped update is always recorded (the trainer has already warned about it).
    if (m.skipped) {
      t.write_metrics_line(json({{"step", m.step}, {"tokens", m.tokens}, {"skipped", true},
                                 {"grad_norm", m.grad_norm}, {"lr", m.lr},
                                 {"nonfinite_skips", m.nonfinite_skips}}).dump());
      return;
    }
    if (!due(m.step, every_) && m.step != t.recipe().train.max_steps) return;
    const int64_t max_steps = t.recipe().train.max_steps;
    const auto& [t0, s0] = recent_.front();
    const double per_step = m.step > s0 ? (recent_.back().first - t0) / double(m.step - s0) : -1;
    // Rank 0's peaks since the last line (the ranks of one run differ little).
    const PeakMemory mem = peak_memory(t.device());
    reset_peak_memory(t.device());
    auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
    const std::string mem_text =
        mem.device_allocated_bytes >= 0
            ? fmt::format("mem {:.0f} MiB alloc {:.0f} reserved", mib(mem.device_allocated_bytes),
                          mib(mem.device_reserved_bytes))
            : fmt::format("mem {:.0f} MiB RSS", mib(mem.rss_bytes));
    spdlog::info("step {:>6}/{} ({:.0f}%) | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | "
                 "{:.0f} tok/s | mfu {:.1f}% | fwd {:.0f} bwd {:.0f} comm {:.0f} opt {:.0f} ms | "
                 "{} | elapsed {} | eta {}",
                 m.step, max_steps, 100.0 * double(m.step) / double(max_steps), m.loss, m.lr,
                 m.grad_norm, m.tokens_per_s, 100 * m.mfu, m.forward_ms, m.backward_ms, m.comm_ms,
                 m.optimizer_ms, mem_text, format_duration(t.seconds_running()),
                 format_duration(per_step < 0 ? -1 : per_step * double(max_steps - m.step)));
    json j = {{"step", m.step},           {"tokens", m.tokens},
              {"loss", m.loss},           {"lr", m.lr},
              {"grad_norm", m.grad_norm}, {"tokens_per_s", m.tokens_per_s},
              {"mfu", m.mfu},             {"forward_ms", m.forward_ms},
              {"backward_ms", m.backward_ms}, {"comm_ms", m.comm_ms},
              {"optimizer_ms", m.optimizer_ms}, {"step_ms", m.step_ms}};
    if (mem.rss_bytes >= 0) j["peak_rss_bytes"] = mem.rss_bytes;
    if (mem.device_allocated_bytes >= 0) {
      j["peak_device_allocated_bytes"] = mem.device_allocated_bytes;
      j["peak_device_reserved_bytes"] = mem.device_reserved_bytes;
    }
    if (!m.source_tokens.empty()) {
      json per = json::object();
      for (const auto& [name, tokens] : m.source_tokens) per[name] = tokens;
      j["source_tokens"] = per;
    }
    t.write_metrics_line(j.dump());
  }

 private:
  static constexpr std::size_t kEtaWindow = 50;  // steps behind the ETA's rate
  int64_t every_;
  std::deque<std::pair<double, int64_t>> recent_;  // (seconds running, step), oldest first
};

void run_eval(Trainer& t) {
  EvalMetrics e = t.evaluate();
  spdlog::info("eval step {:>6} | val loss {:.4f} | val ppl {:.2f} | {} tokens", e.step,
               e.val_loss, e.val_ppl, e.tokens);
  t.write_metrics_line(json({{"step", e.step}, {"val_loss", e.val_loss}, {"val_ppl", e.val_ppl}}).dump());
}

// Every eval.every_steps and at the end of the run: val loss and perplexity (collective).
class EvalCallback : public Callback {
 public:
  explicit EvalCallback(const Recipe& r) : every_(r.eval.every_steps) {}
  CallbackPhase phase() const override { return CallbackPhase::kBeforeSave; }
  // The last step is evaluated here too, before the checkpoint callback saves it (a NaN val
  // loss must stop the run before that save).
  void on_step_end(Trainer& t, const StepMetrics& m) override {
    if (due(m.step, every_) || m.step == t.recipe().train.max_steps) evaluate(t);
  }
  // A run that ends without taking a step here (resumed at max_steps) is evaluated now.
  void on_train_end(Trainer& t, StopReason reason) override {
    if (reason == StopReason::kMaxSteps && last_step_ != t.step()) evaluate(t);
  }

 private:
  void evaluate(Trainer& t) {
    run_eval(t);
    last_step_ = t.step();
  }
  int64_t every_;
  int64_t last_step_ = -1;
};

// Every sample.every_steps and at the end: rank 0 continues the prompts into samples.txt.
class SamplesCallback : public Callback {
 public:
  explicit SamplesCallback(const Recipe& r) : every_(r.sample.every_steps) {}
  // A prompt the tokenizer cannot spell (characters of another corpus) is said once, up front.
  void on_train_begin(Trainer& t) override {
    if (t.comm().rank() != 0) return;
    const auto& prompts = t.recipe().sample.prompts;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto ids = t.tokenizer().encode(prompts[i]);
      const auto unk = std::count(ids.begin(), ids.end(), kUnkId);
      if (unk > 0)
        spdlog::warn("sample.prompts[{}] '{}': {} token(s) not in the vocabulary become <UNK>, so "
                     "its samples start from them; give prompts in this corpus's text",
                     i, prompts[i], unk);
    }
  }
  void on_step_end(Trainer& t, const StepMetrics& m) override {
    if (due(m.step, every_) && m.step != t.recipe().train.max_steps) sample(t);
  }
  void on_train_end(Trainer& t, StopReason reason) override {
    if (reason == StopReason::kMaxSteps) sample(t);
  }

 private:
  void sample(Trainer& t) {
    const auto texts = t.generate_samples();  // collective (stage 3 gathers the weights)
    if (t.comm().rank() != 0) return;
    std::string block;
    for (const auto& text : texts) {
      spdlog::info("sample step {}: {}", t.step(), text);
      block += "=== step " + std::to_string(t.step()) + "\n" + text + "\n";
    }
    CheckedFile out(t.run_dir() + "/samples.txt", /*append=*/true);
    out.write(block);
    out.close();
    t.write_text("samples", "```\n" + block + "```");
  }
  int64_t every_;
};

// Every checkpoint.every_steps and at the end (collective).
class CheckpointCallback : public Callback {
 public:
  explicit CheckpointCallback(const Recipe& r) : every_(r.checkpoint.every_steps) {}
  CallbackPhase phase() const override { return CallbackPhase::kSave; }
  void on_step_end(Trainer& t, const StepMetrics& m) override {
    if (due(m.step, every_)) t.save_checkpoint();
  }
  void on_train_end(Trainer& t, StopReason) override { t.save_checkpoint(); }

 private:
  int64_t every_;
};

template <typename T>
void add(const char* name) {
  callback_registry().add(name, [](const Recipe& r) { return std::make_shared<T>(r); });
}

}  // namespace

CallbackRegistry& callback_registry() {
  static CallbackRegistry registry("callback");
  return registry;
}

void register_builtin_callbacks() {
  add<ProgressCallback>("progress");
  add<MetricsCallback>("metrics");
  add<EvalCallback>("eval");
  add<SamplesCallback>("samples");
  add<CheckpointCallback>("checkpoint");
}

}  // namespace mllm
