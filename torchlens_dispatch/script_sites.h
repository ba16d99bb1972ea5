// Where in TorchScript code the current op runs.
//
// NOTE [Layers and passes]
// A layer is one place in the model's code; a pass is one execution of it. For TorchScript
// the interpreter knows both: `currentModuleHierarchy()` names the chain of module
// instances ("TOP(Net)::forward", "block(Block)::forward", "conv(Conv2d)::forward", ...)
// and `currentCallstack()` gives, for the same chain, the source range executing in each
// function. An op's layer is (innermost module instance, the source ranges from that
// module's own code inward, operator). Running the same module again (from any call site)
// or the same statement again in a loop repeats the layer: pass 2, 3, ... Ops outside the
// interpreter (C++ code, torch::nn modules) have no source position; for them the layer is
// (owning module, operator) inside a non-root module, and every op of the root is its own
// layer. See README "Layers and passes".
#ifndef TORCHLENS_DISPATCH_SCRIPT_SITES_H_
#define TORCHLENS_DISPATCH_SCRIPT_SITES_H_

#include <ATen/core/interned_strings.h>
#include <torch/csrc/jit/frontend/source_range.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "torchlens_dispatch/layer_classes.h"
#include "torchlens_dispatch/source_positions.h"

namespace torchlens {

// A value cached for the module tree it was computed against, (tree serial << 32) |
// value; 0 when none. One atomic word, so threads capturing the same model can share it.
class SerialTagged {
 public:
  SerialTagged() = default;
  SerialTagged(const SerialTagged& other) : packed_(other.packed_.load()) {}
  uint64_t load() const { return packed_.load(std::memory_order_relaxed); }
  void store(uint64_t packed) const { packed_.store(packed, std::memory_order_relaxed); }

 private:
  mutable std::atomic<uint64_t> packed_{0};
};

// NOTE [Site paths]
// The named module instances a site runs in, from the root inward, as ParseModuleHierarchy
// reads them: a node of a tree shared by every site of a private plan, so that a site k
// modules deep costs one node, not a path of k names (a model nested 1,000 deep has 1,000
// sites at depths 1 to 1,000). Each node caches the module it resolves to, so that
// resolving all the sites of a tree costs one step per node.
struct SitePath {
  const SitePath* parent = nullptr;  // nullptr: the root
  std::string instance;              // "conv", or "0" for a container's element
  std::string type;                  // "Conv2d"
  // The module it resolved to: (unresolved << 31) | module id, tagged with the tree.
  SerialTagged resolved;
};

// NOTE [Site markers]
// Asking the interpreter where an op runs (`currentModuleHierarchy()` and
// `currentCallstack()`) builds strings on every op, which costs more than the rest of the capture.
// A graph torchlens runs itself (script_runner.h) is instead rewritten before its first run: each
// node that dispatches an op is preceded by a call to the JIT-only op `torchlens::site`, whose
// argument points at a `MarkedSite` computed once from the calls the node was inlined
// through (script_runner.cc, NOTE [Inlining from the top]). The
// marker stores the pointer in a thread-local, and the recorder takes it on the next
// user-level op, if that op is the node's operator; otherwise it asks the interpreter.
// Marked sites live as long as their private plan (NOTE [Private plan lifetime]).
// Aligned to a cache line, with what every capture reads first: a model's sites are cold
// by the time its next capture runs, and one miss per op is the cost that grows with the
// model. The marker prefetches its site, which the recorder reads after the op ran. A site
// does not prefetch the next one: on large models the prefetch instruction itself stalls.
struct alignas(64) MarkedSite {
  c10::Symbol op;                 // the node's operator, e.g. aten::linear
  bool unknown_instance = false;  // see ParsedHierarchy
  uint64_t position = 0;          // as ScriptSites::Current computes it at run time
  // The module `path` resolved to, so that captures after the first resolve nothing:
  // value = (unresolved << 31) | module id.
  SerialTagged resolved;
  // The number of its layer (NOTE [Layer classes]).
  SerialTagged layer_class;
  // The named module instances from the root inward (NOTE [Site paths]); nullptr: the root.
  const SitePath* path = nullptr;
  // Where the node is in the model's code (NOTE [Source positions]); read only when a
  // capture meets the site's layer for the first time. Null when unknown.
  const SourcePosition* source_position = nullptr;
  // What keeps it alive: its plan's table of positions.
  const std::shared_ptr<const void>* source_position_owner = nullptr;
};

// Called by the marker op.
void SetMarkedSite(const MarkedSite* site);
// The site set since the last call, or nullptr; clears it.
const MarkedSite* TakeMarkedSite();

// The position hash of a chain of source ranges, outermost first.
constexpr uint64_t kPositionSeed = 0x9e3779b97f4a7c15ULL;
uint64_t MixPosition(uint64_t hash, const torch::jit::SourceRange& range);

// The model's modules as ScriptSites needs them (from ModelLayout).
struct ModuleTree {
  // Tells trees apart (MarkedSite::resolved): distinct for every layout built.
  uint32_t serial = 0;
  std::shared_ptr<const std::vector<std::string>> addresses;  // id 0 is the root ""
  const absl::flat_hash_map<std::string, int32_t>* ids;
  const std::vector<std::string>* types;              // by id
  const std::vector<std::vector<int32_t>>* children;  // by id
  LayerClasses* layer_classes;                        // the layout's: NOTE [Layer classes]
};

// Interned module addresses: the model's own (shared) and any other address the
// interpreter names, numbered after them.
class ModuleAddresses {
 public:
  explicit ModuleAddresses(ModuleTree tree)
      : tree_(std::move(tree)), base_(tree_.addresses), base_ids_(tree_.ids) {}
  int32_t Intern(const std::string& address);
  // The module a hierarchy path names: each instance is a child of the previous module,
  // or a child of one of its containers (ModuleList, ModuleDict, Sequential). Sets
  // `*unresolved` when a step cannot be followed (the result is the module reached).
  int32_t Resolve(const std::vector<std::pair<std::string, std::string>>& path, bool* unresolved);
  // The same for a site path, memoized in its nodes (NOTE [Site paths]).
  int32_t Resolve(const SitePath* path, bool* unresolved);
  uint32_t tree_serial() const { return tree_.serial; }
  LayerClasses* layer_classes() const { return tree_.layer_classes; }
  const std::shared_ptr<const std::vector<std::string>>& base() const { return base_; }
  std::vector<std::string> ReleaseExtra() { return std::move(extra_); }
  // The address of module `id` (an id Intern or Resolve gave).
  const std::string& Address(int32_t id) const {
    const size_t base = base_->size();
    return static_cast<size_t>(id) < base ? (*base_)[id] : extra_[id - base];
  }

 private:
  // The module instance `instance` of type `type` inside module `current`, or -1.
  int32_t Step(int32_t current, const std::string& instance, const std::string& type);

  ModuleTree tree_;
  std::shared_ptr<const std::vector<std::string>> base_;
  const absl::flat_hash_map<std::string, int32_t>* base_ids_;
  std::vector<std::string> extra_;
  absl::flat_hash_map<std::string, int32_t> extra_ids_;
};

struct ScriptSite {
  bool in_script = false;         // false: no TorchScript frame is running on this thread
  int32_t module = 0;             // innermost module instance (ModuleAddresses id)
  uint64_t position = 0;          // hash of the source ranges from that module's code inward
  bool unknown_instance = false;  // see ParsedHierarchy
  // For a marked site whose module is known: its number (NOTE [Layer classes]); else -1.
  int32_t layer_class = -1;
  const MarkedSite* marked = nullptr;  // the marker's site, if the op had one
};

// Reads the current op's site from the TorchScript interpreter. One per capture.
class ScriptSites {
 public:
  explicit ScriptSites(ModuleAddresses* addresses) : addresses_(addresses) {}
  // The site of the current op, whose operator is `op`.
  ScriptSite Current(c10::Symbol op);
  int64_t marked() const { return marked_; }
  int64_t asked() const { return asked_; }
  // The source position of `site`, the last one `Current` returned (NOTE [Source
  // positions]); null outside TorchScript code. Adds what keeps it alive to `owners`
  // unless the last owner there already does.
  const SourcePosition* PositionOf(const ScriptSite& site,
                                   std::vector<std::shared_ptr<const void>>* owners) const;

 private:
  ScriptSite FromInterpreter();

  ModuleAddresses* addresses_;
  int64_t marked_ = 0;
  int64_t asked_ = 0;
  // The previous op's hierarchy and what it parsed to: consecutive ops mostly share it.
  std::vector<std::string> last_hierarchy_;
  int32_t last_module_ = 0;
  size_t last_innermost_ = 0;
  bool last_unknown_ = false;
  // The statement the interpreter was running at the last op it located.
  torch::jit::SourceRange last_range_;
};

// One entry of a module hierarchy ("block1(ConvBlock)::forward", "::helper") read against
// the last entry that entered a module (`previous`, "stem(Conv2d)::forward"): how it moves
// the innermost module. Used for the interpreter's hierarchies and, one call at a time,
// for the private plans' inlined calls, so that both read modules the same way.
struct HierarchyEntry {
  enum class Kind {
    kStays,            // a free function, SELF, or another method of the same instance
    kUnknownInstance,  // INSTANCE_NAME_UNKNOWN: some submodule of the current one
    kEnters,           // a named instance: the new innermost module
  };
  Kind kind = Kind::kStays;
  std::string instance;  // kEnters: "block1"
  std::string type;      // kEnters: "ConvBlock"
};
HierarchyEntry ClassifyHierarchyEntry(absl::string_view entry, absl::string_view previous);

struct ParsedHierarchy {
  // The named module instances from the root inward: (instance name, type name). An
  // instance name is the attribute that held the module where it was called, so a module
  // reached through a container (`self.convs[0](x)`) shows as "0", not "convs.0":
  // ModuleAddresses::Resolve finds the full address in the model.
  std::vector<std::pair<std::string, std::string>> path;
  std::string address;   // the names of `path`, dotted
  size_t innermost = 0;  // the index of its entry
  // A module instance TorchScript could not name (INSTANCE_NAME_UNKNOWN: a module taken
  // from a ModuleList inside a loop) lies inside it: the op ran in some submodule of it.
  bool unknown_instance = false;
};

// Parses a `currentModuleHierarchy()` result. Exposed for tests.
ParsedHierarchy ParseModuleHierarchy(const std::vector<std::string>& hierarchy);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_SCRIPT_SITES_H_
