// `smla`'s command line (tools/args.cpp) and its check (tools/oracle.cpp): the rows it samples,
// and a failure for any output value that is not finite; `smla run` on the CPU and its report;
// the synthetic step it runs; the host clock; progress on stderr; the benchmarks' CSV file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../tools/oracle.h"  // not tests/oracle.h
#include "address_space_cap.h"
#include "args.h"
#include "clock.h"
#include "core/sanitizers.h"
#include "cpu/streams.h"
#include "csv_file.h"
#include "host_memory.h"
#include "progress.h"
#include "ref_numeric.h"
#include "report.h"
#include "run.h"
#include "seed.h"
#include "smla/error.h"
#include "smla/executor.h"
#include "synth.h"
#include "threads_env.h"

namespace smla::cli {
namespace {

Invocation parse(std::initializer_list<const char*> words) {
  std::vector<const char*> argv{"smla"};
  argv.insert(argv.end(), words);
  return parse_args(static_cast<int>(argv.size()), argv.data());
}

// The index of the first SWA-only layer (specs.size() where there is none).
size_t first_swa_only(const std::vector<LayerSpec>& specs) {
  const auto swa_only = [](const LayerSpec& s) { return s.compress_ratio == 0; };
  return static_cast<size_t>(std::find_if(specs.begin(), specs.end(), swa_only) - specs.begin());
}

// The command line is refused with exactly `message`.
void expect_usage_error(std::initializer_list<const char*> words, const std::string& message) {
  try {
    parse(words);
    ADD_FAILURE() << "taken; expected: " << message;
  } catch (const UsageError& e) {
    EXPECT_EQ(e.what(), message);
  }
}

TEST(RunArgs, HelpOnlyForKnownCommands) {
  EXPECT_EQ(parse({"help"}).command, Command::help);
  EXPECT_EQ(parse({"--help"}).command, Command::help);
  EXPECT_EQ(parse({"run", "--requests", "5x", "--help"}).command, Command::help);
  EXPECT_EQ(parse({"info", "-h"}).command, Command::help);
  expect_usage_error({"bogus", "--help"}, "unknown command 'bogus'");
  EXPECT_EQ(parse({"help", "run"}).command, Command::help);
  EXPECT_EQ(parse({"--help", "info"}).command, Command::help);
  EXPECT_EQ(parse({"help", "--help"}).command, Command::help);
  EXPECT_EQ(parse({"--help", "-h"}).command, Command::help);
  EXPECT_EQ(parse({"help", "help"}).command, Command::help);  // help is a command too
  EXPECT_EQ(parse({"--help", "help"}).command, Command::help);
  expect_usage_error({"help", "extra"}, "help takes a command or nothing, got 'extra'");
  expect_usage_error({"help", "run", "extra"}, "help takes a command or nothing, got 'extra'");
  expect_usage_error({}, "no command");
}

// A process started without even its name (argc 0: an execve with an empty argv, which Linux
// before 5.18 and other systems pass on) has no command, as `smla` alone; its arguments are not
// the words from argv + 1 to argv + argc (a std::length_error out of parse_args: an abort).
TEST(RunArgs, NoArgumentsAtAllIsNoCommand) {
  const char* const argv[] = {nullptr};
  try {
    parse_args(0, argv);
    ADD_FAILURE() << "taken";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "no command");
  }
}

// --version is the version command wherever a command stands (`smla --version`, `smla help
// --version`, as `smla help -h`) and, as --help, takes no value: --version=1 says so, not
// "unknown command '--version=1'".
TEST(RunArgs, VersionFlagIsTheVersionCommand) {
  EXPECT_EQ(parse({"help", "--version"}).command, Command::help);
  EXPECT_EQ(parse({"-h", "--version"}).command, Command::help);
  expect_usage_error({"--version=1"}, "--version: takes no value, got '1'");
  expect_usage_error({"help", "--version="}, "--version: takes no value, got ''");
  expect_usage_error({"--versions"}, "unknown command '--versions'");
}

TEST(RunArgs, KvLayoutNames) {
  EXPECT_EQ(parse({"run", "--kv", "fp8_e4m3"}).run.kv, KvLayout::fp8_e4m3);
  EXPECT_EQ(parse({"run", "--kv", "fp8"}).run.kv, KvLayout::fp8_e4m3);
  EXPECT_EQ(parse({"run", "--kv=fp8_ds_mla"}).run.kv, KvLayout::fp8_ds_mla);
  expect_usage_error({"run", "--kv", "e4m3"},
                     "--kv: expected bf16|fp8_e4m3|fp8|fp8_ds_mla, got 'e4m3'");
}

// Layer l is in SWA group l % groups: no more groups than the model has layers.
TEST(RunArgs, GroupsAtMostTheModelsLayers) {
  EXPECT_EQ(parse({"run", "--swa-groups", "43"}).run.swa_groups, 43);
  expect_usage_error({"run", "--swa-groups", "44"},
                     "--swa-groups: expected at most the 43 layers of v4-flash, got 44");
  expect_usage_error({"run", "--model", "v41-flash", "--swa-groups", "41"},
                     "--swa-groups: expected at most the 40 layers of v41-flash, got 41");
}

TEST(RunArgs, NumbersAreParsedStrictly) {
  for (const char* bad : {"1.5", "10abc", "-3", "0", "", " 5", "+5", "99999999999"})
    expect_usage_error({"run", "--requests", bad},
                       std::string("--requests: expected an integer in [1, 1073741824], got '") +
                           bad + "'");
  expect_usage_error({"run", "--requests"},
                     "--requests: missing value (--requests VALUE or --requests=VALUE)");
}

// A value below a flag's least is refused naming that flag and its range, not a later rule's
// (--seq-len 0 is not "--q-len: at most --seq-len", --swa-groups 0 never reaches `l % groups`).
TEST(RunArgs, BelowTheLeastNamesTheFlag) {
  for (const auto& [flag, most] :
       {std::pair{"--requests", "1073741824"}, {"--seq-len", "1073741824"}, {"--q-len", "1024"}})
    expect_usage_error({"run", flag, "0"},
                       std::string(flag) + ": expected an integer in [1, " + most + "], got '0'");
  expect_usage_error({"run", "--swa-groups", "0"},
                     "--swa-groups: expected an integer in [1, 64], got '0'");
  for (const char* bad : {"-1", "-0"})
    expect_usage_error(
        {"run", "--check", bad},
        std::string("--check: expected an integer in [0, 1073741824], got '") + bad + "'");
}

// --tolerance takes a finite number > 0 (0, the default, is the layout's own bound).
TEST(RunArgs, ToleranceIsAPositiveFiniteNumber) {
  EXPECT_EQ(parse({"run"}).run.tolerance, 0.0);
  EXPECT_EQ(parse({"run", "--tolerance", "0.015"}).run.tolerance, 0.015);
  EXPECT_EQ(parse({"run", "--tolerance=1e-12"}).run.tolerance, 1e-12);
  EXPECT_EQ(parse({"run", "--tolerance", "4.9e-324"}).run.tolerance,
            std::numeric_limits<double>::denorm_min());
  // No leading '+', as the integer flags (NumbersAreParsedStrictly's "+5").
  for (const char* bad : {"0", "-1e-2", "nan", "inf", "1e-2x", "", "+0.1", "-1e-400"})
    expect_usage_error({"run", "--tolerance", bad},
                       std::string("--tolerance: expected a finite number > 0, got '") + bad + "'");
  // Past a double's range: which end, not as if the number were malformed.
  expect_usage_error({"run", "--tolerance", "1e-400"},
                     "--tolerance: expected a finite number > 0, got '1e-400' (out of range: below "
                     "the smallest positive double, 4.9e-324)");
  expect_usage_error({"run", "--tolerance=1e999"},
                     "--tolerance: expected a finite number > 0, got '1e999' (out of range: above "
                     "the largest double, 1.8e+308)");
  // Out of range but not all a number: malformed, with no range to blame.
  for (const char* bad : {"1e999x", "1e-400x"})
    expect_usage_error({"run", "--tolerance", bad},
                       std::string("--tolerance: expected a finite number > 0, got '") + bad + "'");
}

// --tolerance bounds the check: with --check 0 there is none, and a bound that bounds nothing
// is a mistake (an exit 0 would read as a run within it), not a flag to ignore.
TEST(RunArgs, ToleranceNeedsACheck) {
  EXPECT_EQ(parse({"run", "--check", "1", "--tolerance", "0.5"}).run.tolerance, 0.5);
  EXPECT_EQ(parse({"run", "--check", "0"}).run.check, 0);
  const std::string message =
      "--tolerance: expected --check above 0 (the check it bounds), got "
      "--check 0";
  expect_usage_error({"run", "--check", "0", "--tolerance", "1e-3"}, message);
  expect_usage_error({"run", "--tolerance=1e-3", "--check=0"}, message);
}

// --progress takes whole seconds from 0 (a line a layer) to a day; 10 by default.
TEST(RunArgs, ProgressIsWholeSecondsUpToADay) {
  EXPECT_EQ(parse({"run"}).run.progress, std::chrono::seconds(10));
  EXPECT_EQ(parse({"run", "--progress", "0"}).run.progress, std::chrono::seconds(0));
  EXPECT_EQ(parse({"run", "--progress=86400"}).run.progress, std::chrono::seconds(86400));
  for (const char* bad : {"-1", "-0", "86401", "1.5", ""})
    expect_usage_error(
        {"run", "--progress", bad},
        std::string("--progress: expected an integer in [0, 86400], got '") + bad + "'");
}

// A switch (smla_step_bench's --quick) stands alone: `--quick=1` is refused, not read as --quick,
// and a word after it is not its value.
TEST(RunArgs, SwitchesTakeNoValue) {
  const std::string_view valued[] = {"--csv"}, switches[] = {"--quick"};
  const auto flags = [&](std::vector<std::string_view> words) {
    std::vector<std::pair<std::string, std::string>> set;  // (flag, value) in order
    parse_flags(words, valued, switches, [&](std::string_view flag, std::string_view value) {
      set.emplace_back(flag, value);
    });
    return set;
  };
  using Set = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(flags({"--quick", "--csv=a.csv"}), (Set{{"--quick", ""}, {"--csv", "a.csv"}}));
  for (const auto& [words, message] :
       {std::pair{std::vector<std::string_view>{"--quick=1"}, "--quick: takes no value, got '1'"},
        {{"--quick", "1"}, "unexpected argument '1' (flags start with --)"}}) {
    try {
      flags(words);
      ADD_FAILURE() << "taken; expected: " << message;
    } catch (const UsageError& e) {
      EXPECT_STREQ(e.what(), message);
    }
  }
}

// --help and -h are switches of every command, wherever they stand: given a value, each says it
// takes none (not "unknown flag", "unexpected argument", nor "unknown command" in the command's
// place), as parse_flags does for the benchmarks, whose flags do not list them.
TEST(RunArgs, HelpTakesNoValue) {
  for (const std::string help : {"--help", "-h"}) {
    SCOPED_TRACE(help);
    const std::string one = help + ": takes no value, got '1'";
    expect_usage_error({"run", (help + "=foo").c_str()}, help + ": takes no value, got 'foo'");
    expect_usage_error({"run", "--requests", "2", (help + "=").c_str()},
                       help + ": takes no value, got ''");
    expect_usage_error({(help + "=1").c_str()}, one);
    expect_usage_error({"help", (help + "=1").c_str()}, one);
    expect_usage_error({"info", (help + "=1").c_str()}, one);
    expect_usage_error({"version", (help + "=1").c_str()}, one);
    const std::string_view valued[] = {"--csv"};
    const std::string flag = help + "=1";
    const std::string_view words[] = {"--csv=a.csv", flag};
    try {
      parse_flags(words, valued, {}, [](std::string_view, std::string_view) {});
      ADD_FAILURE() << "taken";
    } catch (const UsageError& e) {
      EXPECT_EQ(e.what(), one);
    }
  }
}

// A renamed flag's refusal names the new flag only where the command takes it: smla_step_bench
// (--csv, --swa-groups) never took --context, whose new name --seq-len it does not have.
TEST(RunArgs, RenamedFlagNamedOnlyWhereItIsTaken) {
  const std::string_view valued[] = {"--csv", "--swa-groups"};
  for (const auto& [word, message] :
       {std::pair{std::string_view("--context=300"), "unknown flag --context"},
        {std::string_view("--groups"), "unknown flag --groups (now --swa-groups)"},
        {std::string_view("--mtp"), "unknown flag --mtp"}}) {
    try {
      parse_flags({&word, 1}, valued, {}, [](std::string_view, std::string_view) {});
      ADD_FAILURE() << "taken; expected: " << message;
    } catch (const UsageError& e) {
      EXPECT_STREQ(e.what(), message);
    }
  }
}

std::vector<Row> sample(int64_t tokens, int64_t heads, int count, uint64_t seed) {
  std::vector<float> storage(1);  // sample_rows reads the shape alone
  const TensorView query = make_view(storage.data(), DType::f32, Device{}, {tokens, heads, 512},
                                     {0, 0, 0});
  std::mt19937_64 rng(seed);
  return sample_rows(query, count, rng);
}

// --check N: N distinct rows, sorted, inside the query; every row once when N >= T * H.
TEST(CheckRows, DistinctSortedAndAllWhenAskedForMore) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  for (int count : {1, 7, 63, 64}) {
    const std::vector<Row> rows = sample(8, 8, count, seed);
    ASSERT_EQ(rows.size(), static_cast<size_t>(count));
    EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
    EXPECT_EQ(std::set<Row>(rows.begin(), rows.end()).size(), rows.size()) << count;
    for (const Row& r : rows) {
      EXPECT_TRUE(r.token >= 0 && r.token < 8 && r.head >= 0 && r.head < 8) << r.token;
    }
  }
  const std::vector<Row> all = sample(3, 5, 1000, seed);
  ASSERT_EQ(all.size(), 15u);
  EXPECT_EQ(std::set<Row>(all.begin(), all.end()).size(), 15u);
}

// Floyd's sampling reaches every row: over many draws of one row of six, each is picked (a draw
// below j alone never picks the last row while there is no collision).
TEST(CheckRows, EveryRowCanBePicked) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  for (int count : {1, 3}) {
    std::set<Row> seen;
    for (uint64_t k = 0; k < 300; ++k) {
      const std::vector<Row> rows = sample(2, 3, count, seed + k);
      seen.insert(rows.begin(), rows.end());
    }
    EXPECT_EQ(seen.size(), 6u) << count;
  }
}

// The oracle decodes e4m3 subnormals (m * 2^-9) by their definition: a swa-only layer whose
// every key code is subnormal checks clean against the CPU decode (their bytes random).
TEST(CheckRows, SubnormalFp8KeysDecoded) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const RunOptions o{.requests = 2,
                     .seq_len = 1 + static_cast<int>(rng() % 300),
                     .q_len = 1,
                     .kv = KvLayout::fp8_e4m3,
                     .check = 0,
                     .seed = rng()};
  const auto specs = model_layers(model_preset(o.model), o.swa_groups);
  const size_t i = first_swa_only(specs);
  ASSERT_LT(i, specs.size());
  const auto streams = make_streams(Device{});
  SynthStep step(o, specs, *streams);
  const TensorView& pool = step.host.layers[i].swa_kv_cache;
  auto* bytes = static_cast<uint8_t*>(pool.data);
  for (int64_t j = 0; j < pool.size(0) * pool.strides[0]; ++j)
    bytes[j] = static_cast<uint8_t>((rng() & 0x80) | (1 + rng() % 7));  // exponent 0, m 1..7
  StepExecutor executor(step.device.layers, *streams, step.num_tokens, step.max_columns,
                        TableSharing::shared, o.compressed_index);
  executor.run_step(step.device.inputs, step.device.queries, step.device.outs);
  std::mt19937_64 rows_rng(seed);
  const CheckResult c =
      check_layer(step.host, i, sample_rows(step.host.queries[i], 1 << 20, rows_rng));
  EXPECT_EQ(c.rows, step.num_tokens * specs[i].num_heads);
  EXPECT_LT(c.max_relative_error, 1e-2);
}

// A V4-Flash step of 2 requests x 2 tokens at seq_len 300, synthesized and run on the CPU: what
// the check's tests read.
struct RanCpuStep {
  explicit RanCpuStep(uint64_t seed)
      : options{.requests = 2, .seq_len = 300, .q_len = 2, .check = 0, .seed = seed},
        specs(model_layers(model_preset(options.model), options.swa_groups)),
        streams(make_streams(Device{})),
        step(options, specs, *streams) {
    StepExecutor executor(step.device.layers, *streams, step.num_tokens, step.max_columns,
                          TableSharing::shared, options.compressed_index);
    executor.run_step(step.device.inputs, step.device.queries, step.device.outs);
  }
  RunOptions options;
  std::vector<LayerSpec> specs;
  std::unique_ptr<Streams> streams;
  SynthStep step;
};

// NaN compares false with every number, so it must not drop out of the check's error: a CPU
// step checks clean, then one value of a sampled row poisoned as NaN or +inf fails it.
TEST(CheckRows, OutputThatIsNotFiniteFails) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  RanCpuStep ran(seed);
  SynthStep& step = ran.step;
  std::mt19937_64 rng(seed);
  const std::vector<Row> rows = sample_rows(step.host.queries[0], 4, rng);
  EXPECT_LT(check_layer(step.host, 0, rows).max_relative_error, 1e-2);
  const TensorView& out = step.host.outs[0];
  // Each end of the row and of its NoPE and RoPE parts: every dim is checked.
  for (const int64_t d : {0, 5, 447, 448, 511}) {
    uint16_t* value = static_cast<uint16_t*>(out.data) + rows[1].token * out.strides[0] +
                      rows[1].head * out.strides[1] + d * out.strides[2];
    const uint16_t kept = *value;
    for (const uint16_t bits : {uint16_t{0x7fc0}, uint16_t{0x7f80}}) {  // bf16 NaN, +inf
      *value = bits;
      const CheckResult poisoned = check_layer(step.host, 0, rows);
      EXPECT_EQ(poisoned.max_relative_error, std::numeric_limits<double>::infinity())
          << bits << " at d = " << d;
      EXPECT_FALSE(poisoned.max_relative_error <= 1e-2) << bits << " at d = " << d;
    }
    *value = kept;
  }
}

// SPEC §2: a +inf sink makes the output 0. The check wants zeros there (its float64 sums were
// NaN then), and a value left nonzero still fails.
TEST(CheckRows, InfiniteSinkWantsZeros) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const RunOptions o{.requests = 1, .seq_len = 200, .check = 0, .seed = seed};
  const auto specs = model_layers(model_preset(o.model), o.swa_groups);
  const auto streams = make_streams(Device{});
  SynthStep step(o, specs, *streams);
  const TensorView &out = step.host.outs[0], &sinks = step.host.layers[0].sinks;
  ASSERT_TRUE(sinks.defined());
  const Row row{0, 1};
  sinks.ptr<float>()[row.head] = std::numeric_limits<float>::infinity();
  uint16_t* values =
      static_cast<uint16_t*>(out.data) + row.token * out.strides[0] + row.head * out.strides[1];
  for (int d = 0; d < 512; ++d) values[d * out.strides[2]] = 0;
  const CheckResult zeros = check_layer(step.host, 0, {row});
  EXPECT_EQ(zeros.rows, 1);
  EXPECT_EQ(zeros.max_error, 0.0);
  values[7 * out.strides[2]] = 0x3f80;  // 1.0
  const CheckResult one = check_layer(step.host, 0, {row});
  EXPECT_EQ(one.max_error, 1.0);
  EXPECT_EQ(one.max_relative_error, 1.0);  // over no magnitude: the error itself, which fails
}

// The check's scores are float64: a query row of 2^24, 1 and -2^24 in three dims against a key of
// ones there scores 1, where a float sum (2^24 + 1 rounds to 2^24) scores 0. One key, one sink:
// the output is the key times 1 / (1 + e^(sink - score)), which checks within bf16's rounding
// (half an ulp: at most 2^-8 of the value).
TEST(CheckRows, ScoresAreFloat64) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const RunOptions o{.requests = 1, .seq_len = 1, .check = 0, .seed = rng()};
  const auto specs = model_layers(model_preset(o.model), o.swa_groups);
  const size_t i = first_swa_only(specs);
  ASSERT_LT(i, specs.size());
  const auto streams = make_streams(Device{});
  SynthStep step(o, specs, *streams);
  const AttentionLayer& layer = step.host.layers[i];
  std::set<int64_t> picked;  // three dims, summed in increasing order
  while (picked.size() < 3) picked.insert(static_cast<int64_t>(rng() % kHeadDim));
  const std::vector<int64_t> dims(picked.begin(), picked.end());
  const int64_t head = static_cast<int64_t>(rng() % static_cast<uint64_t>(specs[i].num_heads));
  const TensorView& pool = layer.swa_kv_cache;  // every row the key
  auto* keys = static_cast<uint16_t*>(pool.data);
  for (int64_t r = 0; r < pool.size(0) * pool.size(1); ++r)
    for (int64_t d = 0; d < kHeadDim; ++d)
      keys[r * pool.strides[1] + d] = picked.contains(d) ? test::to_bf16(1.0) : 0;
  const TensorView &query = step.host.queries[i], &out = step.host.outs[i];
  uint16_t* q = static_cast<uint16_t*>(query.data) + head * query.strides[1];
  std::fill(q, q + kHeadDim, uint16_t{0});
  q[dims[0]] = test::to_bf16(0x1p24);
  q[dims[1]] = test::to_bf16(1.0);
  q[dims[2]] = test::to_bf16(-0x1p24);
  const double sink = layer.sinks.ptr<float>()[head];
  const double weight = 1 / (1 + std::exp(sink - double(layer.bmm1_scale)));
  uint16_t* row = static_cast<uint16_t*>(out.data) + head * out.strides[1];
  for (int64_t d = 0; d < kHeadDim; ++d)
    row[d] = picked.contains(d) ? test::to_bf16(layer.bmm2_scale * weight) : 0;
  const CheckResult c = check_layer(step.host, i, {Row{0, head}});
  EXPECT_EQ(c.rows, 1);
  EXPECT_LE(c.max_relative_error, std::ldexp(1.0, -8)) << "sink " << sink;
}

// The relative error is over the row's largest |oracle| value, whichever its sign: an out left
// zero (a step made, not run) is off by exactly that in every row, 1.0 relative, in each layout.
TEST(CheckRows, ZeroOutIsOffByTheRowsLargestMagnitude) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  for (KvLayout kv : {KvLayout::bf16, KvLayout::fp8_e4m3, KvLayout::fp8_ds_mla}) {
    const RunOptions o{
        .requests = 2, .seq_len = 300, .q_len = 2, .kv = kv, .check = 0, .seed = seed};
    const auto specs = model_layers(model_preset(o.model), o.swa_groups);
    const auto streams = make_streams(Device{});
    const SynthStep step(o, specs, *streams);
    for (size_t i : {size_t{0}, specs.size() - 1}) {
      std::mt19937_64 rng(seed);
      const CheckResult c =
          check_layer(step.host, i, sample_rows(step.host.queries[i], 1 << 20, rng));
      EXPECT_GT(c.max_error, 0);
      EXPECT_EQ(c.max_relative_error, 1.0) << kv_layout_name(kv) << ", layer " << i;
    }
  }
}

// On CUDA `smla run` times the step after a warm-up step that wrote the same outs: cleared
// between the two, a row the timed step leaves unwritten fails the check (1.0 relative, as an
// out never written) instead of passing on the warm-up's value.
TEST(SynthStep, ClearedOutsFailTheCheck) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  RanCpuStep ran(seed);
  SynthStep& step = ran.step;
  const size_t last = ran.specs.size() - 1;
  const auto check = [&](size_t i) {
    std::mt19937_64 rng(seed);
    return check_layer(step.host, i, sample_rows(step.host.queries[i], 1 << 20, rng));
  };
  for (size_t i : {size_t{0}, last}) EXPECT_LT(check(i).max_relative_error, 1e-2);
  step.clear_outs();
  for (size_t i : {size_t{0}, last}) EXPECT_EQ(check(i).max_relative_error, 1.0) << "layer " << i;
  // The check's maximum fails once any row is cleared: every row must be, or a row left
  // unwritten past the cleared ones would still pass on the warm-up's value.
  for (size_t i = 0; i <= last; ++i) {
    const TensorView& out = step.host.outs[i];
    const auto* bytes = static_cast<const std::byte*>(out.data);
    const size_t size = static_cast<size_t>(out.numel()) * dtype_size(out.dtype);
    EXPECT_TRUE(std::all_of(bytes, bytes + size, [](std::byte b) { return b == std::byte{0}; }))
        << "layer " << i;
  }
}

// Each flag's bounds are inclusive: the least and the most are taken, one past either refused.
TEST(RunArgs, BoundsAreInclusive) {
  EXPECT_EQ(parse({"run", "--requests", "1"}).run.requests, 1);
  EXPECT_EQ(parse({"run", "--check", "0"}).run.check, 0);
  EXPECT_EQ(parse({"run", "--seq-len", "2000", "--q-len", "1024"}).run.q_len, 1024);
  expect_usage_error({"run", "--seq-len", "2000", "--q-len", "1025"},
                     "--q-len: expected an integer in [1, 1024], got '1025'");
  EXPECT_EQ(parse({"run", "--seed", "18446744073709551615"}).run.seed, UINT64_MAX);
  expect_usage_error({"run", "--seed", "18446744073709551616"},
                     "--seed: expected an integer in [0, 18446744073709551615], got "
                     "'18446744073709551616'");
  // The step's tokens are the last of each request's context: all of it, but no more.
  EXPECT_EQ(parse({"run", "--seq-len", "3", "--q-len", "3"}).run.q_len, 3);
  expect_usage_error({"run", "--seq-len", "3", "--q-len", "4"},
                     "--q-len: expected at most --seq-len = 3 tokens, got 4");
}

// What `smla help` promises for a bare `smla run` (scripts/run.sh's main job): a v4-flash step
// of 4 requests of 4096 tokens, one new token each, checked on 8 rows per layer, with a progress
// line at most every 10 s off a terminal.
TEST(RunArgs, DefaultsAreThoseTheUsageStates) {
  const RunOptions o = parse({"run"}).run;
  EXPECT_EQ(o.model, "v4-flash");
  EXPECT_EQ(o.requests, 4);
  EXPECT_EQ(o.seq_len, 4096);
  EXPECT_EQ(o.q_len, 1);
  EXPECT_EQ(o.kv, KvLayout::bf16);
  EXPECT_EQ(o.device, DeviceChoice::auto_);
  EXPECT_EQ(o.check, 8);
  EXPECT_EQ(o.swa_groups, 1);
  EXPECT_EQ(o.seed, 0u);
  const std::string text = usage();
  for (const char* line : {"(default v4-flash)", "(default 4)", "(default 4096)", "(default 1)",
                           "(default 8, 0: no check", "(default 0)", "0..86400 (default 10;"})
    EXPECT_NE(text.find(line), std::string::npos) << line;
}

// `smla help` is the flags' only list: each one `run` takes has its line.
TEST(RunArgs, EveryFlagIsInTheUsage) {
  const std::string text = usage();
  for (const char* flag : {"--model", "--requests", "--seq-len", "--q-len", "--kv", "--device",
                           "--check", "--tolerance", "--swa-groups", "--progress", "--seed",
                           "--compressed-index"}) {
    EXPECT_NE(text.find(std::string("\n  ") + flag + " "), std::string::npos) << flag;
  }
  // The bounds a flag's refusal names, what each exit status means, and help's short name.
  for (const char* line :
       {"(also --help or -h)", "1..1024 and at most --seq-len", "1..64 and at most the model's",
        "synthetic step, 0..2^64-1 (default 0)", "\nexit status: 0 done", "2 a usage error\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line;
}

TEST(RunArgs, NamesAndWordsRefused) {
  EXPECT_EQ(parse({"run", "--device", "cpu"}).run.device, DeviceChoice::cpu);
  EXPECT_EQ(parse({"run", "--device=cuda"}).run.device, DeviceChoice::cuda);
  EXPECT_EQ(parse({"run", "--device", "auto"}).run.device, DeviceChoice::auto_);
  EXPECT_EQ(parse({"run", "--model", "v4-pro"}).run.model, "v4-pro");
  expect_usage_error({"run", "--model", "v4"},
                     "--model: expected v4-flash|v4-pro|v41-flash, got 'v4'");
  expect_usage_error({"run", "4"}, "unexpected argument '4' (flags start with --)");
  expect_usage_error({"run", "--requests", "2", "--bogus", "1"}, "unknown flag --bogus");
  // Flags renamed to SPEC's names say what they are called now.
  expect_usage_error({"run", "--context", "300"}, "unknown flag --context (now --seq-len)");
  expect_usage_error({"run", "--groups=3"}, "unknown flag --groups (now --swa-groups)");
  // --mtp, the query tokens per request before SPEC's --q-len (docs/benchmarks.md's older runs).
  expect_usage_error({"run", "--mtp", "2"}, "unknown flag --mtp (now --q-len)");
  expect_usage_error({"info", "run"}, "info takes no arguments, got 'run'");
  EXPECT_EQ(parse({"info"}).command, Command::info);
  EXPECT_EQ(parse({"run"}).command, Command::run);
  EXPECT_EQ(parse({"version"}).command, Command::version);
  EXPECT_EQ(parse({"--version"}).command, Command::version);
  expect_usage_error({"--version", "run"}, "version takes no arguments, got 'run'");
  EXPECT_EQ(parse({"version", "--help"}).command, Command::help);  // as every command's --help
  EXPECT_EQ(parse({"help", "version"}).command, Command::help);
}

// Standard output and error of `run`, captured.
struct Printed {
  std::string out, err;
};
template <class F>
Printed printed(F&& run) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  try {
    run();
  } catch (...) {
    testing::internal::GetCapturedStdout();
    testing::internal::GetCapturedStderr();
    throw;
  }
  const std::string out = testing::internal::GetCapturedStdout();
  return {out, testing::internal::GetCapturedStderr()};
}

// The figures follow from the layers' times and columns: a kind's rows in order of first
// appearance, GB/s of fp8_ds_mla's 584-byte rows and 4-byte indices plus one token's bf16 query
// and output (64 heads: 131,072 B; 128: 262,144), 4 * H * 512 FLOP a column, the tables' counts.
TEST(Report, TotalsPerKindAndTheCheck) {
  RunReport r{.options = {.model = "v41-flash",
                          .requests = 1,
                          .seq_len = 300,
                          .q_len = 1,
                          .kv = KvLayout::fp8_ds_mla,
                          .swa_groups = 2,
                          .compressed_index = CompressedIndex::topk},
              .device = "cpu (1 thread)",
              .kv_bytes = 3 * 1048576,
              .layers = {{"swa-only", 64, 2e-5, 1000},
                         {"ratio 4", 128, 5e-5, 3000},  // FLOP count each layer's own heads
                         {"swa-only", 64, 2e-5, 1000}},
              .tables = {.builds = {{{0, "a"}, 2}, {{1, "a"}, 3}},
                         .forks = {{1, "a"}},
                         .waits = {3, 4},
                         .peak_bytes = 3 * 1048576 / 2},
              .check = CheckResult{.rows = 129, .max_error = 1.5e-4, .max_relative_error = 5e-3},
              .tolerance = 1e-2};
  const std::string want =
      "v41-flash: 3 layers, 1 request x 1 token, seq_len 300, fp8_ds_mla KV (3.0 MiB), "
      "bf16 query, 2 SWA groups, compressed index topk, on cpu (1 thread)\n"
      "layers      count    time ms   ms/layer      GB/s   TFLOP/s\n"
      "swa-only        2      0.040      0.020     35.95     6.554\n"
      "ratio 4         1      0.050      0.050     40.52    15.729\n"
      "total           3      0.090      0.030     38.49    11.651\n"
      "tables: 5 built (1 forked), 2 lookups waited for a fork, peak 1.50 MiB\n";
  EXPECT_EQ(printed([&] { print_report(r); }).out,
            want + "check: 129 (token, head) rows vs a float64 oracle: max |error| 1.50e-04, "
                   "max relative 5.00e-03 (tolerance 1e-02): ok\n");
  r.check->every_row = true;
  r.check->max_relative_error = 1e-2;  // at the tolerance: still ok
  EXPECT_NE(printed([&] { print_report(r); }).out.find(
                "rows (every row of each layer) vs a float64 oracle: max |error| 1.50e-04, "
                "max relative 1.00e-02 (tolerance 1e-02): ok\n"),
            std::string::npos);
  r.check->max_relative_error = 1.01e-2;
  EXPECT_NE(printed([&] { print_report(r); }).out.find("(tolerance 1e-02): FAILED\n"),
            std::string::npos);
  r.check.reset();
  r.options.requests = r.options.q_len = 2;
  r.options.swa_groups = 1;
  const std::string out = printed([&] { print_report(r); }).out;
  EXPECT_EQ(out.find("check:"), std::string::npos) << out;
  EXPECT_NE(out.find(", 2 requests x 2 tokens, "), std::string::npos) << out;
  EXPECT_NE(out.find(", 1 SWA group, "), std::string::npos) << out;
}

// GB/s counts the bytes that must move, as smla_bench's floor does (docs/benchmarks.md): each
// attended column's KV row and 4-byte index, each token's query and bf16 output. Hand counts,
// v4-flash's default step (4 requests x 1 token, H = 64): a swa-only layer attends 4 x 128
// columns: 512 x 1024 B of rows + 512 x 4 B of indices + 4 x 64 x 512 x (2 + 2) B of query and
// output = 1,050,624 B, so 1.05 GB/s in 1 ms (the rows alone, 0.52, were printed before); an e4m3
// query is 1 byte a value: 512 x 512 + 512 x 4 + 4 x 64 x 512 x 3 = 657,408 B, 0.66 GB/s.
TEST(Report, GigabytesAreTheBytesThatMustMove) {
  RunReport r{.options = {.requests = 4, .q_len = 1},
              .device = "cpu (1 thread)",
              .layers = {{"swa-only", 64, 1e-3, 512}}};
  std::string out = printed([&] { print_report(r); }).out;
  EXPECT_NE(out.find("\nswa-only        1      1.000      1.000      1.05     0.067\n"),
            std::string::npos)
      << out;
  r.options.kv = KvLayout::fp8_e4m3;
  out = printed([&] { print_report(r); }).out;
  EXPECT_NE(out.find("\nswa-only        1      1.000      1.000      0.66     0.067\n"),
            std::string::npos)
      << out;
}

// The report's plurals are each their own count's (2 requests x 1 token, 1 request x 2 tokens,
// 1 layer, 1 lookup waited), and the tolerance is printed in the fewest digits that read back as
// itself: 1.5e-2 is not rounded to 2e-02, and a value of any digits reads back exactly.
TEST(Report, PluralsAndTheToleranceAsGiven) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  RunReport r{.options = {.requests = 2, .q_len = 1},
              .device = "cpu (1 thread)",
              .layers = {{"swa-only", 64, 1e-3, 1000}},
              .check = CheckResult{.rows = 8}};
  std::string out = printed([&] { print_report(r); }).out;
  EXPECT_NE(out.find(", 2 requests x 1 token, "), std::string::npos) << out;
  r.options.requests = 1;
  r.options.q_len = 2;
  out = printed([&] { print_report(r); }).out;
  EXPECT_NE(out.find(", 1 request x 2 tokens, "), std::string::npos) << out;
  EXPECT_NE(out.find(": 1 layer, "), std::string::npos) << out;
  EXPECT_NE(out.find(", 0 lookups waited "), std::string::npos) << out;
  r.tables.waits = {2};
  out = printed([&] { print_report(r); }).out;
  EXPECT_NE(out.find(", 1 lookup waited "), std::string::npos) << out;
  const auto tolerance = [&](double x) {
    r.tolerance = x;
    const std::string text = printed([&] { print_report(r); }).out;
    const size_t at = text.find("(tolerance ") + 11;
    return text.substr(at, text.find(')', at) - at);
  };
  EXPECT_EQ(tolerance(1.5e-2), "1.5e-02");
  EXPECT_EQ(tolerance(3e-2), "3e-02");
  EXPECT_EQ(tolerance(1.25e-3), "1.25e-03");
  const double x = std::uniform_real_distribution<double>(1e-6, 1)(rng);
  EXPECT_EQ(std::strtod(tolerance(x).c_str(), nullptr), x) << tolerance(x);
}

// `smla run` on the CPU, its report captured; `status` its exit code.
Printed run_printed(const RunOptions& o, int& status) {
  return printed([&] { status = run_step(o); });
}

// Small CPU steps of each KV layout and both models check clean at the CLI's tolerance and say
// so: the rows checked (8 a layer), the tolerance, nothing on stderr (no note about CUDA when
// the CPU was asked for; progress lines a day apart, as a slow run, under a sanitizer or a
// loaded machine, may pass 10 s: an ASan build did). Contexts from one token, where
// the sinks weigh most, to past the window and a page, for 1 to 3 tokens a request.
TEST(RunStep, SmallCpuStepsCheckClean) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const test::ThreadsEnv threads("1");
  struct Case {
    const char* model;
    KvLayout kv;
    int groups, layers;
  };
  for (const Case c : {Case{"v4-flash", KvLayout::bf16, 1, 43},
                       Case{"v4-flash", KvLayout::fp8_e4m3, 1, 43},
                       Case{"v4-flash", KvLayout::fp8_ds_mla, 2, 43},
                       Case{"v41-flash", KvLayout::bf16, 3, 40}}) {
    const int context = 1 + static_cast<int>(rng() % 400);
    const int q_len = 1 + static_cast<int>(rng() % std::min(context, 3));
    const RunOptions o{.model = c.model,
                       .requests = 2,
                       .seq_len = context,
                       .q_len = q_len,
                       .kv = c.kv,
                       .device = DeviceChoice::cpu,
                       .swa_groups = c.groups,
                       .seed = rng(),
                       .progress = std::chrono::hours(24)};
    int status = -1;
    const Printed p = run_printed(o, status);
    SCOPED_TRACE(p.out);
    EXPECT_EQ(status, 0);
    EXPECT_EQ(p.err, "");
    const std::string head = std::string(c.model) + ": " + std::to_string(c.layers) +
                             " layers, 2 requests x " + std::to_string(q_len) +
                             (q_len > 1 ? " tokens" : " token") + ", seq_len " +
                             std::to_string(context) + ", " + kv_layout_name(c.kv) + " KV (";
    EXPECT_EQ(p.out.substr(0, head.size()), head);
    EXPECT_NE(p.out.find(", on cpu (1 thread), no warm-up step\n"), std::string::npos);
    EXPECT_NE(p.out.find("\ncheck: " + std::to_string(8 * c.layers) +
                         " (token, head) rows vs a float64 oracle: "),
              std::string::npos);
    EXPECT_NE(p.out.find("(tolerance 1e-02): ok\n"), std::string::npos);
  }
}

// --check N at T * H rows a layer checks every row and says so; one fewer does not; 0 checks
// nothing and prints no check.
TEST(RunStep, CheckCountsEveryRowOrNone) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const test::ThreadsEnv threads("2");
  RunOptions o{.requests = 1,
               .seq_len = 1 + static_cast<int>(seed % 200),
               .device = DeviceChoice::cpu,
               .check = 64,  // v4-flash: one token of 64 heads
               .seed = seed,
               .progress = std::chrono::hours(24)};  // stderr empty however slow the run
  int status = -1;
  Printed p = run_printed(o, status);
  EXPECT_EQ(status, 0);
  EXPECT_NE(p.out.find(", on cpu (2 threads), no warm-up step\n"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("\ncheck: 2752 (token, head) rows (every row of each layer) vs "),
            std::string::npos)
      << p.out;
  o.check = 63;
  p = run_printed(o, status);
  EXPECT_EQ(status, 0);
  EXPECT_NE(p.out.find("\ncheck: 2709 (token, head) rows vs "), std::string::npos) << p.out;
  o.check = 0;
  p = run_printed(o, status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(p.out.find("check:"), std::string::npos) << p.out;
  for (const char* kind : {"\nswa-only        2 ", "\nratio 4        21 ", "\nratio 128      20 ",
                           "\ntotal          43 "})
    EXPECT_NE(p.out.find(kind), std::string::npos) << kind << "\n" << p.out;
  // The executor's own count: one SWA group's table; the compressed layers read their top-k.
  EXPECT_NE(p.out.find("\ntables: 1 built (0 forked), "), std::string::npos) << p.out;
  EXPECT_EQ(p.err, "");
}

// Runs `o` on the CPU and checks each kind's row: GB/s x time gives back the bytes of the columns
// its layers attend (the same step made again; each column's row and 4-byte index) and of their
// tokens' queries and outputs, TFLOP/s x time 4 * H * 512 FLOP a column, each layer's own H.
// Returns each kind's ms a layer, as printed.
std::map<std::string, double> expect_figures_of_each_kind(const RunOptions& o) {
  const test::ThreadsEnv threads("2");
  int status = -1;
  const Printed p = run_printed(o, status);
  EXPECT_EQ(status, 0);
  SCOPED_TRACE(p.out);
  const auto specs = model_layers(model_preset(o.model), o.swa_groups);
  const auto streams = make_streams(Device{});
  const SynthStep step(o, specs, *streams);
  std::map<std::string, double> bytes, flops, ms_per_layer;
  for (size_t i = 0; i < specs.size(); ++i) {
    const double heads = specs[i].num_heads, columns = double(step.attended[i]);
    bytes[layer_kind(specs[i])] +=
        columns * (kv_row_bytes(o.kv) + 4) + double(step.num_tokens) * heads * 512 * (2 + 2);
    flops[layer_kind(specs[i])] += 4 * heads * 512 * columns;
  }
  for (const auto& [kind, want] : bytes) {
    const size_t at = p.out.find("\n" + kind + " ");
    EXPECT_NE(at, std::string::npos) << kind;
    if (at == std::string::npos) continue;
    std::istringstream row(p.out.substr(at + 1 + kind.size()));
    double count = 0, ms = 0, gb_per_s = 0, tflop_per_s = 0;
    row >> count >> ms >> ms_per_layer[kind] >> gb_per_s >> tflop_per_s;
    const double gb_want = want / (ms * 1e-3) / 1e9;  // ms, GB/s and TFLOP/s as rounded
    const double tflop_want = flops[kind] / (ms * 1e-3) / 1e12;
    EXPECT_NEAR(gb_per_s, gb_want, 0.006 + 0.01 * gb_want) << kind;
    EXPECT_NEAR(tflop_per_s, tflop_want, 0.0006 + 0.01 * tflop_want) << kind;
  }
  return ms_per_layer;
}

// Each layer's row of the table is its own: each kind's figures are its layers' (above), and
// kinds of different widths (128 columns a token against 640) take different times a layer.
TEST(RunStep, FiguresAreEachLayersOwn) {
  const std::map<std::string, double> ms_per_layer =
      expect_figures_of_each_kind({.requests = 2,
                                   .seq_len = 3000,
                                   .q_len = 2,
                                   .device = DeviceChoice::cpu,
                                   .check = 0,
                                   .seed = 5});
  EXPECT_NE(ms_per_layer.at("swa-only"), ms_per_layer.at("ratio 4"));
}

// The figures count each layer's own heads: V4-Pro's 128, not V4-Flash's 64 (at short contexts
// the H-head queries and outputs are the larger part of the bytes).
TEST(RunStep, FiguresCountEachLayersHeads) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const int context = 1 + static_cast<int>(rng() % 600);
  const RunOptions o{.model = "v4-pro",
                     .requests = 2,
                     .seq_len = context,
                     .q_len = 1 + static_cast<int>(rng() % std::min(context, 2)),
                     .device = DeviceChoice::cpu,
                     .check = 0,
                     .seed = rng(),
                     .progress = std::chrono::hours(24)};
  ASSERT_EQ(model_layers(model_preset(o.model), o.swa_groups).front().num_heads, 128);
  expect_figures_of_each_kind(o);
}

// --device cuda is a demand: where no CUDA device can run the step (a build without CUDA, or a
// machine without a Hopper GPU) it is refused rather than run on the CPU.
TEST(RunStep, CudaAskedForWithoutIt) {
  if (query_capability(kHeadDim, DType::bf16, DType::bf16, kSwaBlockSize, {DeviceKind::cuda, 0})
          .supported)
    GTEST_SKIP() << "a CUDA device here runs the step";
  const RunOptions o{.requests = 1, .seq_len = 64, .device = DeviceChoice::cuda, .check = 0};
  try {
    printed([&] { run_step(o); });
    ADD_FAILURE() << "ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "--device");
    EXPECT_EQ(e.got().rfind("none: ", 0), 0u) << e.what();  // then why, as the note says it
  }
}

// --device auto (the default) where no CUDA device can run the step: the CPU runs it, and a note
// on stderr, not in the report, says why.
TEST(RunStep, AutoFallsBackToTheCpuWithANote) {
  if (query_capability(kHeadDim, DType::bf16, DType::bf16, kSwaBlockSize, {DeviceKind::cuda, 0})
          .supported)
    GTEST_SKIP() << "a CUDA device here runs the step";
  const test::ThreadsEnv threads("1");
  const RunOptions o{.requests = 1, .seq_len = 64, .check = 0};
  ASSERT_EQ(o.device, DeviceChoice::auto_);
  int status = -1;
  const Printed p = run_printed(o, status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(p.err.rfind("note: running on the CPU; cuda: ", 0), 0u) << p.err;
  EXPECT_EQ(p.out.find("note:"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find(", on cpu (1 thread), no warm-up step\n"), std::string::npos) << p.out;
}

// What a synthetic step attends, from its options alone: each token's causal window of W rows
// (all of them visible in its block table), and its top-k: distinct entries already compressed,
// min(width, visible) of them, -1 padded; an indexer's a random pick, not the first ones; a
// layer without one every entry in order. The contexts: short of the window; a first visible
// row at the end of a page (SPEC's page 63 of 64 left in the table); past the indexer's 512
// entries of ratio 4.
TEST(SynthStep, WindowsTopKAndColumnsFollowTheOptions) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const int W = kWindow, q_len = 4;
  for (const int context : {q_len + static_cast<int>(rng() % (W - q_len)),
                            W + 62 + q_len + 64 * static_cast<int>(rng() % 3),
                            4 * 512 + q_len + static_cast<int>(rng() % 64)}) {
    SCOPED_TRACE("context " + std::to_string(context));
    const RunOptions o{.requests = 2, .seq_len = context, .q_len = q_len, .seed = rng()};
    const auto specs = model_layers(model_preset(o.model), 1);
    const auto streams = make_streams(Device{});
    const SynthStep step(o, specs, *streams);
    const TensorView& table = step.host.inputs.block_tables[0];
    for (size_t i = 0; i < specs.size(); ++i) {
      const LayerSpec& s = specs[i];
      int64_t columns = 0;
      for (int64_t t = 0; t < step.num_tokens; ++t) {
        const int64_t b = t / q_len, pos = context - q_len + t % q_len;
        for (int64_t p = std::max<int64_t>(pos - W + 1, 0); p <= pos; ++p, ++columns)
          ASSERT_GE(table.ptr<int32_t>()[b * table.strides[0] + p / 64], 0) << t << ", " << p;
        if (s.compress_ratio == 0) continue;
        const TensorView& topk = step.host.inputs.topk_indices.at(s.index_source);
        const int64_t width = topk.size(1), visible = (pos + 1) / s.compress_ratio;
        const int32_t* row = topk.ptr<int32_t>() + t * width;
        const int64_t valid = std::min(width, visible);
        const std::set<int32_t> entries(row, row + valid);
        EXPECT_EQ(static_cast<int64_t>(entries.size()), valid) << i << ", " << t;
        EXPECT_TRUE(valid == 0 || (*entries.begin() >= 0 && *entries.rbegin() < visible));
        EXPECT_TRUE(std::all_of(row + valid, row + width, [](int32_t x) { return x == -1; }));
        if (s.index_topk > 0 && visible > width)
          EXPECT_FALSE(std::is_sorted(row, row + valid)) << i << ", " << t;
        if (s.index_topk == 0)  // every entry, in order
          EXPECT_TRUE(std::is_sorted(row, row + valid)) << i << ", " << t;
        columns += valid;
      }
      EXPECT_EQ(step.attended[i], columns) << "layer " << i;
    }
  }
}

// The block tables' live pages are a shuffled permutation of the pool's pages, not each request's
// pages in order: a decode that read pages by position instead of through its table would
// otherwise check clean.
TEST(SynthStep, BlockTablesAreShuffled) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  // 2048: the first token's window starts on a page's first slot (page 30 of 64-slot pages).
  const RunOptions o{.requests = 16, .seq_len = 2048, .check = 0, .seed = seed};
  const auto specs = model_layers(model_preset(o.model), 1);
  const auto streams = make_streams(Device{});
  const SynthStep step(o, specs, *streams);
  std::vector<const TensorView*> tables{&step.host.inputs.block_tables[0]};
  for (const auto& [source, table] : step.host.inputs.compressed_block_tables)
    tables.push_back(&table);
  for (const TensorView* table : tables) {
    std::vector<int32_t> live;
    for (int64_t j = 0; j < table->size(0) * table->size(1); ++j)
      if (const int32_t id = table->ptr<int32_t>()[j]; id >= 0) live.push_back(id);
    ASSERT_GE(live.size(), 16u);
    EXPECT_FALSE(std::is_sorted(live.begin(), live.end()));
    std::vector<int32_t> ids(live.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(live.begin(), live.end());
    EXPECT_EQ(live, ids);
  }
  // SWA pages wholly before every window of the step are evicted (-1), the rest live: the
  // step's first token, at position 2048 - q_len, sees from 2048 - q_len - 127 on.
  const TensorView& swa = step.host.inputs.block_tables[0];
  const int64_t evicted = (o.seq_len - o.q_len - kWindow + 1) / kSwaBlockSize;
  ASSERT_EQ(evicted, 30);
  for (int64_t b = 0; b < o.requests; ++b)
    for (int64_t page = 0; page < swa.size(1); ++page)
      EXPECT_EQ(swa.ptr<int32_t>()[b * swa.stride(0) + page] < 0, page < evicted)
          << "request " << b << ", page " << page;
}

// An indexer's top-k is a random pick among all the entries a token sees: with a few more entries
// than the top-k holds, every one of them, the newest included, is picked by some token of the
// step (one token a request, so that all see the same entries).
TEST(SynthStep, IndexerTopKReachesEveryEntry) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const auto specs = model_layers(model_preset("v4-flash"), 1);
  const auto indexed = std::find_if(specs.begin(), specs.end(), [](const LayerSpec& s) {
    return s.compress_ratio > 0 && s.index_topk > 0 && s.index_source == s.layer;
  });
  ASSERT_NE(indexed, specs.end());
  const int ratio = indexed->compress_ratio, width = indexed->index_topk;
  const int visible = width + 1 + static_cast<int>(rng() % 16);
  const RunOptions o{.requests = 16,
                     .seq_len = visible * ratio + static_cast<int>(rng() % ratio),
                     .check = 0,
                     .seed = rng()};
  const auto streams = make_streams(Device{});
  const SynthStep step(o, specs, *streams);
  const TensorView& topk = step.host.inputs.topk_indices.at(indexed->layer);
  ASSERT_EQ(topk.size(1), width);
  std::set<int32_t> picked;
  for (int64_t t = 0; t < step.num_tokens; ++t)
    picked.insert(topk.ptr<int32_t>() + t * width, topk.ptr<int32_t>() + (t + 1) * width);
  ASSERT_FALSE(picked.contains(-1));
  EXPECT_EQ(picked.size(), static_cast<size_t>(visible));
  EXPECT_TRUE(picked.contains(visible - 1)) << "context " << o.seq_len;
}

// A request's SWA block table has the pages its context fills, the last one holding its last
// token, and no page more; the pool has the pages the tables name. Contexts at a page's end and
// inside one.
TEST(SynthStep, SwaPagesCoverTheContext) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const auto specs = model_layers(model_preset("v4-flash"), 1);
  const auto streams = make_streams(Device{});
  const int pages = 1 + static_cast<int>(rng() % 40);
  for (const int context : {64 * pages, 64 * pages + 1 + static_cast<int>(rng() % 63)}) {
    const RunOptions o{.requests = 3, .seq_len = context, .check = 0, .seed = rng()};
    const SynthStep step(o, specs, *streams);
    const TensorView& table = step.host.inputs.block_tables[0];
    EXPECT_GE(table.size(1) * kSwaBlockSize, context) << context;
    EXPECT_LT((table.size(1) - 1) * kSwaBlockSize, context) << context;
    int64_t live = 0;
    for (int64_t j = 0; j < table.size(0) * table.size(1); ++j)
      live += table.ptr<int32_t>()[j] >= 0;
    EXPECT_EQ(step.host.layers[0].swa_kv_cache.size(0), live) << context;
  }
}

// The host limit is two thirds of the machine's memory, or of its container's limit when lower;
// the refusal says what it is.
TEST(SynthStep, HostLimitIsTwoThirdsOfMemory) {
  const double limit = host_limit_bytes();
  EXPECT_GT(limit, 0);
  EXPECT_LE(limit, double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) * 2 / 3);
  const RunOptions o{.requests = 1 << 30, .seq_len = 1 << 30, .check = 0};
  const auto streams = make_streams(Device{});
  try {
    const SynthStep step(o, model_layers(model_preset(o.model), 1), *streams);
    ADD_FAILURE() << "made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a step whose host memory fits in " +
                                         std::to_string(int64_t(limit / 1048576)) +
                                         " MiB (two thirds of "),
              std::string::npos)
        << e.what();
    // The CPU's rows are the host's: not said to be on a device.
    EXPECT_NE(std::string(e.what()).find("of queries and outputs and"), std::string::npos)
        << e.what();
  }
}

// The cgroup limit is the lowest on the process's own cgroup path, its ancestors included (a job
// placed in a cgroup below the one limited), for v2 and v1 hierarchies; "max" is no limit.
TEST(HostMemory, CgroupLimitIsTheLowestOnTheProcesssPath) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("smla_cgroup_" + std::to_string(getpid()));
  fs::remove_all(root);
  const auto put = [&](const fs::path& dir, const char* file, const char* text) {
    fs::create_directories(root / dir);
    std::ofstream(root / dir / file) << text << "\n";
  };
  put("", "memory.max", "max");
  put("a", "memory.max", "1000");
  put("a/b", "memory.max", "max");
  put("memory", "memory.limit_in_bytes", "9223372036854771712");
  put("memory/job", "memory.limit_in_bytes", "500");
  put("memory/job/step", "memory.limit_in_bytes", "9223372036854771712");
  constexpr double kNone = std::numeric_limits<double>::infinity();
  EXPECT_EQ(cgroup_memory_limit("0::/a/b\n", root), 1000);    // the parent's
  EXPECT_EQ(cgroup_memory_limit("0::/a/b/c\n", root), 1000);  // a path with no folder here
  EXPECT_EQ(cgroup_memory_limit("0::/\n", root), kNone);      // a namespace's own root
  EXPECT_EQ(cgroup_memory_limit("0::/elsewhere\n", root), kNone);
  EXPECT_EQ(cgroup_memory_limit("7:cpu,memory:/job/step\n1:name=systemd:/x\n", root), 500);
  EXPECT_EQ(cgroup_memory_limit("7:cpu,cpuacct:/job/step\n", root), kNone);  // not memory's
  EXPECT_EQ(cgroup_memory_limit("7:memory:/job\n0::/a\n", root), 500);       // both hierarchies
  EXPECT_EQ(cgroup_memory_limit("", root), kNone);
  fs::remove_all(root);
}

// SynthStep(o, specs) under an address-space limit of 4 GiB more than the process has mapped:
// refused by its flags, not by std::bad_alloc.
void refused_before_allocating(const RunOptions& o, const std::vector<LayerSpec>& specs,
                               Streams& streams) {
  SCOPED_TRACE(std::to_string(o.requests) + " requests x " + std::to_string(o.q_len) +
               " tokens, seq_len " + std::to_string(o.seq_len));
  const test::AddressSpaceCap cap(rlim_t{4} << 30);
  ASSERT_TRUE(cap.ok());
  try {
    const SynthStep step(o, specs, streams);
    ADD_FAILURE() << "made";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "--requests, --seq-len, --q-len (with --model and --kv)");
  } catch (const std::bad_alloc&) {
    ADD_FAILURE() << "allocated before refusing";
  }
}

// A step past the host limit, far below int64 bytes, is refused by its flags before anything is
// allocated: under an address-space limit of 4 GiB more than the process has, an allocation
// would throw std::bad_alloc instead. Past it by its pools (256 requests of 2^30 tokens: TiBs),
// or by its queries and outputs alone (1024 tokens a request: 43 layers x 64 heads x 512 x 4 B,
// 5.8 GB a request, against its ~0.1 GB of pools).
TEST(SynthStep, PastTheHostLimitRefusedBeforeAllocating) {
#if defined(SMLA_ASAN)
  GTEST_SKIP() << "AddressSanitizer maps more than an address-space limit leaves";
#endif
  const auto specs = model_layers(model_preset("v4-flash"), 1);
  const double rows_a_request = 1024.0 * double(specs.size()) * 64 * kHeadDim * 4;
  const int rows_past = static_cast<int>(host_limit_bytes() / rows_a_request) + 1;
  for (const RunOptions& o :
       {RunOptions{.requests = 256, .seq_len = 1 << 30, .check = 0},
        RunOptions{.requests = rows_past, .seq_len = 1024, .q_len = 1024, .check = 0}})
    refused_before_allocating(o, specs, *make_streams(Device{}));
}

// The CPU's streams, claiming a device: a SynthStep then takes the path it takes on a GPU.
class DeviceLikeStreams final : public cpu::HostStreams {
 public:
  Device device() const override { return {DeviceKind::cuda, 0}; }
};

// An unchecked step on a device keeps its pools there, but the host still holds every top-k of
// the step: one whose top-k alone is past the host limit, with one layer's queries and outputs
// (the other rows the host holds) far within it, is refused before anything is allocated. At a
// context of 2^20 the ratio-128 layers read every entry, 8192 a token.
TEST(SynthStep, DeviceStepPastTheHostLimitByItsTopKRefused) {
#if defined(SMLA_ASAN)
  GTEST_SKIP() << "AddressSanitizer maps more than an address-space limit leaves";
#endif
  const auto specs = model_layers(model_preset("v4-flash"), 1);
  const int seq_len = 1 << 20, q_len = 1024;
  double topk_a_token = 0;  // bytes of the int32 top-k a token, of the layers that have one
  for (const LayerSpec& s : specs)
    if (s.compress_ratio > 0 && s.index_source == s.layer)
      topk_a_token += 4.0 * double(topk_width(s, seq_len));
  const double rows_a_token = 64.0 * kHeadDim * (2 + 2);  // one layer's bf16 query and out
  const double limit = host_limit_bytes();
  const int requests = static_cast<int>(1.2 * limit / topk_a_token / q_len) + 1;
  ASSERT_LT(double(requests) * q_len * rows_a_token, limit / 2);
  DeviceLikeStreams streams;
  refused_before_allocating({.requests = requests, .seq_len = seq_len, .q_len = q_len, .check = 0},
                            specs, streams);
}

// Each request's compressed pool holds its context / ratio entries in pages of 64: no page more,
// and at least one (a context short of the ratio still has a pool and a table). Contexts short
// of ratio 128, of exactly 32 pages of ratio 4 and one of ratio 128, and one entry past.
TEST(SynthStep, CompressedPagesHoldTheEntries) {
  const auto specs = model_layers(model_preset("v4-flash"), 1);
  const auto streams = make_streams(Device{});
  for (const int context : {100, 4 * 64 * 32, 4 * 64 * 32 + 4}) {
    const RunOptions o{.requests = 2, .seq_len = context, .check = 0};
    const SynthStep step(o, specs, *streams);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].compress_ratio == 0) continue;
      const int64_t pages = std::max<int64_t>(1, (context / specs[i].compress_ratio + 63) / 64);
      EXPECT_EQ(step.host.layers[i].compressed_kv_cache.size(0), 2 * pages) << context << ", " << i;
      EXPECT_EQ(step.host.inputs.compressed_block_tables.at(specs[i].kv_source).size(1), pages);
    }
  }
}

// SPEC §2's scales: bmm1_scale = D^-0.5 * q_scale * kv_scale and bmm2_scale = kv_scale for the
// per-tensor fp8 cache (kv_scale 0.5, q_scale 1); 1 for bf16 and fp8_ds_mla (its own scales).
TEST(SynthStep, ScalesFollowTheLayout) {
  const auto specs = model_layers(model_preset("v4-flash"), 1);
  const auto streams = make_streams(Device{});
  for (const auto& [kv, kv_scale] : {std::pair{KvLayout::bf16, 1.0f},
                                     {KvLayout::fp8_e4m3, 0.5f},
                                     {KvLayout::fp8_ds_mla, 1.0f}}) {
    const SynthStep step({.requests = 1, .seq_len = 100, .kv = kv, .check = 0}, specs, *streams);
    for (const AttentionLayer& l : step.host.layers) {
      EXPECT_FLOAT_EQ(l.bmm1_scale, kv_scale / std::sqrt(512.0f)) << kv_layout_name(kv);
      EXPECT_EQ(l.bmm2_scale, kv_scale) << kv_layout_name(kv);
    }
  }
}

// kv_bytes, the report's KV size, is the pools' bytes: each pool once (V4.1's compressed layers
// share theirs), fp8_ds_mla's pages padded to 576 B.
TEST(SynthStep, KvBytesArePoolBytes) {
  for (const char* model : {"v4-flash", "v41-flash"})
    for (KvLayout kv : {KvLayout::bf16, KvLayout::fp8_ds_mla}) {
      const RunOptions o{.model = model, .requests = 2, .seq_len = 700, .q_len = 2, .kv = kv};
      const auto specs = model_layers(model_preset(o.model), 1);
      const auto streams = make_streams(Device{});
      const SynthStep step(o, specs, *streams);
      std::map<const void*, int64_t> pools;
      for (const AttentionLayer& l : step.host.layers)
        for (const TensorView* pool : {&l.swa_kv_cache, &l.compressed_kv_cache})
          if (pool->defined())
            pools[pool->data] = pool->size(0) * pool->strides[0] *
                                static_cast<int64_t>(dtype_size(pool->dtype));
      int64_t bytes = 0;
      for (const auto& [data, size] : pools) bytes += size;
      EXPECT_EQ(step.kv_bytes, bytes) << model << ", " << kv_layout_name(kv);
    }
}

// --seed picks the step: the same seed makes the same queries, sinks and pools whatever the
// thread count (pages are filled in parallel), another seed others. Every query row holds values and the sinks differ per head (a zero query or sinks far
// below the scores would leave the check's softmax untested); fp8_ds_mla's groups get
// different scales.
TEST(SynthStep, SeedPicksTheStep) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const auto specs = model_layers(model_preset("v4-flash"), 1);
  const auto streams = make_streams(Device{});
  const auto bytes = [](const TensorView& v) {
    const auto* p = static_cast<const std::byte*>(v.data);
    const size_t n = static_cast<size_t>(v.size(0) * v.strides[0]) * dtype_size(v.dtype);
    return std::vector<std::byte>(p, p + n);
  };
  const auto step = [&](uint64_t s) {
    const RunOptions o{
        .requests = 2, .seq_len = 200, .q_len = 2, .kv = KvLayout::fp8_ds_mla, .seed = s};
    return std::make_unique<SynthStep>(o, specs, *streams);
  };
  test::ThreadsEnv threads("3");
  const auto a = step(seed), c = step(seed + 1);
  threads.set("1");
  const auto b = step(seed);
  for (size_t i : {size_t{0}, specs.size() - 1}) {
    const AttentionLayer& l = a->host.layers[i];
    EXPECT_EQ(bytes(a->host.queries[i]), bytes(b->host.queries[i]));
    EXPECT_EQ(bytes(l.swa_kv_cache), bytes(b->host.layers[i].swa_kv_cache));
    if (l.compressed_kv_cache.defined())
      EXPECT_EQ(bytes(l.compressed_kv_cache), bytes(b->host.layers[i].compressed_kv_cache));
    EXPECT_NE(bytes(a->host.queries[i]), bytes(c->host.queries[i]));
    EXPECT_NE(bytes(l.swa_kv_cache), bytes(c->host.layers[i].swa_kv_cache));
    EXPECT_NE(bytes(l.sinks), bytes(c->host.layers[i].sinks));
    const TensorView& q = a->host.queries[i];
    for (int64_t r = 0; r < q.size(0) * q.size(1); ++r) {
      const auto* row = static_cast<const uint16_t*>(q.data) + r * kHeadDim;
      EXPECT_TRUE(std::any_of(row, row + kHeadDim, [](uint16_t x) { return x != 0; })) << r;
    }
    const float *sinks = l.sinks.ptr<float>(), *end = sinks + l.sinks.size(0);
    EXPECT_TRUE(std::all_of(sinks, end, [](float s) { return std::abs(s) <= 1; }));
    EXPECT_NE(*std::min_element(sinks, end), *std::max_element(sinks, end));
    EXPECT_LT(*std::min_element(sinks, end), 0);  // of both signs: (-1, 1)
    EXPECT_GT(*std::max_element(sinks, end), 0);
    // Page 0's UE8M0 scales, after its 64 records, 8 bytes a row (7 used): some row's groups
    // have more than one. Row 0 alone drew one scale for all 7 groups (each group's shift one of
    // 7, its max almost always in [0.5, 1)) about one row in 1.3 x 10^5.
    const auto* scales = static_cast<const uint8_t*>(l.swa_kv_cache.data) + 64 * kDsMlaRecordBytes;
    bool differ = false;
    for (int row = 0; row < 64; ++row)
      differ = differ || std::set<uint8_t>(scales + 8 * row, scales + 8 * row + 7).size() > 1;
    EXPECT_TRUE(differ);
    // Each group's shift of 2^-3..2^3 spreads page 0's 448 scales over 7 exponents or more (all
    // 7 shifts drawn, but for about 10^-29); unshifted, the groups' maxima, almost all in [0.5, 1),
    // get 2 at most, which the check above still passes.
    std::set<uint8_t> exponents;
    for (int row = 0; row < 64; ++row) exponents.insert(scales + 8 * row, scales + 8 * row + 7);
    EXPECT_GE(exponents.size(), 7u);
  }
}

// Intervals between consecutive marks, not since the first: a 50 ms wait, then none.
TEST(StepClock, HostIntervalsAreBetweenConsecutiveMarks) {
  const auto streams = make_streams(Device{});
  const auto clock = make_clock(*streams);
  clock->mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  clock->mark();
  clock->mark();
  const std::vector<double> seconds = clock->intervals();
  ASSERT_EQ(seconds.size(), 2u);
  EXPECT_GE(seconds[0], 0.05);
  EXPECT_GE(seconds[1], 0);
  EXPECT_LT(seconds[1], seconds[0]);
}

// What `work` writes on stderr where stderr is a pipe (read once `work` is done: it must write
// less than a pipe holds).
template <class F>
std::string on_a_pipe(F&& work) {
  int pipe_ends[2];
  EXPECT_EQ(pipe(pipe_ends), 0);
  std::fflush(stderr);
  const int saved = dup(2);
  dup2(pipe_ends[1], 2);
  work();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(pipe_ends[1]);
  std::string written;
  char buffer[4096];
  for (ssize_t n; (n = read(pipe_ends[0], buffer, sizeof buffer)) > 0;) written.append(buffer, n);
  close(pipe_ends[0]);
  return written;
}

// What `work` writes on stderr where stderr is a pseudo-terminal.
template <class F>
std::string on_a_terminal(F&& work) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  EXPECT_GE(master, 0);
  EXPECT_TRUE(grantpt(master) == 0 && unlockpt(master) == 0);
  const int terminal = open(ptsname(master), O_RDWR | O_NOCTTY);
  EXPECT_GE(terminal, 0);
  std::fflush(stderr);
  const int saved = dup(2);
  dup2(terminal, 2);
  work();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fcntl(master, F_SETFL, O_NONBLOCK);
  std::string drawn;
  char buffer[4096];
  for (ssize_t n; (n = read(master, buffer, sizeof buffer)) > 0;) drawn.append(buffer, n);
  close(terminal);
  close(master);
  return drawn;
}

// Progress on a terminal (a pseudo-terminal on stderr): nothing in the first second, then a bar
// of done / total redrawn in place, cleared when the work ends.
TEST(Progress, BarOnATerminalAfterASecond) {
  const std::string drawn = on_a_terminal([] {
    Progress progress("work", 4);
    progress.advance();
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    progress.advance();
  });
  const std::string bar = "\rwork [" + std::string(15, '#') + std::string(15, '.') + "] 2/4 ";
  EXPECT_EQ(drawn.substr(0, bar.size()), bar);
  const std::string cleared = "\r" + std::string(30 + 4 + 40, ' ') + "\r";
  EXPECT_TRUE(drawn.ends_with("s" + cleared)) << drawn;
}

// Progress where stderr is no terminal (a pipe): a plain line once the interval has passed, none
// before it, the last step's as any other's, and no bar.
TEST(Progress, LinesOnAPipeEveryInterval) {
  const std::string written = on_a_pipe([] {
    Progress progress("work", 5, std::chrono::milliseconds(50));
    progress.advance();  // before the interval: nothing
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    progress.advance();  // "work: 2/5 after 0s"
    progress.advance();  // the interval starts again at that line: nothing
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    progress.advance(2);  // the end, after the interval: "work: 5/5 after 0s"
  });
  EXPECT_EQ(written, "work: 2/5 after 0s\nwork: 5/5 after 0s\n");
}

// An interval of 0 (--progress 0) is a line a step, the last one's included: N/N, not N-1/N.
TEST(Progress, LineEveryStepAtIntervalZero) {
  const std::string written = on_a_pipe([] {
    Progress progress("work", 3, std::chrono::milliseconds(0));
    for (int i = 0; i < 3; ++i) progress.advance();
  });
  EXPECT_EQ(written, "work: 1/3 after 0s\nwork: 2/3 after 0s\nwork: 3/3 after 0s\n");
}

// After its first draw the bar is redrawn at most every 100 ms, except at the end, which is drawn
// at once: a step right after a draw is not, the last one is.
TEST(Progress, BarRedrawnAtMostEvery100MsButAtTheEnd) {
  const std::string drawn = on_a_terminal([] {
    Progress progress("work", 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    progress.advance();   // drawn: the first second is over
    progress.advance();   // within 100 ms of it: not drawn
    progress.advance(3);  // the end: drawn
  });
  EXPECT_EQ(drawn.rfind("\rwork [" + std::string(6, '#') + std::string(24, '.') + "] 1/5 ", 0), 0u)
      << drawn;
  EXPECT_EQ(drawn.find("] 2/5 "), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("\rwork [" + std::string(30, '#') + "] 5/5 "), std::string::npos) << drawn;
}

// A plain line's time is since the work began, not since the line before: lines at 0.75 s and
// 1 s both say 1 s.
TEST(Progress, LinesSayTheTimeSinceTheStart) {
  const std::string written = on_a_pipe([] {
    Progress progress("work", 3, std::chrono::milliseconds(200));
    std::this_thread::sleep_for(std::chrono::milliseconds(750));
    progress.advance();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    progress.advance();
  });
  EXPECT_EQ(written, "work: 1/3 after 1s\nwork: 2/3 after 1s\n");
}

// The check's figures are maxima over every row merged, and rows add up.
TEST(CheckRows, MergeKeepsMaximaAndCounts) {
  CheckResult all;
  merge(all, {.rows = 3, .max_error = 2e-3, .max_relative_error = 1e-3});
  merge(all, {.rows = 5, .max_error = 1e-3, .max_relative_error = 4e-3});
  merge(all, {.rows = 1, .max_error = 0, .max_relative_error = 0});
  EXPECT_EQ(all.rows, 9);
  EXPECT_EQ(all.max_error, 2e-3);
  EXPECT_EQ(all.max_relative_error, 4e-3);
}

// A CSV that cannot be opened, or whose writes fail, is an error naming its path, not a file
// silently short.
TEST(CsvFile, OpenAndWriteFailuresThrow) {
  EXPECT_EQ(CsvFile("").get(), nullptr);
  try {
    csv_path("");
    ADD_FAILURE() << "an empty --csv taken";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--csv: expected a file path, got ''");
  }
  try {
    CsvFile missing("/nonexistent-smla-dir/out.csv");
    ADD_FAILURE() << "opened";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "--csv: cannot write /nonexistent-smla-dir/out.csv: No such file or directory");
  }
  // Unbuffered, the write fails and fclose has none to flush; buffered, the write fails at
  // fclose's flush, which names the error.
  for (const bool buffered : {false, true}) {
    CsvFile full("/dev/full");
    ASSERT_NE(full.get(), nullptr);
    if (!buffered) std::setvbuf(full.get(), nullptr, _IONBF, 0);
    std::fputs("a,b\n", full.get());
    try {
      full.close();
      ADD_FAILURE() << "closed";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), buffered ? "--csv: cannot write /dev/full: No space left on device"
                                      : "--csv: cannot write /dev/full: a write to it failed");
    }
  }
}

// A CSV is written afresh: a second run's file holds its rows alone, not the first run's before
// them.
TEST(CsvFile, WrittenAfresh) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const std::string path = testing::TempDir() + "smla_csv_" + std::to_string(seed) + ".csv";
  std::string last;
  for (int run = 0; run < 2; ++run) {
    last = "run,value\n" + std::to_string(run) + "," + std::to_string(seed + run) + "\n";
    CsvFile csv(path);
    std::fputs(last.c_str(), csv.get());
    csv.close();
  }
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::remove(path.c_str());
  EXPECT_EQ(text.str(), last);
}

// A CSV opened while stdout is closed does not take descriptor 1: the table printed to stdout
// would land in it. stdout stays closed, so its writes fail as stdout_status reports.
TEST(CsvFile, LeavesAClosedStdoutClosed) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(test::seed_note(seed));
  const std::string path = testing::TempDir() + "smla_csv_closed_" + std::to_string(seed) + ".csv";
  std::fflush(stdout);
  const int saved = dup(STDOUT_FILENO);
  ASSERT_GE(saved, 0);
  close(STDOUT_FILENO);
  int csv_fd = -1;
  bool stdout_open = true;
  std::string csv_error;
  try {
    CsvFile csv(path);
    csv_fd = fileno(csv.get());
    stdout_open = fcntl(STDOUT_FILENO, F_GETFD) != -1;
    std::fputs("a,b\n", csv.get());
    csv.close();
  } catch (const std::exception& e) {
    csv_error = e.what();
  }
  dup2(saved, STDOUT_FILENO);  // before any check prints
  close(saved);
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::remove(path.c_str());
  EXPECT_EQ(csv_error, "");
  EXPECT_GT(csv_fd, STDERR_FILENO);
  EXPECT_FALSE(stdout_open);
  EXPECT_EQ(text.str(), "a,b\n");
}

}  // namespace
}  // namespace smla::cli
