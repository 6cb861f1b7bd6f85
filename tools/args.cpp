#include "args.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <vector>

#include "smla/model.h"

namespace smla::cli {
namespace {

template <class T>
T choice(std::string_view flag, std::string_view text,
         std::initializer_list<std::pair<std::string_view, T>> options) {
  std::string names;
  for (const auto& [name, value] : options) {
    if (name == text) return value;
    names += names.empty() ? "" : "|";
    names += name;
  }
  throw UsageError(std::string(flag) + ": expected " + names + ", got '" + std::string(text) + "'");
}

std::string model_names() {
  std::string names;
  for (const ModelPreset& p : model_presets()) names += (names.empty() ? "" : "|") + p.name;
  return names;
}

constexpr int kMaxInt = 1 << 30;

constexpr std::string_view kHelp = "--help", kShortHelp = "-h";  // switches of every command

// A switch given a value: what parse_flags and is_help throw.
UsageError no_value(std::string_view flag, std::string_view value) {
  return UsageError(std::string(flag) + ": takes no value, got '" + std::string(value) + "'");
}

// Flags renamed to SPEC's names (--mtp, which also named the model's MTP layers, and those of
// the seventy-ninth session): the old name is refused, naming the new.
constexpr std::pair<std::string_view, std::string_view> kRenamedFlags[] = {
    {"--context", "--seq-len"}, {"--groups", "--swa-groups"}, {"--mtp", "--q-len"}};
using Text = std::string_view;

// The flags of `run`, each with what it sets from its value (f: the flag, v: the value).
struct RunFlag {
  Text name;
  void (*set)(RunOptions& options, Text f, Text v);
};

constexpr RunFlag kRunFlags[] = {
    {"--model",
     [](RunOptions& o, Text f, Text v) {
       for (const ModelPreset& p : model_presets())
         if (p.name == v) return void(o.model = p.name);
       throw UsageError(std::string(f) + ": expected " + model_names() + ", got '" +
                        std::string(v) + "'");
     }},
    {"--requests", [](RunOptions& o, Text f, Text v) { o.requests = number(f, v, 1, kMaxInt); }},
    {"--seq-len", [](RunOptions& o, Text f, Text v) { o.seq_len = number(f, v, 1, kMaxInt); }},
    {"--q-len", [](RunOptions& o, Text f, Text v) { o.q_len = number(f, v, 1, 1024); }},
    {"--check", [](RunOptions& o, Text f, Text v) { o.check = number(f, v, 0, kMaxInt); }},
    {"--tolerance",
     [](RunOptions& o, Text f, Text v) {
       double x = 0;
       const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
       std::string why;  // a positive number past a double's range: which end
       if (ec == std::errc::result_out_of_range && end == v.data() + v.size() &&
           !v.starts_with('-')) {
         char bound[32];
         const bool above = std::isinf(std::strtod(std::string(v).c_str(), nullptr));
         std::snprintf(bound, sizeof bound, "%.2g",
                       above ? std::numeric_limits<double>::max()
                             : std::numeric_limits<double>::denorm_min());
         why = std::string(" (out of range: ") +
               (above ? "above the largest double, " : "below the smallest positive double, ") +
               bound + ")";
       }
       if (ec != std::errc() || end != v.data() + v.size() || !(x > 0) || !std::isfinite(x))
         throw UsageError(std::string(f) + ": expected a finite number > 0, got '" +
                          std::string(v) + "'" + why);
       o.tolerance = x;
     }},
    {"--swa-groups", [](RunOptions& o, Text f, Text v) { o.swa_groups = number(f, v, 1, 64); }},
    {"--progress", [](RunOptions& o, Text f,
                      Text v) { o.progress = std::chrono::seconds(number(f, v, 0, 86400)); }},
    {"--seed",
     [](RunOptions& o, Text f, Text v) { o.seed = number<uint64_t>(f, v, 0, UINT64_MAX); }},
    {"--compressed-index",
     [](RunOptions& o, Text f, Text v) {
       o.compressed_index = choice<CompressedIndex>(f, v,
                                                    {{"auto", CompressedIndex::automatic},
                                                     {"topk", CompressedIndex::topk},
                                                     {"table", CompressedIndex::table}});
     }},
    {"--kv",
     [](RunOptions& o, Text f, Text v) {
       o.kv = choice<KvLayout>(f, v,
                               {{"bf16", KvLayout::bf16},
                                {"fp8_e4m3", KvLayout::fp8_e4m3},
                                {"fp8", KvLayout::fp8_e4m3},  // the short name, as before
                                {"fp8_ds_mla", KvLayout::fp8_ds_mla}});
     }},
    {"--device",
     [](RunOptions& o, Text f, Text v) {
       o.device = choice<DeviceChoice>(f, v,
                                       {{"auto", DeviceChoice::auto_},
                                        {"cpu", DeviceChoice::cpu},
                                        {"cuda", DeviceChoice::cuda}});
     }},
};

// The command a word names: `--version` is `version` (the usage's "also --version"), and takes
// no value, as --help does.
std::string_view command_word(std::string_view word) {
  constexpr std::string_view kVersion = "--version";
  if (word.starts_with(kVersion) && word.substr(kVersion.size()).starts_with('='))
    throw no_value(kVersion, word.substr(kVersion.size() + 1));
  return word == kVersion ? "version" : word;
}

}  // namespace

bool is_help(std::string_view word) {
  for (const std::string_view name : {kHelp, kShortHelp})
    if (word.starts_with(name) && word.substr(name.size()).starts_with('='))
      throw no_value(name, word.substr(name.size() + 1));
  return word == kHelp || word == kShortHelp;
}

void parse_flags(std::span<const std::string_view> words,
                 std::span<const std::string_view> valued,
                 std::span<const std::string_view> switches,
                 const std::function<void(std::string_view flag, std::string_view value)>& set) {
  const auto in = [](std::span<const std::string_view> names, std::string_view name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  std::vector<std::string_view> given;  // a flag twice is a mistake, not "the last one wins"
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string_view word = words[i];
    if (!word.starts_with("--")) {
      is_help(word);  // -h=1 says -h takes no value, as --help=1 does
      throw UsageError("unexpected argument '" + std::string(word) + "' (flags start with --)");
    }
    const size_t eq = word.find('=');
    const std::string_view flag = word.substr(0, eq);
    const bool is_switch = flag == kHelp || in(switches, flag);
    if (!is_switch && !in(valued, flag)) {  // known before its value is taken
      for (const auto& [old_name, name] : kRenamedFlags)
        if (flag == old_name && in(valued, name))
          throw UsageError("unknown flag " + std::string(flag) + " (now " + std::string(name) +
                           ")");
      throw UsageError("unknown flag " + std::string(flag));
    }
    if (in(given, flag)) throw UsageError(std::string(flag) + ": given twice");
    given.push_back(flag);
    std::string_view value;
    if (is_switch) {
      if (eq != std::string_view::npos) throw no_value(flag, word.substr(eq + 1));
    } else if (eq != std::string_view::npos) {
      value = word.substr(eq + 1);
    } else if (i + 1 < words.size()) {
      value = words[++i];
    } else {
      throw UsageError(std::string(flag) + ": missing value (" + std::string(flag) + " VALUE or " +
                       std::string(flag) + "=VALUE)");
    }
    set(flag, value);
  }
}

Invocation parse_args(int argc, const char* const* argv) {
  const std::vector<std::string_view> args = words_of(argc, argv);
  if (args.empty()) throw UsageError("no command");
  Invocation inv;
  // `help run`, `help -h`, `help --version` too: one text covers all.
  const std::string_view command = command_word(args[0]);
  const auto known = [](std::string_view a) { return a == "run" || a == "info" || a == "version"; };
  if (is_help(command) || command == "help") {
    // Any command the usage lists, `help` among them.
    const auto topic = [&](std::string_view a) {
      return known(command_word(a)) || a == "help" || is_help(a);
    };
    if (args.size() > 2 || (args.size() == 2 && !topic(args[1])))
      throw UsageError("help takes a command or nothing, got '" +
                       std::string(args[args.size() > 2 ? 2 : 1]) + "'");
    return inv;
  }
  if (!known(command)) throw UsageError("unknown command '" + std::string(command) + "'");
  // A known command's --help prints the usage, whatever else the line holds.
  if (std::any_of(args.begin() + 1, args.end(), is_help)) return inv;
  if (command != "run") {  // info and version take nothing
    if (args.size() > 1)
      throw UsageError(std::string(command) + " takes no arguments, got '" + std::string(args[1]) +
                       "'");
    inv.command = command == "info" ? Command::info : Command::version;
    return inv;
  }
  inv.command = Command::run;
  std::vector<std::string_view> names;
  for (const RunFlag& flag : kRunFlags) names.push_back(flag.name);
  parse_flags(std::span(args).subspan(1), names, {}, [&](Text flag, Text value) {
    for (const RunFlag& f : kRunFlags)
      if (f.name == flag) f.set(inv.run, flag, value);
  });
  // Layer l is in SWA group l % groups: more groups than layers would leave some empty.
  if (const int layers = model_preset(inv.run.model).num_layers; inv.run.swa_groups > layers)
    throw UsageError("--swa-groups: expected at most the " + std::to_string(layers) +
                     " layers of " + inv.run.model + ", got " + std::to_string(inv.run.swa_groups));
  // A bound on no check would pass silently: an exit 0 that reads as a run within it.
  if (inv.run.tolerance > 0 && inv.run.check == 0)
    throw UsageError("--tolerance: expected --check above 0 (the check it bounds), got --check 0");
  if (inv.run.q_len > inv.run.seq_len)
    throw UsageError("--q-len: expected at most --seq-len = " + std::to_string(inv.run.seq_len) +
                     " tokens, got " + std::to_string(inv.run.q_len));
  return inv;
}

std::string usage() {
  const RunOptions d;
  return "usage: smla <command> [flags]\n"
         "\n"
         "commands:\n"
         "  run      run the attention of every layer of one decode step on synthetic caches\n"
         "  info     print the backends this build has and what each supports\n"
         "  version  print smla's version (also --version)\n"
         "  help     print this text (also --help or -h)\n"
         "\n"
         "run flags:\n"
         "  --model " +
         model_names() + "   model preset (default " + d.model +
         ")\n"
         "  --requests N      requests in the batch, 1..2^30 (default " +
         std::to_string(d.requests) +
         ")\n"
         "  --seq-len N       KV length of each request, new tokens included, 1..2^30 (default " +
         std::to_string(d.seq_len) +
         ")\n"
         "  --q-len N         query tokens per request, 1..1024 and at most --seq-len (default " +
         std::to_string(d.q_len) +
         ")\n"
         "  --kv bf16|fp8_e4m3|fp8_ds_mla   KV cache layout (default bf16; fp8 = fp8_e4m3, run\n"
         "                    with an e4m3 query; the others with a bf16 query)\n"
         "  --device auto|cpu|cuda     where to run (default auto: the GPU when it can run the\n"
         "                    step, else the CPU, with a note saying why)\n"
         "  --check N         distinct (token, head) rows per layer checked against a float64\n"
         "                    oracle, at most all of them (default " +
         std::to_string(d.check) +
         ", 0: no check;\n"
         "                    on CUDA a check keeps host copies of the pools)\n"
         "  --tolerance X     the check's bound on its relative error (default 1e-2; 3e-2 for\n"
         "                    fp8_e4m3 on CUDA, whose scores are e4m3 wgmma; not with --check 0)\n"
         "  --swa-groups N    interleaved SWA KV-cache groups, 1..64 and at most the model's\n"
         "                    layers (default " +
         std::to_string(d.swa_groups) +
         ")\n"
         "  --progress S      where stderr is not a terminal, at most one progress line a layer,\n"
         "                    about every S seconds (a layer that ends S s or more after the last\n"
         "                    line prints one), 0..86400 (default " +
         std::to_string(d.progress.count()) +
         "; 0: a line a layer; a terminal\n"
         "                    gets a bar)\n"
         "  --seed N          seed of the synthetic step, 0..2^64-1 (default " +
         std::to_string(d.seed) +
         ")\n"
         "  --compressed-index auto|topk|table   compressed columns read from the top-k by the\n"
         "                    decode, or from a table built per key (docs/sparse_index.md);\n"
         "                    auto (default): the top-k for a key whose table would serve one\n"
         "                    layer in some SWA group, unless it is wider than the decode\n"
         "                    reads on the device (2048 columns on CUDA)\n"
         "\n"
         "exit status: 0 done (and checked); 1 a failed check, a step this machine cannot\n"
         "hold, or another failure; 2 a usage error\n";
}

}  // namespace smla::cli
