#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace smla::cli {
namespace {
constexpr auto kQuiet = std::chrono::seconds(1);  // shorter work draws nothing
constexpr auto kRedraw = std::chrono::milliseconds(100);
constexpr int kWidth = 30;
}  // namespace

Progress::Progress(std::string label, int64_t total, std::chrono::milliseconds log_every)
    : label_(std::move(label)),
      total_(total),
      terminal_(isatty(fileno(stderr)) == 1),
      log_every_(log_every) {}

Progress::~Progress() {
  if (drawn_) std::fprintf(stderr, "\r%*s\r", kWidth + static_cast<int>(label_.size()) + 40, "");
}

void Progress::advance(int64_t steps) {
  done_ += steps;
  const auto now = Clock::now();
  if (!terminal_) {
    if (now - drawn_at_ < log_every_) return;  // the last step's line as any other's
    std::fprintf(stderr, "%s: %lld/%lld after %.0fs\n", label_.c_str(),
                 static_cast<long long>(done_), static_cast<long long>(total_),
                 std::chrono::duration<double>(now - start_).count());
    drawn_at_ = now;
    return;
  }
  if (now - start_ < kQuiet ||
      (drawn_ && now - drawn_at_ < kRedraw && done_ < total_))
    return;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done_ / total_) : kWidth;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%s [%s%s] %lld/%lld %.1fs", label_.c_str(),
               std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
               static_cast<long long>(done_), static_cast<long long>(total_), seconds);
  std::fflush(stderr);
  drawn_ = true;
  drawn_at_ = now;
}

}  // namespace smla::cli
