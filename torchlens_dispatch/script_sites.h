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

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace torchlens {

// NOTE [Site markers]
// Asking the interpreter where an op runs (`currentModuleHierarchy()` and
// `currentCallstack()`) builds strings on every op, about 0.8 us. A graph torchlens runs
// itself (script_runner.h) is instead rewritten before its first run: each node that
// dispatches an op is preceded by a call to the JIT-only op `torchlens::site`, whose
// argument points at a `MarkedSite` computed once from the node's inlined call stack. The
// marker stores the pointer in a thread-local, and the recorder takes it on the next
// user-level op, if that op is the node's operator; otherwise it asks the interpreter.
// Marked sites live as long as the process (the private plans are never freed).
struct MarkedSite {
  const void* plan = nullptr;  // the private plan the site belongs to
  int32_t index = 0;           // dense, within the plan
  c10::Symbol op;              // the node's operator, e.g. aten::linear
  std::string address;         // innermost module instance, as ParseModuleHierarchy gives it
  uint64_t position = 0;       // as ScriptSites::Current computes it at run time
};

// Called by the marker op.
void SetMarkedSite(const MarkedSite* site);
// The site set since the last call, or nullptr; clears it.
const MarkedSite* TakeMarkedSite();

// The position hash of a chain of source ranges, outermost first.
constexpr uint64_t kPositionSeed = 0x9e3779b97f4a7c15ULL;
uint64_t MixPosition(uint64_t hash, const torch::jit::SourceRange& range);

// Interned module addresses: the model's own (shared, id 0 is the root "") and any other
// address the interpreter names, numbered after them.
class ModuleAddresses {
 public:
  ModuleAddresses(std::shared_ptr<const std::vector<std::string>> base,
                  const absl::flat_hash_map<std::string, int32_t>* base_ids)
      : base_(std::move(base)), base_ids_(base_ids) {}
  int32_t Intern(const std::string& address);
  const std::shared_ptr<const std::vector<std::string>>& base() const { return base_; }
  std::vector<std::string> ReleaseExtra() { return std::move(extra_); }

 private:
  std::shared_ptr<const std::vector<std::string>> base_;
  const absl::flat_hash_map<std::string, int32_t>* base_ids_;
  std::vector<std::string> extra_;
  absl::flat_hash_map<std::string, int32_t> extra_ids_;
};

struct ScriptSite {
  bool in_script = false;  // false: no TorchScript frame is running on this thread
  int32_t module = 0;      // innermost module instance (ModuleAddresses id)
  uint64_t position = 0;   // hash of the source ranges from that module's code inward
};

// Reads the current op's site from the TorchScript interpreter. One per capture.
class ScriptSites {
 public:
  explicit ScriptSites(ModuleAddresses* addresses) : addresses_(addresses) {}
  // The site of the current op, whose operator is `op`.
  ScriptSite Current(c10::Symbol op);
  int64_t marked() const { return marked_; }
  int64_t asked() const { return asked_; }

 private:
  ScriptSite FromInterpreter();

  ModuleAddresses* addresses_;
  // Module ids of the marked sites of the plan seen last, by site index (-1: not yet).
  const void* plan_ = nullptr;
  std::vector<int32_t> marked_modules_;
  int64_t marked_ = 0;
  int64_t asked_ = 0;
  // The previous op's hierarchy and what it parsed to: consecutive ops mostly share it.
  std::vector<std::string> last_hierarchy_;
  int32_t last_module_ = 0;
  size_t last_innermost_ = 0;
};

// Parses a `currentModuleHierarchy()` result into the innermost module's dotted address
// and the index of its entry. Exposed for tests.
void ParseModuleHierarchy(const std::vector<std::string>& hierarchy, std::string* address,
                          size_t* innermost);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_SCRIPT_SITES_H_
