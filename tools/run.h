// `smla run`: one decode step of a model preset through the step executor, timed and checked.
#pragma once
#include "args.h"

namespace smla::cli {

// Prints the report; returns the exit code (1 when the check fails).
int run_step(const RunOptions& options);

}  // namespace smla::cli
