// Command line of the `smla` tool: what each command was asked to do.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "smla/decode.h"
#include "smla/executor.h"

namespace smla::cli {

enum class DeviceChoice { auto_, cpu, cuda };

struct RunOptions {
  std::string model = "v4-flash";
  int requests = 4;    // B
  int context = 4096;  // seq_len of every request, its new tokens included
  int mtp = 1;         // tokens per request (q_len)
  KvLayout kv = KvLayout::bf16;
  DeviceChoice device = DeviceChoice::auto_;
  int check = 8;   // sampled (token, head) rows per layer checked against the oracle
  int groups = 1;  // interleaved SWA groups
  uint64_t seed = 0;
  CompressedIndex compressed_index = CompressedIndex::automatic;  // executor.h
};

enum class Command { help, info, run };

struct Invocation {
  Command command = Command::help;
  RunOptions run;
};

// A command line that is not one: the message says which word and why.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Invocation parse_args(int argc, const char* const* argv);
std::string usage();

}  // namespace smla::cli
