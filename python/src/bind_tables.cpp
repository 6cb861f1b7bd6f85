// SparseIndexTables (SPEC §5), thin: the build arguments come from a Python callable returning
// `_smla.IndexArgs`, and lookup returns arrays over the tables' own memory (no copy), which
// they keep alive; every layer of a key in a group shares it, so NumPy's are read-only.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "busy.h"
#include "index_args.h"
#include "smla/error.h"
#include "smla/streams.h"
#include "smla/tables.h"
#include "table_stats.h"

namespace smla::py {

nb::dict stats_dict(const TableStats& s) {
  auto key = [](const TableKey& k) { return nb::make_tuple(k.first, k.second); };
  nb::dict builds, peak;
  for (const auto& [k, n] : s.builds) builds[key(k)] = n;
  for (const auto& [g, n] : s.peak_tables) peak[nb::int_(g)] = n;
  nb::list forks, waits;
  for (const TableKey& k : s.forks) forks.append(key(k));
  for (int layer : s.waits) waits.append(layer);
  nb::dict d;
  d["builds"] = builds;
  d["forks"] = forks;
  d["waits"] = waits;
  d["peak_tables"] = peak;
  d["bytes"] = s.bytes;
  d["peak_bytes"] = s.peak_bytes;
  return d;
}

namespace {

// The owner of arrays over a table: its memory, and the Tables object whose streams take that
// memory back (members go in reverse order: the memory first). Arrays stay valid past reset().
struct TableOwner {
  nb::object tables;
  std::shared_ptr<void> memory;
};

class Tables {
 public:
  Tables(const std::vector<LayerSpec>& layers, const std::string& kind, int id, uintptr_t stream)
      : streams_(make_streams(parse_device(kind, id), reinterpret_cast<void*>(stream))),
        tables_(std::make_unique<SparseIndexTables>(layers, *streams_)) {}

  nb::tuple lookup(nb::handle self, int layer, nb::callable inputs) {
    idle("lookup");
    const Busy::Hold hold = busy_.hold();
    SparseIndexTable t;
    {
      // A build on the CPU runs for milliseconds: other Python threads run meanwhile (a second
      // call on these tables is refused by `busy_`).
      nb::gil_scoped_release release;
      t = tables_->lookup(layer, [&](int other) {
        nb::gil_scoped_acquire acquire;
        nb::object args = inputs(other);
        // Forked builds may still read these arrays after lookup returns: hold them until reset.
        keep_.push_back(args);
        return nb::cast<const IndexArgs&>(args).args;
      });
    }
    const nb::capsule owner(new TableOwner{nb::borrow(self), tables_->memory(layer)},
                            [](void* p) noexcept { delete static_cast<TableOwner*>(p); });
    return nb::make_tuple(as_array(t.sparse_indices, owner), as_array(t.sparse_topk_lens, owner),
                          t.seq_lens.defined() ? as_array(t.seq_lens, owner) : nb::none());
  }
  void join() {
    idle("join");
    tables_->join();
  }
  void reset() {
    idle("reset");
    tables_->reset();
    keep_.clear();
  }
  nb::dict stats() const {
    idle("stats");
    return stats_dict(tables_->stats());
  }

 private:
  // A lookup's `inputs` that calls back into these tables would free the memory the lookup is
  // about to return (reset) or interleave its forks (lookup, join): refused.
  void idle(const char* call) const {
    if (busy_)  // from `inputs`, or from another thread while lookup runs without the GIL
      throw Error(ErrorKind::value, "inputs",
                  "a callable that leaves these SparseIndexTables alone while they look up",
                  std::string("a call to ") + call + " from inside lookup");
  }

  // Destroyed in reverse: the tables (which join the side stream) before the arrays their
  // builds read, the streams last.
  std::unique_ptr<Streams> streams_;
  std::vector<nb::object> keep_;
  std::unique_ptr<SparseIndexTables> tables_;
  Busy busy_;  // inside lookup
};

}  // namespace

void bind_tables(nb::module_& m) {
  nb::class_<Tables>(m, "SparseIndexTables")
      .def(nb::init<const std::vector<LayerSpec>&, const std::string&, int, uintptr_t>(),
           nb::arg("layers"), nb::arg("kind"), nb::arg("id"), nb::arg("stream"))
      .def(
          "lookup",
          [](nb::pointer_and_handle<Tables> self, int layer, nb::callable inputs) {
            return self.p->lookup(self.h, layer, inputs);
          },
          nb::arg("layer"), nb::arg("inputs"))
      .def("join", &Tables::join)
      .def("reset", &Tables::reset)
      .def("stats", &Tables::stats);
}

}  // namespace smla::py
