// A benchmark's CSV output: no file for an empty path; a file that cannot be opened or written
// throws, naming its path, at open or at close() (a destructor cannot report it).
#pragma once
#include <cstdio>
#include <stdexcept>
#include <string>

namespace smla::cli {

class CsvFile {
 public:
  explicit CsvFile(std::string path) : path_(std::move(path)) {
    if (!path_.empty() && !(file_ = std::fopen(path_.c_str(), "w")))
      throw std::runtime_error("cannot write " + path_);
  }
  CsvFile(const CsvFile&) = delete;
  CsvFile& operator=(const CsvFile&) = delete;
  ~CsvFile() {
    if (file_) std::fclose(file_);
  }

  FILE* get() const { return file_; }  // null: no CSV asked for
  void close() {
    if (!file_) return;
    const bool failed = std::ferror(file_) != 0;
    const int closed = std::fclose(file_);
    file_ = nullptr;
    if (failed || closed != 0) throw std::runtime_error("cannot write " + path_);
  }

 private:
  std::string path_;
  FILE* file_ = nullptr;
};

}  // namespace smla::cli
