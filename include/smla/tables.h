// Sharing sparse-index tables across the layers of one decode step (SPEC §5).
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "smla/index.h"
#include "smla/model.h"
#include "smla/streams.h"

namespace smla {

// Whether the layers of a step share tables. `none` is for measuring what sharing saves: every
// layer gets a key of its own, so each builds its table on the current stream and nothing forks.
enum class TableSharing { shared, none };

// Layers with equal keys build equal tables in a step (within one SWA group): "swa_only", or
// "<compressed cache id>:<index source layer>:<ratio>" with the kv source layer as cache id;
// with sharing none, "layer <id>". A spec topk_width refuses (a negative compress_ratio or
// index_topk, a window below 1) throws smla::Error naming `layer.<field>`, as there.
std::string sparse_index_key(const LayerSpec& layer, TableSharing sharing = TableSharing::shared);

// The build arguments (outputs unset) of a layer's table in the current step.
using TableInputs = std::function<SparseIndexArgs(int layer)>;

using TableKey = std::pair<int, std::string>;  // (SWA group, sparse_index_key)

// What the caller calls an argument of layer `layer`'s build, given the name the build's error
// gives it, as its argument or in its expected and got texts (a SparseIndexArgs field's, as
// build_sparse_indices names them); "" keeps that name.
using TableArgumentNames = std::function<std::string(int layer, const std::string& argument)>;

// What a step did, for tests and reports; cleared by reset().
struct TableStats {
  std::map<TableKey, int> builds;  // builds of each table
  std::vector<TableKey> forks;     // the builds that ran on the side stream, in order
  std::vector<int> waits;          // layers whose lookup waited for a forked build
  std::map<int, int> peak_tables;  // SWA group -> most tables it held at once
  size_t bytes = 0;                // table memory held now
  size_t peak_bytes = 0;
};

class SparseIndexTables {
 public:
  // `layers` in model order (strictly increasing ids; runs are consecutive equal keys); a
  // spec sparse_index_key refuses, or a window other than an earlier layer's of its SWA group
  // and key (one table would serve both), throws smla::Error naming `layers[i].<field>`.
  // `streams` orders the builds and must outlive this object.
  SparseIndexTables(std::span<const LayerSpec> layers, Streams& streams,
                    TableSharing sharing = TableSharing::shared);
  ~SparseIndexTables();  // joins
  SparseIndexTables(const SparseIndexTables&) = delete;
  SparseIndexTables& operator=(const SparseIndexTables&) = delete;

  // The table of `layer` (its SWA group, its key). A miss builds it on the current stream,
  // stores it, then forks onto the side stream the builds the run's later layers will look
  // up in the other groups (one per group). A hit on a forked table waits for its event.
  // The views stay valid until the group stores another key (a compressed table's) or, for
  // swa_only, until reset(). `inputs(l)` gives layer l's arguments: its spec's compress_ratio
  // and window, outputs unset (else smla::Error naming the field, before any allocation; so
  // are inputs the build refuses, which would otherwise size the table's allocation).
  // A build's error says which layer's table and SWA group it was, and names its arguments
  // (its argument's, and those its texts mention) as `names` (when given) says: the
  // StepExecutor names its StepInputs fields so.
  // Every layer of the key in the group gets views of one memory: read them, never write them.
  SparseIndexTable lookup(int layer, const TableInputs& inputs,
                          const TableArgumentNames& names = {});
  // The memory behind the views lookup(layer) returns now (null until a table of its group and
  // key is stored: by its lookup, an earlier layer's of the same key, or a fork): holding it
  // keeps them valid past reset() and later stores, while `streams` lives. Dropping it hands
  // the block to the next build at once: its users must have been queued on the current stream.
  std::shared_ptr<void> memory(int layer) const;

  // The current stream waits for every fork since the last join: before an index source's
  // indexer overwrites the top-k, and at the end of a step.
  void join();

  // Joins, then forgets the step's tables and stats; call at the start of each step.
  void reset();

  const TableStats& stats() const { return stats_; }

 private:
  struct Stored {
    SparseIndexTable table = {};
    std::shared_ptr<void> memory;
    size_t bytes = 0;
  };
  size_t position(int layer) const;
  SparseIndexTable build(int layer, const TableInputs& inputs, const TableArgumentNames& names,
                         const TableKey& key, void* stream);
  void store(const TableKey& key, Stored stored);
  void fork(size_t leader, const TableInputs& inputs, const TableArgumentNames& names);

  std::vector<LayerSpec> layers_;
  std::vector<std::string> keys_;  // per position
  std::vector<size_t> run_end_;    // per position: one past the last layer of its run
  Streams& streams_;
  std::map<TableKey, Stored> tables_;
  std::map<TableKey, int> pending_;  // forked tables not joined yet -> their event slot
  bool forked_ = false;
  TableStats stats_;
};

}  // namespace smla
