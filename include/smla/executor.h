// Runs the attention of every layer of one decode step (SPEC §5): tables shared through
// SparseIndexTables, one sparse_mla_decode per layer, counters and workspace shared by all.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "smla/decode.h"
#include "smla/index.h"
#include "smla/model.h"
#include "smla/streams.h"
#include "smla/tables.h"

namespace smla {
namespace check {
class ReadViews;
}

// What a layer keeps from step to step.
struct AttentionLayer {
  LayerSpec spec{};
  TensorView swa_kv_cache{};         // its SWA pool; its dtype is the cache dtype
  TensorView compressed_kv_cache{};  // compressed layers: the kv source's pool, of its dtype
  TensorView sinks{};                // [H] f32, optional
  float bmm1_scale = NAN;            // must be set: D^-0.5 (x q_scale * kv_scale, fp8_e4m3)
  float bmm2_scale = 1.f;            // 1 (kv_scale with an fp8_e4m3 cache; fp8_ds_mla: 1)
};

// Where a compressed layer's columns [W, K) come from. `table`: its own table, keyed as SPEC
// §5 says. `topk`: the decode reads its index source's top-k (TopkColumns, bitwise the table's)
// and the layer looks up its SWA group's "swa_only" table. `automatic`: topk for every layer of
// a run of one key in which some SWA group would hold the table for one layer only, table for
// the other runs (docs/sparse_index.md says why); a top-k wider than the decode reads on the
// device (max_topk_width), a layer's index_topk or a step's for layers reading every entry,
// makes its run `table` in `automatic` and is refused in `topk`; so is, in both, a step's top-k
// tensor wider than its layer's index_topk and than the decode reads.
// `automatic` is "auto" (a C++ keyword) in compressed_index_name, errors, the CLI and Python;
// a value outside the enum is "?" there, and a value error where a mode is taken.
enum class CompressedIndex { table, topk, automatic };
const char* compressed_index_name(CompressedIndex compressed_index);  // "table", "topk", "auto"

// The specs the tables see, layer by layer (`layers` in model order): a layer that reads its
// top-k in the decode is SWA-only to them. Only a top-k the decode on `device` reads
// (max_topk_width) is read there: a layer's is index_topk wide, or where it reads every entry
// `every_entry_width` (every_entry_topk_width of the step). `automatic` builds tables for runs
// with a wider one; `topk` throws an `unsupported` Error naming `compressed_index` and the
// layer.
std::vector<LayerSpec> table_specs(std::span<const LayerSpec> layers,
                                   CompressedIndex compressed_index, TableSharing sharing,
                                   int64_t every_entry_width, Device device);

// What changes every step.
struct StepInputs {
  StepMetadata metadata{};
  std::vector<TensorView> block_tables{};               // SWA pages of each group: [B, pages] i32
  std::map<int, TensorView> compressed_block_tables{};  // by kv source layer: [B, pages] i32
  std::map<int, TensorView> topk_indices{};             // by index source layer: [T, top_k] i32
};

// The widest top-k that a layer reading every compressed entry (index_topk 0: V4's ratio-128
// layers) reads in the step of `inputs`, its index source's topk_indices' width; 0 for none.
int64_t every_entry_topk_width(std::span<const LayerSpec> layers, const StepInputs& inputs);

// One thread at a time (as SparseIndexTables and Streams: the Python package refuses a second
// thread's call). run_layer, run_step and build_tables need the streams' device current, as
// every op does. The step's inputs are read until end_step (forked builds read them on the side
// stream): keep them unchanged and alive until then, and queue the indexers that run between
// layers on streams.current(), the stream the joins order.
class StepExecutor {
 public:
  // Allocates (zeroed, outside any capture) the kv counters and workspace every layer shares,
  // sized for steps of up to `max_tokens` tokens and `max_columns` table columns (larger steps
  // run, with fewer splits; each in 0..2^31 - 1, else a value error naming it). Each layer's
  // pools and sinks are checked as its decode checks them, on the streams' device. `layers` in
  // model order; `streams` orders the work and must outlive this object. `sharing` none makes every
  // layer build its own table of the specs `compressed_index` gives (`table` for every compressed
  // layer's own; for measuring what sharing saves).
  StepExecutor(std::vector<AttentionLayer> layers, Streams& streams, int64_t max_tokens,
               int64_t max_columns, TableSharing sharing = TableSharing::shared,
               CompressedIndex compressed_index = CompressedIndex::automatic);
  ~StepExecutor();

  // Resets the tables; keeps a copy of `inputs`; picks where the step's compressed columns come
  // from (table_specs with every_entry_topk_width(inputs)). Every compressed layer's entries
  // (its index source's top-k, its kv source's compressed block table) must be there; the
  // metadata's seq_lens and cum_seq_lens_q, and the top-k and compressed block table of a layer
  // whose decode reads its top-k, must have a contiguous last dim (the decodes read them so).
  // A refused step begins none (run_layer is refused until one does; steps_begun() unchanged)
  // and leaves the previous one's tables as they were, joined.
  void begin_step(const StepInputs& inputs);
  // Steps begun so far: begin_step calls that passed their checks, run_step's and
  // build_tables' included.
  uint64_t steps_begun() const { return steps_begun_; }
  // `layer`'s attention of query [T, H, 512] into out [T, H_out, 512] on the current stream,
  // T = metadata.num_tokens and H = the layer's num_heads; out apart from every layer's pools
  // and the step's inputs (its lookup's forks read other groups' block tables as it writes).
  // Layers run in model order, each at most once a step (layers may be skipped; one at or before
  // the last run is refused: a top-k it reads may be overwritten by then), each next index source's
  // indexer between two calls (SPEC §5): a layer followed by an index source joins after its
  // decode, since that indexer may overwrite a top-k the forks read (an index source joins
  // before its lookup too). A call that throws joins first (a capture of the step can still
  // end); the step stays begun and the layer may run again. Its errors name a step input as
  // the StepInputs field, keyed ("block_tables[1]", "topk_indices[2]", an entry as
  // "topk_indices[2][0][3]"), in their argument and texts alike, and say which layer's decode,
  // or which layer's table in which SWA group, refused it.
  void run_layer(int layer, const TensorView& query, const TensorView& out);
  void end_step();  // joins, so a graph capture of the step ends joined; run_layer needs a new
                    // begin_step after it
  // Joins the tables on an error's way out, swallowing the join's own error; the step stays
  // begun. What every refused call does, and what a caller that refuses a run_layer's
  // arguments before the call (the Python package) does, so that a capture can still end.
  void join_after_error() noexcept;

  // begin_step, every layer in order (queries[i] and outs[i] for the i-th layer), end_step.
  // The outs must be apart from each other and from every query, pool and input of the step.
  void run_step(const StepInputs& inputs, std::span<const TensorView> queries,
                std::span<const TensorView> outs);

  // run_step without the decodes: the step's table builds alone, joined where run_step joins.
  // Its graph against the whole step's is what index building costs.
  void build_tables(const StepInputs& inputs);

  // The current step's tables (their stats): valid until the next begin_step, which may pick
  // the other plan's.
  const SparseIndexTables& tables() const { return *plans_[plan_].tables; }

 private:
  size_t position(int layer) const;
  const AttentionLayer& layer_at(int layer) const { return layers_[position(layer)]; }
  // Whether `layer` reads its compressed columns from the top-k in the decode.
  bool reads_topk(int layer) const;
  SparseIndexArgs table_inputs(int layer) const;
  // Whether the layer at `position` runs the indexer whose top-k its run's tables read.
  bool is_index_source(size_t position) const;
  // The layer's table; an index source joins first (its indexer would overwrite forks' top-k).
  SparseIndexTable table_of(const AttentionLayer& layer);
  // After the work of the layer at `position`: joins if an index source's indexer comes next.
  void before_next(size_t position);
  // begin_step's checks of `inputs`; the plan (plans_ index) the step's tables follow.
  size_t checked_plan(const StepInputs& inputs) const;
  // `layer`'s position, refused at or before the last layer run this step.
  size_t next_position(int layer) const;
  // The layer at `position`: its table and decode, then the join an index source next needs.
  void run_at(size_t position, const TensorView& query, const TensorView& out);
  // The layer's table and its decode.
  void decode(const AttentionLayer& layer, const TensorView& query, const TensorView& out);
  // run_step's outs apart from each other and from all the step reads (check::all_apart).
  void check_step_apart(const StepInputs& inputs, std::span<const TensorView> queries,
                        std::span<const TensorView> outs) const;
  // begin_step, layer_work(i) for each layer in order, end_step; ends joined on an error too.
  void each_layer(const StepInputs& inputs, const std::function<void(size_t)>& layer_work);

  // Where the compressed columns come from, by position, as table_specs(...) gives them, and the
  // tables those specs share: [0] while every top-k of the step fits the decode, [1] (automatic
  // only, where it differs) for steps whose layers reading every entry have a wider one.
  struct Plan {
    std::vector<LayerSpec> specs;
    std::unique_ptr<SparseIndexTables> tables;
  };
  const std::vector<LayerSpec>& table_specs_now() const { return plans_[plan_].specs; }
  SparseIndexTables& tables_now() { return *plans_[plan_].tables; }

  std::vector<AttentionLayer> layers_;
  std::vector<LayerSpec> specs_;  // the layers' own
  Streams& streams_;
  CompressedIndex compressed_index_;
  std::vector<Plan> plans_;
  size_t plan_ = 0;  // this step's
  std::shared_ptr<void> counters_, workspace_;
  TensorView counters_view_, workspace_view_;
  std::vector<TensorView> pool_records_;  // by 2 position + (0 SWA, 1 compressed): fp8_ds_mla's
  StepInputs inputs_;
  bool begun_ = false;  // between begin_step and end_step
  size_t next_position_ = 0;  // the first position run_layer takes: past the last layer run
  uint64_t steps_begun_ = 0;
  // What run_layer's out must stay apart from this step (made at its first call).
  std::unique_ptr<const check::ReadViews> step_reads_;
};

}  // namespace smla
