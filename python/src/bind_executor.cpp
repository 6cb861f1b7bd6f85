// StepExecutor (SPEC §5): every layer's attention of one decode step on shared tables, counters
// and workspace. Layers and step inputs hold `_smla.Tensor`s, which keep their arrays alive for
// as long as the executor (layers) or the step (inputs) may read them.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "bindings.h"
#include "busy.h"
#include "index_args.h"
#include "smla/error.h"
#include "smla/executor.h"
#include "table_stats.h"
#include "tensor_arg.h"

namespace smla::py {
namespace {

struct Inputs {
  StepInputs inputs;
  std::vector<nb::object> keep;
};

Inputs make_step_inputs(nb::handle metadata, const std::vector<nb::handle>& block_tables,
                        const std::map<int, nb::handle>& compressed_block_tables,
                        const std::map<int, nb::handle>& topk_indices) {
  Inputs r;
  r.inputs.metadata = take_step(metadata, r.keep);
  for (nb::handle t : block_tables) r.inputs.block_tables.push_back(take(t, &r.keep));
  for (const auto& [layer, t] : compressed_block_tables)
    r.inputs.compressed_block_tables[layer] = take(t, &r.keep);
  for (const auto& [layer, t] : topk_indices) r.inputs.topk_indices[layer] = take(t, &r.keep);
  return r;
}

class Executor {
 public:
  Executor(const std::vector<LayerSpec>& specs, const std::vector<nb::handle>& swa_kv_caches,
           const std::vector<nb::handle>& compressed_kv_caches,
           const std::vector<nb::handle>& sinks, const std::vector<float>& bmm1_scales,
           const std::vector<float>& bmm2_scales, const std::string& kind, int id,
           uintptr_t stream, int64_t max_tokens, int64_t max_columns,
           const std::string& compressed_index)
      : streams_(make_streams(parse_device(kind, id), reinterpret_cast<void*>(stream))) {
    std::vector<AttentionLayer> layers;
    for (size_t i = 0; i < specs.size(); ++i)
      layers.push_back({.spec = specs[i],
                        .swa_kv_cache = take(swa_kv_caches.at(i), &keep_),
                        .compressed_kv_cache = take(compressed_kv_caches.at(i), &keep_),
                        .sinks = take(sinks.at(i), &keep_),
                        .bmm1_scale = bmm1_scales.at(i),
                        .bmm2_scale = bmm2_scales.at(i)});
    CompressedIndex compressed = CompressedIndex::automatic;
    for (CompressedIndex c :
         {CompressedIndex::automatic, CompressedIndex::topk, CompressedIndex::table})
      if (compressed_index == compressed_index_name(c)) compressed = c;
    if (compressed_index != compressed_index_name(compressed))
      throw Error(ErrorKind::value, "compressed_index", "\"auto\", \"topk\" or \"table\"",
                  "\"" + compressed_index + "\"");
    executor_ = std::make_unique<StepExecutor>(std::move(layers), *streams_, max_tokens,
                                               max_columns, TableSharing::shared, compressed);
  }

  void begin_step(nb::handle inputs) {
    idle("begin_step");
    const Inputs& in = nb::cast<const Inputs&>(inputs);
    executor_->begin_step(in.inputs);
    step_ = nb::borrow(inputs);  // the previous step's arrays may go now: its tables were reset
  }
  void run_layer(int layer, nb::handle query, nb::handle out) {
    idle("run_layer");
    const Busy::Hold hold = busy_.hold();
    const TensorView q = take(query), o = take(out);
    nb::gil_scoped_release release;
    executor_->run_layer(layer, q, o);
  }
  void end_step() {
    idle("end_step");
    executor_->end_step();
  }
  // A run_layer refused before the library's: joined as the library's refusals are. Not while
  // another thread's call runs (the refusal may be idle's): that call joins on its own error.
  void join_after_error() {
    if (!busy_) executor_->join_after_error();
  }
  void run_step(nb::handle inputs, const std::vector<nb::handle>& queries,
                const std::vector<nb::handle>& outs) {
    idle("run_step");
    // Held from here: dropping the previous step (step_) may run Python code, and with it
    // another thread.
    const Busy::Hold hold = busy_.hold();
    const Inputs& in = nb::cast<const Inputs&>(inputs);
    std::vector<TensorView> q, o;
    for (nb::handle t : queries) q.push_back(take(t));
    for (nb::handle t : outs) o.push_back(take(t));
    const uint64_t begun = executor_->steps_begun();
    nb::object previous = std::move(step_);
    step_ = nb::borrow(inputs);
    try {
      nb::gil_scoped_release release;
      executor_->run_step(in.inputs, q, o);
    } catch (...) {
      // Refused before it began: this step queued nothing, and the open one (previous) may
      // still run its layers. Failed past its start: its work queued so far reads `inputs`.
      if (executor_->steps_begun() == begun) step_ = std::move(previous);
      throw;
    }
    // `previous` goes now, the tables that read it reset (joined) by the step.
  }
  nb::dict stats() const {
    idle("stats");
    return stats_dict(executor_->tables().stats());
  }

 private:
  // run_layer and run_step run without the GIL: another thread's call meanwhile would reset
  // the tables they read or free the step's arrays (begin_step), or interleave its layers.
  void idle(const char* call) const {
    if (busy_)
      throw Error(ErrorKind::value, call,
                  "no call on this StepExecutor while another thread's run_layer or run_step "
                  "runs on it",
                  "a call meanwhile");
  }

  // Destroyed in reverse: the executor (which joins the side stream) before the arrays its
  // work reads, the streams last.
  std::unique_ptr<Streams> streams_;
  std::vector<nb::object> keep_;
  nb::object step_;
  std::unique_ptr<StepExecutor> executor_;
  Busy busy_;  // inside run_layer or run_step
};

}  // namespace

void bind_executor(nb::module_& m) {
  nb::class_<Inputs>(m, "StepInputs", "smla::StepInputs with the arrays it views");
  m.def("make_step_inputs", &make_step_inputs, nb::arg("metadata"), nb::arg("block_tables"),
        nb::arg("compressed_block_tables"), nb::arg("topk_indices"));

  nb::class_<Executor>(m, "StepExecutor")
      .def(nb::init<const std::vector<LayerSpec>&, const std::vector<nb::handle>&,
                    const std::vector<nb::handle>&, const std::vector<nb::handle>&,
                    const std::vector<float>&, const std::vector<float>&, const std::string&,
                    int, uintptr_t, int64_t, int64_t, const std::string&>(),
           nb::arg("specs"), nb::arg("swa_kv_caches"), nb::arg("compressed_kv_caches"),
           nb::arg("sinks"), nb::arg("bmm1_scales"), nb::arg("bmm2_scales"), nb::arg("kind"),
           nb::arg("id"), nb::arg("stream"), nb::arg("max_tokens"), nb::arg("max_columns"),
           nb::arg("compressed_index"))
      .def("begin_step", &Executor::begin_step, nb::arg("inputs"))
      .def("run_layer", &Executor::run_layer, nb::arg("layer"), nb::arg("query"), nb::arg("out"))
      .def("end_step", &Executor::end_step)
      .def("join_after_error", &Executor::join_after_error)
      .def("run_step", &Executor::run_step, nb::arg("inputs"), nb::arg("queries"),
           nb::arg("outs"))
      .def("stats", &Executor::stats);
}

}  // namespace smla::py
