// Parquet corpus files: the text column, read row group by row group through libmllm_parquet
// (data/parquet_module: Arrow's Parquet reader from PyPI's pyarrow wheel), loaded on first use.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace mllm {

// One open .parquet file and its text column.
class ParquetFile {
 public:
  // Opens `path` and finds the top-level column `column` (strings, not repeated). Throws
  // DataError naming the file when the module is not built ("this mllm was built without
  // Parquet support ..."), the file is not Parquet or is damaged, the column is missing (the
  // columns are listed) or holds something other than strings.
  ParquetFile(const std::string& path, const std::string& column);
  ~ParquetFile();
  ParquetFile(const ParquetFile&) = delete;
  ParquetFile& operator=(const ParquetFile&) = delete;

  int64_t row_groups() const;
  int64_t row_group_rows(int64_t row_group) const;
  // Compressed bytes of the row group (all columns), from the file's metadata.
  int64_t row_group_bytes(int64_t row_group) const;
  // Calls value(text, is_null) for every row of `row_group` in order (text empty for a null);
  // value returns false to stop early. Memory: one page at a time. Throws DataError naming the
  // file and row group when the data cannot be read (damaged, truncated).
  void read_row_group(int64_t row_group,
                      const std::function<bool(std::string_view text, bool is_null)>& value) const;

 private:
  std::string path_;
  void* handle_ = nullptr;
};

// True when this build can read Parquet (the module is next to libmllm.so, or at
// $MLLM_PARQUET_MODULE, and loads).
bool parquet_available();

}  // namespace mllm
