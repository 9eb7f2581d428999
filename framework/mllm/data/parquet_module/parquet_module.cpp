// libmllm_parquet: the text column of Parquet files through Arrow's low-level Parquet reader
// (parquet::ParquetFileReader), one row group at a time, page by page.
#include "parquet_api.h"

#include <parquet/api/reader.h>

#include <memory>
#include <string>
#include <vector>

namespace {

struct File {
  std::unique_ptr<parquet::ParquetFileReader> reader;
  std::shared_ptr<parquet::FileMetaData> meta;
  int column = -1;
  int16_t max_def = 0;
};

void say(mllm_pq_sink sink, void* ctx, const std::string& msg) {
  if (sink) sink(ctx, msg.data(), msg.size());
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int mllm_pq_api_version(void) { return MLLM_PQ_API_VERSION; }

__attribute__((visibility("default"))) void* mllm_pq_open(const char* path, const char* column,
                                                          mllm_pq_sink err, void* err_ctx) {
  try {
    auto f = std::make_unique<File>();
    parquet::ReaderProperties props = parquet::default_reader_properties();
    // Pages are read through a 1 MiB buffer instead of whole column chunks at once.
    props.enable_buffered_stream();
    props.set_buffer_size(int64_t(1) << 20);
    f->reader = parquet::ParquetFileReader::OpenFile(path, /*memory_map=*/false, props);
    f->meta = f->reader->metadata();
    const parquet::SchemaDescriptor* schema = f->meta->schema();
    f->column = schema->ColumnIndex(column);
    if (f->column < 0) {
      // A list or struct column has leaves "text.list.element": name it as such.
      const std::string prefix = std::string(column) + ".";
      for (int i = 0; i < schema->num_columns(); ++i) {
        const std::string leaf = schema->Column(i)->path()->ToDotString();
        if (leaf.compare(0, prefix.size(), prefix) == 0) {
          say(err, err_ctx, "column '" + std::string(column) + "' is a nested (list or struct) "
                                "column (" + leaf + "), expected strings (Parquet BYTE_ARRAY, "
                                "Arrow string)");
          return nullptr;
        }
      }
      std::string names;
      for (int i = 0; i < schema->num_columns(); ++i)
        names += (i ? ", " : "") + schema->Column(i)->path()->ToDotString();
      say(err, err_ctx, "no column '" + std::string(column) + "' (columns: " + names +
                            "); set data.text_field to the column that holds the text");
      return nullptr;
    }
    const parquet::ColumnDescriptor* d = schema->Column(f->column);
    if (d->physical_type() != parquet::Type::BYTE_ARRAY || d->max_repetition_level() > 0) {
      say(err, err_ctx, "column '" + std::string(column) + "' is " +
                            (d->max_repetition_level() > 0 ? std::string("a repeated (list) column")
                                                           : "of type " + parquet::TypeToString(d->physical_type())) +
                            ", expected strings (Parquet BYTE_ARRAY, Arrow string)");
      return nullptr;
    }
    f->max_def = d->max_definition_level();
    return f.release();
  } catch (const std::exception& e) {
    say(err, err_ctx, e.what());
  }
  return nullptr;
}

__attribute__((visibility("default"))) void mllm_pq_close(void* file) { delete static_cast<File*>(file); }

__attribute__((visibility("default"))) int64_t mllm_pq_row_groups(void* file) {
  return static_cast<File*>(file)->meta->num_row_groups();
}

__attribute__((visibility("default"))) int64_t mllm_pq_row_group_rows(void* file, int64_t rg) {
  return static_cast<File*>(file)->meta->RowGroup(int(rg))->num_rows();
}

__attribute__((visibility("default"))) int64_t mllm_pq_row_group_bytes(void* file, int64_t rg) {
  return static_cast<File*>(file)->meta->RowGroup(int(rg))->total_compressed_size();
}

__attribute__((visibility("default"))) int mllm_pq_read_row_group(void* file, int64_t rg,
                                                                  mllm_pq_value value, void* ctx,
                                                                  mllm_pq_sink err, void* err_ctx) {
  File* f = static_cast<File*>(file);
  try {
    auto group = f->reader->RowGroup(int(rg));
    auto chunk = group->Column(f->column);
    auto* reader = static_cast<parquet::ByteArrayReader*>(chunk.get());
    constexpr int64_t kBatch = 1024;
    std::vector<int16_t> def(kBatch);
    std::vector<parquet::ByteArray> values(kBatch);
    while (reader->HasNext()) {
      int64_t got = 0;
      const int64_t levels =
          reader->ReadBatch(kBatch, f->max_def > 0 ? def.data() : nullptr, nullptr, values.data(), &got);
      int64_t v = 0;
      for (int64_t i = 0; i < levels; ++i) {
        int stop;
        if (f->max_def > 0 && def[size_t(i)] < f->max_def) {
          stop = value(ctx, nullptr, 0, 1);
        } else {
          const parquet::ByteArray& b = values[size_t(v++)];
          stop = value(ctx, reinterpret_cast<const char*>(b.ptr), b.len, 0);
        }
        if (stop) return 2;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    say(err, err_ctx, e.what());
  }
  return 1;
}

}  // extern "C"
