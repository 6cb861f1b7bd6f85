// The `smla` command: parse, then run the command; usage errors exit 2, failures 1 (an output
// that could not be written too: a script reading only the exit code must not see success).
#include <cstdio>
#include <exception>
#include <new>

#include "args.h"
#include "run.h"
#include "smla/decode.h"
#include "smla/error.h"
#include "stdout_status.h"

namespace {

int run(const smla::cli::Invocation& invocation) {
  using namespace smla::cli;
  try {
    switch (invocation.command) {
      case Command::help:
        std::fputs(usage().c_str(), stdout);
        return 0;
      case Command::info:
        std::fputs(smla::backend_info().c_str(), stdout);
        return 0;
      case Command::version:
        std::puts("smla " SMLA_VERSION);
        return 0;
      case Command::run:
        return run_step(invocation.run);
    }
  } catch (const smla::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // already "smla: argument: expected ..., got ..."
    return 1;
  } catch (const std::bad_alloc&) {  // a process limit (ulimit -v) below the step's estimate
    std::fprintf(stderr,
                 "smla: out of host memory (a process limit such as ulimit -v below what the "
                 "step needs?): run a smaller step (--requests, --seq-len, --q-len)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smla: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace smla::cli;
  Invocation invocation;
  try {
    invocation = parse_args(argc, argv);
  } catch (const UsageError& e) {
    // The error, then where the flags are: the whole usage would bury that one line.
    std::fprintf(stderr, "smla: %s\nusage: smla <command> [flags] ('smla help' lists them)\n",
                 e.what());
    return 2;
  }
  return stdout_status("smla", run(invocation));
}
