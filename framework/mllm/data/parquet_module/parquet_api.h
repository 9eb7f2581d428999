/* The C interface of libmllm_parquet, the module that reads Parquet corpus files through Apache
 * Arrow's C++ Parquet reader (the libraries of PyPI's pyarrow wheel). libmllm does not link
 * Arrow: the module is built only where pyarrow was found at configure time and is dlopen()ed
 * on first use, so a build without it still reads every other format (data/parquet_file.h).
 * No C++ exception crosses these functions; those returning int return 0 on success and pass
 * a message to `err` on failure. */
#ifndef MLLM_DATA_PARQUET_API_H_
#define MLLM_DATA_PARQUET_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLLM_PQ_API_VERSION 1

/* Receives a message (UTF-8, not NUL-terminated). */
typedef void (*mllm_pq_sink)(void* ctx, const char* data, size_t n);
/* Receives one row's value of the text column: `is_null` 1 for a null (data NULL). Returns 0 to
 * go on, anything else to stop reading (mllm_pq_read_row_group then returns 2). */
typedef int (*mllm_pq_value)(void* ctx, const char* data, size_t n, int is_null);

typedef int (*mllm_pq_api_version_fn)(void);
/* Opens `path` and finds the top-level column `column`, which must hold byte arrays (Parquet
 * BYTE_ARRAY: Arrow string / large_string / binary) and not be repeated. NULL on failure. */
typedef void* (*mllm_pq_open_fn)(const char* path, const char* column, mllm_pq_sink err,
                                 void* err_ctx);
typedef void (*mllm_pq_close_fn)(void* file);
typedef int64_t (*mllm_pq_row_groups_fn)(void* file);
typedef int64_t (*mllm_pq_row_group_rows_fn)(void* file, int64_t row_group);
/* Compressed bytes of the row group (all columns), as its metadata says. */
typedef int64_t (*mllm_pq_row_group_bytes_fn)(void* file, int64_t row_group);
/* Reads the column's values of `row_group` in row order, page by page (bounded memory). */
typedef int (*mllm_pq_read_row_group_fn)(void* file, int64_t row_group, mllm_pq_value value,
                                         void* ctx, mllm_pq_sink err, void* err_ctx);

#define MLLM_PQ_SYMBOLS(X)                                                               \
  X(api_version) X(open) X(close) X(row_groups) X(row_group_rows) X(row_group_bytes)     \
  X(read_row_group)

int mllm_pq_api_version(void);
void* mllm_pq_open(const char* path, const char* column, mllm_pq_sink err, void* err_ctx);
void mllm_pq_close(void* file);
int64_t mllm_pq_row_groups(void* file);
int64_t mllm_pq_row_group_rows(void* file, int64_t row_group);
int64_t mllm_pq_row_group_bytes(void* file, int64_t row_group);
int mllm_pq_read_row_group(void* file, int64_t row_group, mllm_pq_value value, void* ctx,
                           mllm_pq_sink err, void* err_ctx);

#ifdef __cplusplus
}
#endif

#endif  // MLLM_DATA_PARQUET_API_H_
