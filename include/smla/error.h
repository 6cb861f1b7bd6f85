// The error type of the library: names the argument, what was expected and what came. Host
// memory exhaustion comes as std::bad_alloc.
#pragma once
#include <stdexcept>
#include <string>

namespace smla {

// `type`: wrong dtype or device (Python: TypeError); `value`: wrong shape or value (ValueError);
// `unsupported`: valid input this build or device cannot run (NotImplementedError); `runtime`:
// a CUDA or system failure (RuntimeError).
enum class ErrorKind { type, value, unsupported, runtime };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string argument, std::string expected, std::string got);
  ErrorKind kind() const { return kind_; }
  const std::string& argument() const { return argument_; }
  const std::string& expected() const { return expected_; }
  const std::string& got() const { return got_; }

 private:
  ErrorKind kind_;
  std::string argument_, expected_, got_;
};

}  // namespace smla
