// Command line of the `smla` tool: what each command was asked to do.
#pragma once
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "progress.h"
#include "smla/decode.h"
#include "smla/executor.h"

namespace smla::cli {

enum class DeviceChoice { auto_, cpu, cuda };

struct RunOptions {
  std::string model = "v4-flash";
  int requests = 4;    // B
  int seq_len = 4096;  // of every request, its new tokens included
  int q_len = 1;       // tokens per request (q_len)
  KvLayout kv = KvLayout::bf16;
  DeviceChoice device = DeviceChoice::auto_;
  int check = 8;   // sampled (token, head) rows per layer checked against the oracle
  double tolerance = 0;  // on the check's relative error; 0: the layout's and device's own
  int swa_groups = 1;    // interleaved SWA groups
  uint64_t seed = 0;
  CompressedIndex compressed_index = CompressedIndex::automatic;  // executor.h
  std::chrono::seconds progress = kProgressEvery;  // least gap between progress lines off a tty
};

enum class Command { help, info, run, version };

struct Invocation {
  Command command = Command::help;
  RunOptions run;
};

// A command line that is not one: the message says which word and why.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The words after the program's name, where there is one (argc 0: an execve with an empty
// argv, which Linux before 5.18 and other systems pass on).
inline std::vector<std::string_view> words_of(int argc, const char* const* argv) {
  return {argv + std::min(argc, 1), argv + argc};
}

Invocation parse_args(int argc, const char* const* argv);
std::string usage();

// Whether `word` asks for the usage: --help or -h, which every command takes wherever it stands.
// --help=VALUE or -h=VALUE throws a UsageError (neither takes a value), as parse_flags does.
bool is_help(std::string_view word);

// `text`, all of it, as an integer in [least, most]; else a UsageError naming `flag`. No sign
// where the range has no negatives: "-0" is refused as "+0" is.
template <class T>
T number(std::string_view flag, std::string_view text, T least, T most) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool signed_text = text.starts_with('-') && std::cmp_greater_equal(least, 0);
  if (ec != std::errc() || end != text.data() + text.size() || signed_text || value < least ||
      value > most)
    throw UsageError(std::string(flag) + ": expected an integer in [" + std::to_string(least) +
                     ", " + std::to_string(most) + "], got '" + std::string(text) + "'");
  return value;
}

// Walks `words`, each `--flag VALUE`, `--flag=VALUE` or, for a name in `switches`, `--flag`
// alone (its value then empty), calling set(flag, value) in order. An unknown word, a flag given
// twice or a missing value throws a UsageError naming it. --help is a switch of every command
// (`--help=1` and `-h=1` say they take no value); callers print their usage for it, or -h,
// before (is_help).
void parse_flags(std::span<const std::string_view> words,
                 std::span<const std::string_view> valued,
                 std::span<const std::string_view> switches,
                 const std::function<void(std::string_view flag, std::string_view value)>& set);

}  // namespace smla::cli
