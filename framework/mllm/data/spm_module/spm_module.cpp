// libmllm_spm: sentencepiece training / encoding behind the C API of spm_api.h. Built as a
// MODULE linked only to sentencepiece (never LibTorch) and dlopen'ed by the bpe tokenizer.
#include "spm_api.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

namespace sentencepiece {
namespace logging {
void SetMinLogLevel(int v);  // exported by libsentencepiece, not in its public headers
}  // namespace logging
}  // namespace sentencepiece

#define MLLM_SPM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

void report(mllm_spm_sink err, void* ctx, const std::string& msg) {
  if (err) err(ctx, msg.data(), msg.size());
}

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  VectorIterator(const char* const* s, const size_t* n, size_t count)
      : s_(s), n_(n), count_(count) {
    load();
  }
  bool done() const override { return i_ >= count_; }
  void Next() override {
    ++i_;
    load();
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    if (i_ < count_) value_.assign(s_[i_], n_[i_]);
  }
  const char* const* s_;
  const size_t* n_;
  size_t count_, i_ = 0;
  std::string value_;
};

// Sentencepiece must never write to std::cerr here. Loaded with RTLD_DEEPBIND, its reference to
// std::cerr binds to libstdc++'s own definition, while the object libstdc++ actually constructs
// is the executable's copy-relocated std::cerr: the first log line (even a warning) segfaults.
// Errors still reach us as util::Status. Level 4 is above LOG_FATAL (3): nothing is logged.
__attribute__((constructor)) void silence_sentencepiece() {
  sentencepiece::logging::SetMinLogLevel(4);
}

}  // namespace

MLLM_SPM_EXPORT int mllm_spm_api_version(void) { return MLLM_SPM_API_VERSION; }

MLLM_SPM_EXPORT int mllm_spm_train(const char* const* sentences, const size_t* lengths, size_t n,
                                   const char* const* keys, const char* const* values,
                                   size_t n_options, mllm_spm_sink out, void* out_ctx,
                                   mllm_spm_sink err, void* err_ctx) {
  try {
    std::unordered_map<std::string, std::string> kwargs;
    for (size_t i = 0; i < n_options; ++i) kwargs[keys[i]] = values[i];
    // Fixed seed: sentence sampling/shuffling must not differ between runs (byte-identical
    // output for the same input).
    sentencepiece::SetRandomGeneratorSeed(20160101u);
    VectorIterator it(sentences, lengths, n);
    std::string model;
    const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &it, &model);
    if (!status.ok()) {
      report(err, err_ctx, status.ToString());
      return 1;
    }
    out(out_ctx, model.data(), model.size());
    return 0;
  } catch (const std::exception& e) {
    report(err, err_ctx, e.what());
    return 1;
  } catch (...) {
    report(err, err_ctx, "unknown exception in sentencepiece training");
    return 1;
  }
}

MLLM_SPM_EXPORT void* mllm_spm_load(const char* model, size_t n, mllm_spm_sink err,
                                    void* err_ctx) {
  try {
    auto* sp = new sentencepiece::SentencePieceProcessor();
    const auto status = sp->LoadFromSerializedProto(std::string(model, n));
    if (!status.ok()) {
      report(err, err_ctx, status.ToString());
      delete sp;
      return nullptr;
    }
    return sp;
  } catch (const std::exception& e) {
    report(err, err_ctx, e.what());
    return nullptr;
  }
}

MLLM_SPM_EXPORT void mllm_spm_free(void* handle) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(handle);
}

MLLM_SPM_EXPORT int32_t mllm_spm_vocab_size(void* handle) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(handle)->GetPieceSize();
}

MLLM_SPM_EXPORT int mllm_spm_encode(void* handle, const char* text, size_t n, mllm_spm_sink out,
                                    void* out_ctx, mllm_spm_sink err, void* err_ctx) {
  try {
    const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(handle);
    std::vector<int> ids;
    const auto status = sp->Encode(std::string_view(text, n), &ids);
    if (!status.ok()) {
      report(err, err_ctx, status.ToString());
      return 1;
    }
    std::vector<int32_t> ids32(ids.begin(), ids.end());
    out(out_ctx, reinterpret_cast<const char*>(ids32.data()), ids32.size() * sizeof(int32_t));
    return 0;
  } catch (const std::exception& e) {
    report(err, err_ctx, e.what());
    return 1;
  }
}

MLLM_SPM_EXPORT int mllm_spm_piece_bytes(void* handle, int32_t id, mllm_spm_sink out,
                                         void* out_ctx, mllm_spm_sink err, void* err_ctx) {
  try {
    const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(handle);
    if (id < 0 || id >= sp->GetPieceSize()) {
      report(err, err_ctx, "piece id " + std::to_string(id) + " out of range");
      return 1;
    }
    if (sp->IsControl(id) || sp->IsUnknown(id) || sp->IsUnused(id)) return 0;
    const std::string& piece = sp->IdToPiece(id);
    if (sp->IsByte(id)) {  // "<0xAB>"
      const char byte = static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16));
      out(out_ctx, &byte, 1);
      return 0;
    }
    static const std::string kSpaceSymbol = "\xE2\x96\x81";  // U+2581, sentencepiece's space
    std::string text;
    for (size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
        text.push_back(' ');
        i += kSpaceSymbol.size();
      } else {
        text.push_back(piece[i++]);
      }
    }
    out(out_ctx, text.data(), text.size());
    return 0;
  } catch (const std::exception& e) {
    report(err, err_ctx, e.what());
    return 1;
  }
}
