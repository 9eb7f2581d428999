// Every recipe key, declared once: name, type, help, range check. The table is the single
// source for parsing, the resolved dump and the key reference (`mllm-train --help-recipe`).
#include "mllm/core/recipe_schema.h"

#include <cmath>
#include <cstdlib>
#include <regex>
#include <stdexcept>

#include <fmt/format.h>

namespace mllm::detail {
namespace {

using Check = std::function<std::string(double)>;  // "" = ok, else "must be ..."

[[noreturn]] void expected(const std::string& what, const YAML::Node& n) {
  std::string got;
  if (!n.IsDefined() || n.IsNull()) got = "null";
  else if (n.IsScalar()) got = (n.Tag() == "!" ? "the string \"" + n.Scalar() + "\"" : "'" + n.Scalar() + "'");
  else if (n.IsSequence()) got = fmt::format("a list of {}", n.size());
  else got = "a mapping";
  throw std::invalid_argument("expected " + what + ", got " + got);
}

bool plain(const YAML::Node& n) { return n.IsScalar() && n.Tag() != "!"; }

int64_t parse_int(const YAML::Node& n) {
  static const std::regex re("[-+]?[0-9]+");
  if (!plain(n) || !std::regex_match(n.Scalar(), re)) expected("an integer", n);
  errno = 0;
  long long v = std::strtoll(n.Scalar().c_str(), nullptr, 10);
  if (errno == ERANGE) expected("an integer in 64-bit range", n);
  return v;
}

double parse_double(const YAML::Node& n) {
  // Accepts 3e-4, 1e-4, 2.0e-5, 0.1, 5 (YAML 1.1 would read 3e-4 as a string).
  static const std::regex re("[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][-+]?[0-9]+)?");
  if (!plain(n) || !std::regex_match(n.Scalar(), re)) expected("a number", n);
  double v = std::strtod(n.Scalar().c_str(), nullptr);
  if (!std::isfinite(v)) expected("a finite number", n);
  return v;
}

bool parse_bool(const YAML::Node& n) {
  if (plain(n) && (n.Scalar() == "true" || n.Scalar() == "True")) return true;
  if (plain(n) && (n.Scalar() == "false" || n.Scalar() == "False")) return false;
  expected("true or false", n);
}

std::string parse_string(const YAML::Node& n) {
  if (!n.IsScalar() || (plain(n) && (n.Scalar() == "~" || n.Scalar() == "null")))
    expected("a string", n);
  return n.Scalar();
}

YAML::Node write_double(double v) {
  std::string s = fmt::format("{}", v);  // shortest round-trip representation
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return YAML::Node(s);
}

void apply(const std::string& err) {
  if (!err.empty()) throw std::invalid_argument(err);
}

KeySpec leaf(std::string name, std::string type, std::string help,
             std::function<void(const YAML::Node&)> read, std::function<YAML::Node()> write,
             std::vector<std::string> aliases = {}) {
  KeySpec k;
  k.name = std::move(name);
  k.type = std::move(type);
  k.help = std::move(help);
  k.read = std::move(read);
  k.write = std::move(write);
  k.aliases = std::move(aliases);
  return k;
}

KeySpec key(const char* name, int64_t& ref, const char* help, Check check = {},
            std::vector<std::string> aliases = {}) {
  return leaf(
      name, "integer", help,
      [&ref, check](const YAML::Node& n) {
        int64_t v = parse_int(n);
        if (check) apply(check(static_cast<double>(v)));
        ref = v;
      },
      [&ref] { return YAML::Node(ref); }, std::move(aliases));
}

KeySpec key(const char* name, double& ref, const char* help, Check check = {},
            std::vector<std::string> aliases = {}) {
  return leaf(
      name, "number", help,
      [&ref, check](const YAML::Node& n) {
        double v = parse_double(n);
        if (check) apply(check(v));
        ref = v;
      },
      [&ref] { return write_double(ref); }, std::move(aliases));
}

KeySpec key(const char* name, bool& ref, const char* help) {
  return leaf(
      name, "bool", help, [&ref](const YAML::Node& n) { ref = parse_bool(n); },
      [&ref] { return YAML::Node(ref); });
}

KeySpec key(const char* name, std::string& ref, const char* help,
            std::vector<std::string> choices = {}, std::vector<std::string> aliases = {}) {
  std::string type = "string";
  if (!choices.empty()) {
    type = "one of ";
    for (std::size_t i = 0; i < choices.size(); ++i) type += (i ? ", " : "") + choices[i];
  }
  return leaf(
      name, type, help,
      [&ref, choices, type](const YAML::Node& n) {
        std::string v = parse_string(n);
        if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
          expected(type, n);
        ref = v;
      },
      [&ref] { return YAML::Node(ref); }, std::move(aliases));
}

// data.sources: a list of {corpus: [files], weight: W, name: N}.
KeySpec sources_key(std::vector<DataSource>& ref) {
  return leaf(
      "sources", "list of {corpus, weight, name}",
      "a mixture instead of data.corpus: each source's sequences are drawn with probability "
      "weight / sum of weights (name: for logs and metrics)",
      [&ref](const YAML::Node& n) {
        std::vector<DataSource> out;
        if (n.IsNull()) {
          ref = out;
          return;
        }
        if (!n.IsSequence()) expected("a list of {corpus: [...], weight: W}", n);
        for (const auto& item : n) {
          if (!item.IsMap()) expected("a list of {corpus: [...], weight: W}", n);
          DataSource s;
          s.name = "source" + std::to_string(out.size());
          bool has_corpus = false;
          for (const auto& kv : item) {
            const std::string k = kv.first.Scalar();
            const YAML::Node& v = kv.second;
            if (k == "corpus") {
              has_corpus = true;
              if (v.IsScalar()) {
                s.corpus.push_back(parse_string(v));
              } else if (v.IsSequence()) {
                for (const auto& f : v) s.corpus.push_back(parse_string(f));
              } else {
                expected("corpus: a list of files or globs", v);
              }
            } else if (k == "weight") {
              try {
                s.weight = parse_double(v);
              } catch (const std::invalid_argument& e) {
                throw std::invalid_argument(fmt::format("source {}: weight: {}", out.size(), e.what()));
              }
              if (!(s.weight > 0))
                throw std::invalid_argument(fmt::format(
                    "source {}: weight must be > 0, got {}", out.size(), s.weight));
            } else if (k == "name") {
              s.name = parse_string(v);
            } else {
              throw std::invalid_argument(fmt::format(
                  "source {}: unknown key '{}'; a source has corpus, weight and name", out.size(), k));
            }
          }
          if (!has_corpus || s.corpus.empty())
            throw std::invalid_argument(
                fmt::format("source {}: no corpus; give it corpus: [files or globs]", out.size()));
          for (const auto& other : out)
            if (other.name == s.name)
              throw std::invalid_argument("two sources are named '" + s.name + "'");
          out.push_back(std::move(s));
        }
        ref = std::move(out);
      },
      [&ref] {
        YAML::Node list(YAML::NodeType::Sequence);
        for (const auto& s : ref) {
          YAML::Node m(YAML::NodeType::Map);
          m["name"] = s.name;
          YAML::Node files(YAML::NodeType::Sequence);
          for (const auto& f : s.corpus) files.push_back(f);
          files.SetStyle(YAML::EmitterStyle::Flow);
          m["corpus"] = files;
          m["weight"] = write_double(s.weight);
          list.push_back(m);
        }
        return list;
      });
}

KeySpec key(const char* name, std::vector<std::string>& ref, const char* help) {
  return leaf(
      name, "list of strings", help,
      [&ref](const YAML::Node& n) {
        std::vector<std::string> out;
        if (n.IsNull()) {
        } else if (n.IsScalar()) {
          out.push_back(parse_string(n));  // a single item may be written without brackets
        } else if (n.IsSequence()) {
          for (const auto& item : n) {
            if (!item.IsScalar()) expected("a list of strings", n);
            out.push_back(item.Scalar());
          }
        } else {
          expected("a list of strings", n);
        }
        ref = out;
      },
      [&ref] {
        YAML::Node s(YAML::NodeType::Sequence);
        for (const auto& v : ref) s.push_back(v);
        return s;
      });
}

KeySpec key(const char* name, std::vector<double>& ref, const char* help, std::size_t size,
            Check check) {
  std::string type = "list of " + std::to_string(size) + " numbers";
  return leaf(
      name, type, help,
      [&ref, size, check, type](const YAML::Node& n) {
        if (!n.IsSequence() || n.size() != size) expected(type, n);
        std::vector<double> out;
        for (const auto& item : n) {
          double v = parse_double(item);
          apply(check(v));
          out.push_back(v);
        }
        ref = out;
      },
      [&ref] {
        YAML::Node s(YAML::NodeType::Sequence);
        for (double v : ref) s.push_back(write_double(v));
        s.SetStyle(YAML::EmitterStyle::Flow);
        return s;
      });
}

bool is_null(const YAML::Node& n) {
  return n.IsNull() || (plain(n) && (n.Scalar() == "null" || n.Scalar() == "~"));
}

KeySpec key(const char* name, std::optional<int64_t>& ref, const char* help, Check check) {
  return leaf(
      name, "integer or null", help,
      [&ref, check](const YAML::Node& n) {
        if (is_null(n)) {
          ref.reset();
          return;
        }
        int64_t v = parse_int(n);
        apply(check(static_cast<double>(v)));
        ref = v;
      },
      [&ref] { return ref ? YAML::Node(*ref) : YAML::Node(YAML::NodeType::Null); });
}

KeySpec key(const char* name, std::optional<double>& ref, const char* help, Check check) {
  return leaf(
      name, "number or null", help,
      [&ref, check](const YAML::Node& n) {
        if (is_null(n)) {
          ref.reset();
          return;
        }
        double v = parse_double(n);
        apply(check(v));
        ref = v;
      },
      [&ref] { return ref ? write_double(*ref) : YAML::Node(YAML::NodeType::Null); });
}

// profile.steps: [FIRST, LAST] with 1 <= FIRST <= LAST, or null / [] for off (stored empty).
KeySpec profile_steps_key(std::vector<int64_t>& ref, const char* help) {
  const std::string type = "[FIRST, LAST] step numbers (1 <= FIRST <= LAST) or null";
  return leaf(
      "steps", type, help,
      [&ref, type](const YAML::Node& n) {
        if (is_null(n) || (n.IsSequence() && n.size() == 0)) {
          ref.clear();
          return;
        }
        if (!n.IsSequence() || n.size() != 2) expected(type, n);
        const int64_t first = parse_int(n[0]), last = parse_int(n[1]);
        if (first < 1 || last < first)
          throw std::invalid_argument(fmt::format("must be [FIRST, LAST] with 1 <= FIRST <= LAST, "
                                                  "got [{}, {}]", first, last));
        ref = {first, last};
      },
      [&ref] {
        if (ref.empty()) return YAML::Node(YAML::NodeType::Null);
        YAML::Node s(YAML::NodeType::Sequence);
        for (int64_t v : ref) s.push_back(v);
        s.SetStyle(YAML::EmitterStyle::Flow);
        return s;
      });
}

// `threads`: a positive integer or `auto` (stored as 0).
KeySpec threads_key(int64_t& ref, const char* help) {
  return leaf(
      "threads", "integer >= 1 or auto", help,
      [&ref](const YAML::Node& n) {
        if (plain(n) && n.Scalar() == "auto") {
          ref = 0;
          return;
        }
        int64_t v = 0;
        try {
          v = parse_int(n);
        } catch (const std::invalid_argument&) {
          expected("an integer >= 1 or auto", n);
        }
        if (v < 1) expected("an integer >= 1 or auto", n);
        ref = v;
      },
      [&ref] { return ref == 0 ? YAML::Node("auto") : YAML::Node(ref); });
}

Check at_least(double lo) {
  return [lo](double v) {
    return v >= lo ? std::string() : fmt::format("must be >= {}, got {}", lo, v);
  };
}
Check positive() {
  return [](double v) { return v > 0 ? std::string() : fmt::format("must be > 0, got {}", v); };
}
Check in_range(double lo, double hi, bool hi_open = false) {
  return [=](double v) {
    bool ok = v >= lo && (hi_open ? v < hi : v <= hi);
    return ok ? std::string()
              : fmt::format("must be in [{}, {}{}, got {}", lo, hi, hi_open ? ")" : "]", v);
  };
}

// The lr: positive and at most 1e10. Why a bound: AdamW's first step moves a weight by about
// lr / (1 - beta1) in float32; far beyond that LibTorch cannot even convert the step size
// ("value cannot be converted to type float without overflow").
Check lr_range() {
  return [](double v) {
    return v > 0 && v <= 1e10 ? std::string() : fmt::format("must be in (0, 1e10], got {}", v);
  };
}

KeySpec section(const std::string& name, const std::string& help, std::vector<KeySpec> children) {
  KeySpec s;
  s.name = name;
  s.type = "section";
  s.help = help;
  s.children = std::move(children);
  s.section = true;
  return s;
}

// The options section of the component `name` of `kind`, bound to `opts`: one leaf per declared
// option (none when the component declares none: any key there is then unknown).
KeySpec options_spec(const std::string& section_name, const std::string& kind,
                     const std::string& name, Options& opts) {
  opts.section = options_section(kind, name);
  const OptionSchema* schema = find_options(kind, name);
  std::map<std::string, OptionValue> values;
  std::vector<KeySpec> children;
  if (schema) {
    for (const auto& spec : schema->specs()) {
      auto it = opts.values.find(spec.key);
      bool keep = it != opts.values.end() && it->second.index() == spec.default_value.index();
      values[spec.key] = keep ? it->second : spec.default_value;
    }
  }
  opts.values = std::move(values);
  if (schema)
    for (const auto& spec : schema->specs()) children.push_back(option_key(spec, opts.values[spec.key]));
  return section(section_name,
                 schema ? fmt::format("options declared by {} '{}'", kind, name)
                        : fmt::format("{} '{}' declares no options", kind, name),
                 std::move(children));
}

}  // namespace

KeySpec option_key(const OptionSpec& spec, OptionValue& value) {
  const char* name = spec.key.c_str();
  const char* help = spec.help.c_str();
  KeySpec k;
  switch (spec.type) {
    case OptionType::kBool:
      k = key(name, std::get<bool>(value), help);
      break;
    case OptionType::kInteger: {
      OptionRange range = spec.range;
      k = key(name, std::get<int64_t>(value), help, [range](double v) { return range.violation(v); });
      break;
    }
    case OptionType::kNumber: {
      OptionRange range = spec.range;
      k = key(name, std::get<double>(value), help, [range](double v) { return range.violation(v); });
      break;
    }
    case OptionType::kString:
      k = key(name, std::get<std::string>(value), help, spec.choices);
      break;
    case OptionType::kStringList:
      k = key(name, std::get<std::vector<std::string>>(value), help);
      break;
  }
  // The range belongs to the type column (--help-recipe); choices are there already.
  const bool numeric = spec.type == OptionType::kInteger || spec.type == OptionType::kNumber;
  if (numeric && !spec.range.describe().empty()) k.type += " " + spec.range.describe();
  return k;
}

KeySpec recipe_schema(Recipe& r) {
  auto& d = r.data;
  auto& m = r.model;
  auto& t = r.train;
  auto& o = r.optim;
  KeySpec root = section("", "recipe", {
      key("plugins", r.plugins, "shared libraries (.so) dlopen'ed before building; they register components"),
      key("callbacks", r.callbacks, "training callbacks by registry name (the whole list: it replaces "
          "the default); metrics and eval run before checkpoint, samples, progress and plugin "
          "callbacks after it unless their phase() says otherwise, recipe order within each "
          "(docs/extending.md)"),
      section("run", "run identity and output", {
          key("name", r.run.name, "run name (logs, metrics)"),
          key("out_dir", r.run.out_dir, "run folder: resolved recipe, logs, metrics, samples, checkpoints"),
          key("seed", r.run.seed, "seed for initialisation, sampler order and dropout", at_least(0)),
      }),
      section("data", "corpus, tokenizer and sequences", {
          key("corpus", d.corpus, ".txt, .jsonl (each also .gz / .zst) or .parquet files or globs (relative to the working directory)"),
          sources_key(d.sources),
          key("text_field", d.text_field, ".jsonl field or .parquet column holding the text"),
          key("doc_separator", d.doc_separator, ".txt documents: one per line, or separated by blank lines",
              {"line", "blank_line"}),
          key("invalid_utf8", d.invalid_utf8, "invalid UTF-8 in the corpus: stop, or replace with U+FFFD",
              {"error", "replace"}),
          section("tokenizer", "tokenizer", {
              key("type", d.tokenizer.type, "tokenizer registry name (char, bpe)"),
              key("vocab_size", d.tokenizer.vocab_size, "bpe: vocabulary size incl. specials", at_least(8)),
              key("character_coverage", d.tokenizer.character_coverage,
                  "bpe: share of character occurrences whose characters get their own piece (sentencepiece's "
                  "character_coverage; 0 = automatic; 0.9995 is usual for Chinese, byte pieces spell the rest)",
                  in_range(0, 1)),
              key("min_count", d.tokenizer.min_count, "char: minimum character count to get an id", at_least(1)),
              key("max_vocab", d.tokenizer.max_vocab, "char: vocabulary cap incl. specials (0 = none)", at_least(0)),
              key("sample_bytes", d.tokenizer.sample_bytes,
                  "bpe: bytes of text it trains on, a deterministic sample of the train split (all when it is smaller)",
                  at_least(1024)),
              options_spec("options", "tokenizer", d.tokenizer.type, d.tokenizer.options),
          }),
          key("cache_dir", d.cache_dir,
              "where the tokenizer and token shards are written, in a sub-folder named by the data fingerprint"),
          key("shard_tokens", d.shard_tokens, "tokens per shard file at most (a longer document gets a shard of its own)",
              at_least(1024)),
          key("prepare_memory_mb", d.prepare_memory_mb,
              "memory budget of preparation per rank in MiB (bounds the pieces in flight; not the output)",
              at_least(64)),
          key("prepare_segment_bytes", d.prepare_segment_bytes,
              "preparation's unit of work: corpus bytes on disk per segment, spread over the ranks (not the output)",
              at_least(1)),
          key("val_fraction", d.val_fraction, "share of documents held out for validation", in_range(0, 0.5)),
          key("mode", d.mode, "packed: windows over the token stream; document: one padded doc per sequence",
              {"packed", "document"}),
          key("seq_len", d.seq_len, "tokens per sequence", at_least(2), {"block_size", "context_length"}),
      }),
      section("model", "architecture", {
          key("type", m.type, "model registry name (minillm, llama)"),
          key("d_model", m.d_model, "hidden size", at_least(1), {"n_embd", "dim", "hidden_size"}),
          key("n_heads", m.n_heads, "attention heads", at_least(1), {"n_head", "num_heads"}),
          key("n_kv_heads", m.n_kv_heads, "llama: key/value heads, dividing n_heads (0 = n_heads)", at_least(0)),
          key("n_layers", m.n_layers, "decoder blocks", at_least(1), {"n_layer", "num_layers"}),
          key("d_ff", m.d_ff, "feed-forward hidden size (0 = family default)", at_least(0), {"ffn_dim", "hidden_dim"}),
          key("dropout", m.dropout, "dropout probability (embeddings, attention, residual)", in_range(0, 1, true)),
          key("attn_dropout", m.attn_dropout, "dropout on attention probabilities (null = dropout)",
              in_range(0, 1, true)),
          key("max_seq_len", m.max_seq_len, "positions supported (0 = data.seq_len)", at_least(0)),
          key("rope_theta", m.rope_theta, "llama: rotary embedding base", positive()),
          key("multiple_of", m.multiple_of, "llama: SwiGLU hidden size rounded up to this", at_least(1)),
          key("norm_eps", m.norm_eps, "LayerNorm / RMSNorm epsilon", positive()),
          key("tie_embeddings", m.tie_embeddings, "llama: output head shares the token embedding"),
          key("init_std", m.init_std, "std of the normal weight init", positive()),
          key("attn_impl", m.attn_impl,
              "attention kernel: eager (explicit softmax), sdpa (LibTorch scaled_dot_product_attention), "
              "auto (sdpa on CUDA, eager on the CPU)", {"auto", "eager", "sdpa"}),
          key("activation_checkpointing", m.activation_checkpointing,
              "blocks that keep only their input and recompute their forward in backward (less "
              "activation memory for ~1/3 more compute): none, full (every block), every_n "
              "(blocks 0, n, 2n, ... with n = checkpoint_every)", {"none", "full", "every_n"}),
          key("checkpoint_every", m.checkpoint_every, "activation_checkpointing: every_n: "
              "checkpoint every n-th block", at_least(1)),
          options_spec("options", "model", m.type, m.options),
      }),
      section("train", "loop and batch sizes", {
          key("max_steps", t.max_steps, "optimizer steps of the whole run (the schedule spans them)", at_least(1)),
          key("global_batch", t.global_batch, "sequences per optimizer step over all ranks", at_least(1),
              {"batch_size"}),
          key("micro_batch", t.micro_batch, "sequences per rank per forward pass", at_least(1)),
          key("device", t.device, "cpu, cuda (rank r on cuda:(local_rank % GPUs)), or auto (cuda when "
              "LibTorch has CUDA and a GPU is visible)", {"auto", "cpu", "cuda"}),
          key("precision", t.precision, "fp32, or bf16 autocast with fp32 master weights", {"fp32", "bf16"}),
          key("tf32", t.tf32, "CUDA: TF32 tensor cores for fp32 matmuls and convolutions"),
          key("sync_debug", t.sync_debug, "CUDA: from the second step on, count every host "
              "synchronisation (LibTorch's sync debug mode, warn) by call stack; listed in the log "
              "and <run>/sync_debug.json at the end"),
          threads_key(t.threads, "intra-op threads per rank (auto = OMP_NUM_THREADS if set, else usable CPUs / ranks on this node)"),
          key("stop_at_step", t.stop_at_step, "end this invocation after this step, checkpointed", at_least(1)),
          key("time_limit_s", t.time_limit_s, "end this invocation after this many seconds, checkpointed",
              positive()),
          key("on_nonfinite", t.on_nonfinite, "a non-finite loss or gradient norm: stop (no update, "
              "exit 1), or skip that update on every rank and go on", {"stop", "skip"}),
          key("max_nonfinite_skips", t.max_nonfinite_skips, "on_nonfinite=skip: stop after this many "
              "skipped updates in a row", at_least(1)),
      }),
      section("optim", "optimizer", {
          key("type", o.type, "optimizer registry name (adamw)"),
          key("lr", o.lr, "peak learning rate", lr_range(), {"learning_rate", "max_lr"}),
          key("weight_decay", o.weight_decay, "decoupled weight decay", at_least(0)),
          key("betas", o.betas, "Adam betas [beta1, beta2]", 2, in_range(0, 1, true)),
          key("eps", o.eps, "Adam epsilon", positive()),
          key("grad_clip", o.grad_clip, "max global gradient L2 norm (0 = off)", at_least(0), {"clip", "max_norm"}),
          key("decay_bias_and_norm", o.decay_bias_and_norm, "weight-decay biases and norm weights too"),
          key("decay_embeddings", o.decay_embeddings, "weight-decay embedding tables too"),
          options_spec("options", "optimizer", o.type, o.options),
      }),
      section("schedule", "learning-rate schedule", {
          key("type", r.schedule.type, "schedule registry name (warmup_cosine, constant, linear)"),
          key("warmup_steps", r.schedule.warmup_steps, "linear warmup from 0 over these steps", at_least(0),
              {"warmup"}),
          key("min_lr", r.schedule.min_lr, "lr reached at max_steps", at_least(0)),
          options_spec("options", "schedule", r.schedule.type, r.schedule.options),
      }),
      section("dist", "data parallelism", {
          key("backend", r.dist.backend, "communicator", {"auto", "mpi", "nccl", "single"}),
          key("bucket_mb", r.dist.bucket_mb, "gradient all-reduce bucket cap in MiB", positive(),
              {"bucket_cap_mb"}),
          key("timeout_s", r.dist.timeout_s, "seconds a collective may take before the job aborts", positive()),
          key("check_every_steps", r.dist.check_every_steps, "every N steps compare a hash of every "
              "rank's weights and optimizer state; a mismatch stops the run (0 = off)", at_least(0)),
          key("zero_stage", r.dist.zero_stage, "0: every rank holds all AdamW state; 1: each rank "
              "holds the state of its 1/N slice of every bucket (ZeRO stage 1: reduce-scatter, "
              "sharded update, all-gather); 2: the gradients too (ZeRO stage 2: reduce-scattered "
              "every micro-step, full-size only for the buckets in flight); 3: the parameters too (ZeRO "
              "stage 3 / FSDP: each block's weights gathered before its forward and backward, "
              "freed after; adamw only)", in_range(0, 3)),
      }),
      section("checkpoint", "checkpoints and resume", {
          key("every_steps", r.checkpoint.every_steps, "save every N steps (0 = only at the end)", at_least(0)),
          key("keep_last", r.checkpoint.keep_last, "checkpoints kept", at_least(1)),
          key("resume", r.checkpoint.resume, "auto (latest if any) | none | PATH to a checkpoint folder"),
          key("allow_data_change", r.checkpoint.allow_data_change, "resume although the corpus "
              "files changed since the checkpoint (by default refused, naming them)"),
      }),
      section("eval", "validation", {
          key("every_steps", r.eval.every_steps, "evaluate every N steps (0 = only at the end)", at_least(0)),
          key("batches", r.eval.batches, "val batches of micro_batch sequences per evaluation, split "
              "across ranks (the same sequences at any world size)", at_least(1)),
      }),
      section("sample", "text samples during training", {
          key("every_steps", r.sample.every_steps, "sample every N steps (0 = only at the end)", at_least(0)),
          key("prompts", r.sample.prompts, "prompts to continue"),
          key("max_new_tokens", r.sample.max_new_tokens, "tokens generated per prompt", at_least(1)),
          key("temperature", r.sample.temperature, "softmax temperature (0 = greedy)", at_least(0)),
          key("top_k", r.sample.top_k, "keep the k most likely tokens (0 = off)", at_least(0)),
          key("top_p", r.sample.top_p, "nucleus: smallest set with this much mass (1 = off)",
              [](double v) {
                return v > 0 && v <= 1 ? std::string() : fmt::format("must be in (0, 1], got {}", v);
              }),
      }),
      section("log", "logging", {
          key("every_steps", r.log.every_steps, "console + metrics line every N steps", at_least(1)),
          key("level", r.log.level, "log level (MLLM_LOG_LEVEL overrides)",
              {"trace", "debug", "info", "warn", "error"}),
          key("tensorboard", r.log.tensorboard, "rank 0 also writes every metrics.jsonl value, "
              "the samples and this recipe to RUN/tensorboard/ for `tensorboard --logdir`"),
      }),
      section("profile", "profiler traces", {
          profile_steps_key(r.profile.steps, "record these optimizer steps with LibTorch's "
                            "profiler plus mllm's named ranges (forward, backward, each bucket's "
                            "collectives, optimizer, data, checkpoint) into "
                            "RUN/profile/rank_NN.json, a Chrome trace for Perfetto"),
          key("record_shapes", r.profile.record_shapes, "also record each op's input shapes "
              "and dtypes (the trace's Input Dims and Input type; torch.profiler's "
              "record_shapes) in the profile.steps trace; adds overhead to every recorded op"),
      }),
  });
  // One top-level section per callback that declares options (its plugin is loaded), after the
  // built-ins, by name. Like the built-in callbacks' sections (eval:, sample:), it is valid
  // whether or not `callbacks:` lists the callback.
  std::map<std::string, Options> callback_options;
  for (const auto& [id, schema] : all_options())
    if (id.first == "callback")
      callback_options[id.second] =
          r.callback_options.count(id.second) ? r.callback_options[id.second] : Options{};
  r.callback_options = std::move(callback_options);
  for (auto& [name, opts] : r.callback_options)
    root.children.push_back(options_spec(name, "callback", name, opts));
  return root;
}

}  // namespace mllm::detail
