// A benchmark's CSV output (--csv PATH): no file for an empty path; a file that cannot be
// opened or written throws, naming the flag, its path and why, at open or at close() (a
// destructor cannot report it). It never takes a standard descriptor left closed (the table
// meant for a closed stdout would land in the CSV; stdout_status reports that write instead).
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "args.h"

namespace smla::cli {

// The value of --csv: a path, not nothing (a run whose CSV goes nowhere is a mistake).
inline std::string csv_path(std::string_view value) {
  if (value.empty()) throw UsageError("--csv: expected a file path, got ''");
  return std::string(value);
}

class CsvFile {
 public:
  explicit CsvFile(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    if (!(file_ = std::fopen(path_.c_str(), "w"))) fail(std::strerror(errno));
    if (fileno(file_) > STDERR_FILENO) return;
    // Moved past 0-2, which then stay closed: writes to them fail as they would have.
    const int fd = fcntl(fileno(file_), F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    std::fclose(file_);
    file_ = fd < 0 ? nullptr : fdopen(fd, "w");
    if (!file_) {
      const int why = errno;
      if (fd >= 0) ::close(fd);
      fail(std::strerror(why));
    }
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
    if (closed != 0) fail(std::strerror(errno));
    if (failed) fail("a write to it failed");  // errno may have moved on since
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("--csv: cannot write " + path_ + ": " + why);
  }

  std::string path_;
  FILE* file_ = nullptr;
};

}  // namespace smla::cli
