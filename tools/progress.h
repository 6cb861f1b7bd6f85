// A progress bar on stderr for work that runs past a second; nothing is drawn before that, nor
// when stderr is not a terminal (a log would get the bar's redraws glued to its next line).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace smla::cli {

class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();  // clears the bar if one was drawn
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t steps = 1);

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  int64_t total_, done_ = 0;
  Clock::time_point start_ = Clock::now(), drawn_at_{};
  bool drawn_ = false;
  bool terminal_;
};

}  // namespace smla::cli
