#include "smla/error.h"

namespace smla {

static std::string message(const std::string& argument, const std::string& expected,
                           const std::string& got) {
  return "smla: " + argument + ": expected " + expected + ", got " + got;
}

Error::Error(ErrorKind kind, std::string argument, std::string expected, std::string got)
    : std::runtime_error(message(argument, expected, got)),
      kind_(kind),
      argument_(std::move(argument)),
      expected_(std::move(expected)),
      got_(std::move(got)) {}

}  // namespace smla
