// Progress on stderr for work that runs past a second: a bar redrawn in place on a terminal;
// where stderr is not one (a log, a pipe), plain lines instead, since redraws would be glued to
// the log's next line: at most one a step, about every `log_every` (10 s): a step that ends
// `log_every` or more after the last line prints one.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace smla::cli {

inline constexpr std::chrono::seconds kProgressEvery{10};  // plain lines' default interval

class Progress {
 public:
  Progress(std::string label, int64_t total, std::chrono::milliseconds log_every = kProgressEvery);
  ~Progress();  // clears the bar if one was drawn
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t steps = 1);

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  int64_t total_, done_ = 0;
  Clock::time_point start_ = Clock::now(), drawn_at_ = start_;
  bool drawn_ = false;
  bool terminal_;
  std::chrono::milliseconds log_every_;
};

}  // namespace smla::cli
