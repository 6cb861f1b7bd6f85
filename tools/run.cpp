#include "run.h"

#include <cstdio>
#include <random>
#include <span>
#include <string>

#include "clock.h"
#include "cpu/parallel.h"
#include "graph_table.h"
#include "oracle.h"
#include "progress.h"
#include "report.h"
#include "run_stream.h"
#include "smla/error.h"
#include "smla/model.h"
#include "step_graph.h"
#include "synth.h"

namespace smla::cli {
namespace {

// Relative to the row's largest value: bf16 output rounding is 2^-9, float32 sums add little.
// Per-tensor fp8 on CUDA computes its scores with e4m3 wgmma, which accumulate with about 14
// bits: up to 1.25e-2 measured on this tool's steps (docs/decode.md), so 3e-2 (the GPU tests,
// on smaller steps, bound each 64-dim group by 2e-2).
double tolerance(KvLayout kv, const Device& device) {
  return kv == KvLayout::fp8_e4m3 && device.kind == DeviceKind::cuda ? 3e-2 : 1e-2;
}
constexpr int kGraphReplays = 30;

// Why the decode on `gpu` cannot read a top-k of the step that `--compressed-index topk` has it
// read (the executor refuses it); empty when it can or the mode is another.
std::string topk_too_wide(const RunOptions& o, std::span<const LayerSpec> specs, Device gpu) {
  if (o.compressed_index != CompressedIndex::topk) return {};
  for (const LayerSpec& s : specs)
    if (const int64_t width = topk_width(s, o.seq_len); width > max_topk_width(gpu))
      return "--compressed-index topk: layer " + std::to_string(s.layer) + " reads a top-k of " +
             std::to_string(width) + " columns, the decode at most " +
             std::to_string(max_topk_width(gpu));
  return {};
}

// The GPU when it can run this step, else the CPU (with a note, unless cuda was asked for).
Device pick_device(const RunOptions& o, std::span<const LayerSpec> specs) {
  if (o.device == DeviceChoice::cpu) return {};
  const Device gpu{DeviceKind::cuda, 0};
  std::string why =
      query_capability(kHeadDim, query_dtype(o.kv), kv_dtype(o.kv), kSwaBlockSize, gpu).reason;
  if (why.empty()) why = topk_too_wide(o, specs, gpu);
  if (why.empty()) {
    try {
      make_streams(gpu);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  if (why.empty()) return gpu;
  if (o.device == DeviceChoice::cuda)
    throw Error(ErrorKind::unsupported, "--device", "a CUDA device that can run this step",
                "none: " + why);
  std::fprintf(stderr, "note: running on the CPU; cuda: %s\n", why.c_str());
  return {};
}

}  // namespace

int run_step(const RunOptions& o) {
  const std::vector<LayerSpec> specs = model_layers(model_preset(o.model), o.swa_groups);
  const Device device = pick_device(o, specs);
  const RunStream stream(device);
  const std::unique_ptr<Streams> streams = make_streams(device, stream.get());
  SynthStep step(o, specs, *streams);
  StepExecutor executor(step.device.layers, *streams, step.num_tokens, step.max_columns,
                        TableSharing::shared, o.compressed_index);

  RunReport report{.options = o,
                   .kv_bytes = step.kv_bytes,
                   .tolerance = o.tolerance > 0 ? o.tolerance : tolerance(o.kv, device)};
  if (device.kind == DeviceKind::cpu) {
    const int threads = cpu::num_threads();
    // A CPU step can take minutes: its one pass is timed, cold (the threads' start and the
    // first table build in its first layers), and the header says so.
    report.device = "cpu (" + std::to_string(threads) + (threads > 1 ? " threads" : " thread") +
                    "), no warm-up step";
  } else {
    // The first step loads the kernels and fills the streams' block cache: time the second.
    executor.run_step(step.device.inputs, step.device.queries, step.device.outs);
    // A timed launch that left rows unwritten (a split row whose partials no CTA combined)
    // would otherwise pass the check on the warm-up's values.
    step.clear_outs();
    report.device = device_name(device) + ", after a warm-up step";
  }
  {
    Progress progress("running", static_cast<int64_t>(specs.size()), o.progress);
    const std::unique_ptr<StepClock> clock = make_clock(*streams);
    executor.begin_step(step.device.inputs);
    clock->mark();
    for (size_t i = 0; i < specs.size(); ++i) {
      executor.run_layer(specs[i].layer, step.device.queries[i], step.device.outs[i]);
      clock->mark();
      progress.advance();
    }
    executor.end_step();
    const std::vector<double> seconds = clock->intervals();
    for (size_t i = 0; i < specs.size(); ++i)
      report.layers.push_back(
          {layer_kind(specs[i]), specs[i].num_heads, seconds[i], step.attended[i]});
  }
  report.tables = executor.tables().stats();

  if (o.check > 0) {
    std::mt19937_64 rng(o.seed ^ 0x5eed);
    CheckResult check;
    check.every_row = true;
    Progress progress("checking", static_cast<int64_t>(specs.size()), o.progress);
    for (size_t i = 0; i < specs.size(); ++i) {
      const TensorView& query = step.host.queries[i];
      const std::vector<Row> rows = sample_rows(query, o.check, rng);
      check.every_row &= static_cast<int64_t>(rows.size()) == query.shape[0] * query.shape[1];
      step.download_rows(i, rows);
      merge(check, check_layer(step.host, i, rows));
      progress.advance();
    }
    report.check = check;
  }
  if (device.kind == DeviceKind::cuda) {  // after the check, which reads the timed step's outs
    report.graphs = measure_step_graphs(step.device, *streams, step.num_tokens, step.max_columns,
                                        kGraphReplays, 0, o.progress);
    report.graph_replays = kGraphReplays;
  }
  print_report(report);
  return exit_status(report);
}

}  // namespace smla::cli
