// SMLA_NUM_THREADS set for one scope and restored after (or unset, if it was), even when the
// scope throws.
#pragma once
#include <cstdlib>
#include <string>

namespace smla::test {

class ThreadsEnv {
 public:
  explicit ThreadsEnv(const char* value) {
    if (const char* old = std::getenv("SMLA_NUM_THREADS")) saved_ = old, had_ = true;
    set(value);
  }
  ThreadsEnv(const ThreadsEnv&) = delete;
  ThreadsEnv& operator=(const ThreadsEnv&) = delete;
  ~ThreadsEnv() { had_ ? set(saved_.c_str()) : void(unsetenv("SMLA_NUM_THREADS")); }

  void set(const char* value) { setenv("SMLA_NUM_THREADS", value, 1); }

 private:
  std::string saved_;
  bool had_ = false;
};

}  // namespace smla::test
