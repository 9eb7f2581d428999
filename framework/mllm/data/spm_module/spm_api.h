/* The C interface of libmllm_spm, the module that wraps sentencepiece. libsentencepiece bundles
 * and exports its own protobuf-lite, which clashes with LibTorch's libprotobuf when both are in
 * one symbol scope, so libmllm never links it: the bpe tokenizer dlopen()s this module with
 * RTLD_LOCAL | RTLD_DEEPBIND and calls only these functions. No C++ exception crosses them.
 * Every function returning int returns 0 on success; on failure it passes a message to `err`. */
#ifndef MLLM_DATA_SPM_API_H_
#define MLLM_DATA_SPM_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLLM_SPM_API_VERSION 1

/* Receives bytes produced by the module (model proto, text, int32 ids as raw memory). */
typedef void (*mllm_spm_sink)(void* ctx, const char* data, size_t n);

typedef int (*mllm_spm_api_version_fn)(void);

/* Trains a model on `n` sentences (UTF-8, each `lengths[i]` bytes) with sentencepiece trainer
 * options given as `n_options` key/value strings (e.g. "model_type" = "bpe"). The serialized
 * ModelProto goes to `out`. */
typedef int (*mllm_spm_train_fn)(const char* const* sentences, const size_t* lengths, size_t n,
                                 const char* const* keys, const char* const* values,
                                 size_t n_options, mllm_spm_sink out, void* out_ctx,
                                 mllm_spm_sink err, void* err_ctx);

/* Loads a serialized ModelProto; returns a handle (NULL on failure) for the calls below. */
typedef void* (*mllm_spm_load_fn)(const char* model, size_t n, mllm_spm_sink err, void* err_ctx);
typedef void (*mllm_spm_free_fn)(void* handle);
typedef int32_t (*mllm_spm_vocab_size_fn)(void* handle);

/* Encodes UTF-8 text to ids; `out` receives the int32 array as bytes. Thread-safe. */
typedef int (*mllm_spm_encode_fn)(void* handle, const char* text, size_t n, mllm_spm_sink out,
                                  void* out_ctx, mllm_spm_sink err, void* err_ctx);

/* Raw bytes of piece `id`: U+2581 becomes a space, <0xNN> byte pieces their byte, control and
 * unknown pieces nothing. `id` must be in [0, vocab_size). */
typedef int (*mllm_spm_piece_bytes_fn)(void* handle, int32_t id, mllm_spm_sink out,
                                       void* out_ctx, mllm_spm_sink err, void* err_ctx);

#define MLLM_SPM_SYMBOLS(X)                                                          \
  X(api_version) X(train) X(load) X(free) X(vocab_size) X(encode) X(piece_bytes)

int mllm_spm_api_version(void);
int mllm_spm_train(const char* const* sentences, const size_t* lengths, size_t n,
                   const char* const* keys, const char* const* values, size_t n_options,
                   mllm_spm_sink out, void* out_ctx, mllm_spm_sink err, void* err_ctx);
void* mllm_spm_load(const char* model, size_t n, mllm_spm_sink err, void* err_ctx);
void mllm_spm_free(void* handle);
int32_t mllm_spm_vocab_size(void* handle);
int mllm_spm_encode(void* handle, const char* text, size_t n, mllm_spm_sink out, void* out_ctx,
                    mllm_spm_sink err, void* err_ctx);
int mllm_spm_piece_bytes(void* handle, int32_t id, mllm_spm_sink out, void* out_ctx,
                         mllm_spm_sink err, void* err_ctx);

#ifdef __cplusplus
}
#endif

#endif /* MLLM_DATA_SPM_API_H_ */
