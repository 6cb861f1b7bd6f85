// The step measurements of `smla run` and smla_step_bench (tools/step_graph.h) on small steps:
// the graphs (top-k in the decode, shared tables, none shared) are what SPEC §5 implies, and
// their times are sane.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device_case.h"
#include "run_stream.h"
#include "step_graph.h"
#include "synth.h"

namespace smla::test {
namespace {

TEST(GpuStepGraph, SharedAndUnsharedGraphsAreSpecsAndTimed) {
  SKIP_WITHOUT_GPU();
  for (const char* model : {"v4-flash", "v41-flash"}) {
    const cli::RunOptions o{.model = model,
                            .requests = 4,
                            .seq_len = 3000,
                            .q_len = 2,
                            .device = cli::DeviceChoice::cuda,
                            .check = 0,  // pools tiled on the device, as in the bench
                            .swa_groups = 3};
    const Device gpu{DeviceKind::cuda, 0};
    const cli::RunStream stream(gpu);
    const auto streams = make_streams(gpu, stream.get());
    const cli::SynthStep step(o, model_layers(model_preset(model), o.swa_groups), *streams);
    const cli::StepGraphs graphs =
        cli::measure_step_graphs(step.device, *streams, step.num_tokens, step.max_columns, 5);
    for (const cli::StepGraph* g :
         {&graphs.automatic, &graphs.topk, &graphs.shared, &graphs.none}) {
      const std::string where = std::string(model) + ", tables " + cli::graph_name(*g);
      EXPECT_EQ(cli::graph_problems(*g), std::vector<std::string>{}) << where;
      EXPECT_GT(g->builds_ms, 0) << where;
      EXPECT_LT(g->builds_ms, g->step_ms) << where;
    }
    EXPECT_FALSE(graphs.shared.tables.forks.empty()) << model;  // 3 groups: the swa_only run forks
    EXPECT_FALSE(graphs.topk.tables.forks.empty()) << model;
    EXPECT_EQ(graphs.topk.nodes.table_builds, o.swa_groups) << model;  // one SWA table per group
    EXPECT_EQ(graphs.none.nodes.table_builds, graphs.none.layers) << model;
  }
}

}  // namespace
}  // namespace smla::test
