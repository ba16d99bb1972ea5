#include "torchlens_dispatch/script_runner.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/script.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/recorder.h"
#include "torchlens_dispatch/script_sites.h"

namespace torchlens {
namespace {

// The marker op of NOTE [Site markers]: JIT-only, so the interpreter calls it directly and
// the dispatcher (and the capture) never sees it; CONSERVATIVE alias analysis gives it side
// effects, so no pass removes it.
const c10::Symbol kSiteMarker = c10::Symbol::fromQualString("torchlens::site");

torch::jit::RegisterOperators site_marker_registration({torch::jit::Operator(
    "torchlens::site(int site) -> ()",
    [](torch::jit::Stack& stack) {
      const int64_t site = torch::jit::pop(stack).toInt();
      SetMarkedSite(reinterpret_cast<const MarkedSite*>(static_cast<intptr_t>(site)));
    },
    c10::AliasAnalysisKind::CONSERVATIVE)});

// NOTE [Assignment markers]
// `self.h = t` is a prim::SetAttr, which dispatches nothing. In a private plan each
// SetAttr of a tensor attribute is followed by a call to this JIT-only op, which lets the
// capturing recorder read the assigned buffer slots right away (NOTE [Buffer
// reassignment] in recorder.h): two assignments with no op between them are two versions.
const c10::Symbol kAssignmentMarker = c10::Symbol::fromQualString("torchlens::assigned");

torch::jit::RegisterOperators assignment_marker_registration({torch::jit::Operator(
    "torchlens::assigned() -> ()",
    [](torch::jit::Stack&) {
      if (Recorder* recorder = Recorder::Current()) recorder->OnAttributeAssigned();
    },
    c10::AliasAnalysisKind::CONSERVATIVE)});

bool AssignsTensor(const torch::jit::Node* node) {
  if (node->kind() != c10::prim::SetAttr) return false;
  const c10::TypePtr& type = node->input(1)->type();
  if (type->kind() == c10::TypeKind::TensorType) return true;
  return type->kind() == c10::TypeKind::OptionalType &&
         type->expectRef<c10::OptionalType>().getElementType()->kind() ==
             c10::TypeKind::TensorType;
}

void MarkAssignments(torch::jit::Block* block) {
  for (torch::jit::Node* node : block->nodes()) {
    for (torch::jit::Block* inner : node->blocks()) MarkAssignments(inner);
    if (AssignsTensor(node)) {
      torch::jit::Node* marker = node->owningGraph()->create(kAssignmentMarker, {}, 0);
      marker->insertAfter(node);
    }
  }
}

// "conv(Conv2d)", as the interpreter's module hierarchy spells a module instance.
std::string InstanceEntry(const torch::jit::ModuleInstanceInfo& info) {
  std::string type;
  if (info.class_type() && info.class_type()->name()) {
    type = info.class_type()->name()->qualifiedName();
    type = type.substr(type.find_last_of('.') + 1);
  }
  return absl::StrCat(info.instance_name().empty() ? "UNKNOWN_INSTANCE" : info.instance_name(), "(",
                      type.empty() ? "UNKNOWN_TYPE" : type, ")");
}

// The site ScriptSites would read from the interpreter while `node` runs.
MarkedSite SiteOf(torch::jit::Node* node, const std::string& top_entry) {
  std::vector<std::string> hierarchy = {top_entry};
  std::vector<torch::jit::SourceRange> ranges;
  if (auto callstack = node->callstack()) {
    for (const torch::jit::InlinedCallStackEntry& entry : (*callstack)->vec()) {
      const std::string function = std::get<0>(entry)->name();
      const auto& info = std::get<2>(entry);
      hierarchy.push_back(info.has_value() ? absl::StrCat(InstanceEntry(*info), "::", function)
                                           : absl::StrCat("::", function));
      ranges.push_back(std::get<1>(entry));
    }
  }
  ranges.push_back(node->sourceRange());
  MarkedSite site;
  site.op = node->kind();
  ParsedHierarchy parsed = ParseModuleHierarchy(hierarchy);
  site.path = parsed.path;
  site.unknown_instance = parsed.unknown_instance;
  const size_t innermost = parsed.innermost;
  site.position = kPositionSeed;
  for (size_t k = innermost; k < ranges.size(); ++k) {
    site.position = MixPosition(site.position, ranges[k]);
  }
  return site;
}

void CollectOpNodes(torch::jit::Block* block, std::vector<torch::jit::Node*>* out) {
  for (torch::jit::Node* node : block->nodes()) {
    for (torch::jit::Block* inner : node->blocks()) CollectOpNodes(inner, out);
    const c10::Symbol kind = node->kind();
    if (!kind.is_prim() && kind != kSiteMarker && kind != kAssignmentMarker &&
        node->maybeOperator() != nullptr) {
      out->push_back(node);
    }
  }
}

// Inlines every call from the callees' source graphs, bottom-up: each callee's graph is
// itself fully inlined before it is inlined at a call site, which is what gives the
// inlined nodes their complete call stacks (inlineCallTo prepends the call site to the
// callee nodes' stacks). torch::jit::Inline uses each callee's cached optimized_graph()
// instead, whose content depends on the optimization setting in force when that cache was
// first filled; this gives the same plan whatever ran before.
using InlinedGraphs =
    absl::flat_hash_map<torch::jit::GraphFunction*, std::shared_ptr<torch::jit::Graph>>;

void InlineCalls(torch::jit::Block* block, InlinedGraphs* done);

std::shared_ptr<torch::jit::Graph> Inlined(torch::jit::GraphFunction* function,
                                           InlinedGraphs* done) {
  auto it = done->find(function);
  if (it != done->end()) return it->second;
  std::shared_ptr<torch::jit::Graph> graph = function->graph()->copy();
  InlineCalls(graph->block(), done);  // TorchScript has no recursion
  done->emplace(function, graph);
  return graph;
}

// LibTorch 1.13's inlineCallTo leaves the nodes inside an inlined If or Loop without the
// call site in their call stack (it only visits nodes through the values it mapped), so
// that, e.g., BatchNorm's `num_batches_tracked.add_(1)` would seem to run in the parent
// module. Completes the stacks of nodes that lack the call site.
void CompleteCallStack(torch::jit::Node* node, torch::jit::Function* callee,
                       const torch::jit::SourceRange& call_site,
                       const c10::optional<torch::jit::ModuleInstanceInfo>& instance);

void CompleteCallStacks(torch::jit::Block* block, torch::jit::Function* callee,
                        const torch::jit::SourceRange& call_site,
                        const c10::optional<torch::jit::ModuleInstanceInfo>& instance) {
  for (torch::jit::Node* node : block->nodes()) {
    CompleteCallStack(node, callee, call_site, instance);
  }
}

void CompleteCallStack(torch::jit::Node* node, torch::jit::Function* callee,
                       const torch::jit::SourceRange& call_site,
                       const c10::optional<torch::jit::ModuleInstanceInfo>& instance) {
  c10::optional<torch::jit::InlinedCallStackPtr> stack = node->callstack();
  const bool has_call_site =
      stack.has_value() && (*stack)->function() == callee && (*stack)->source_range() == call_site;
  if (!has_call_site) {
    node->setCallStack(
        stack.has_value()
            ? c10::make_intrusive<torch::jit::InlinedCallStack>(*stack, callee, call_site, instance)
            : c10::make_intrusive<torch::jit::InlinedCallStack>(callee, call_site, instance));
  }
  for (torch::jit::Block* inner : node->blocks()) {
    CompleteCallStacks(inner, callee, call_site, instance);
  }
}

void InlineCalls(torch::jit::Block* block, InlinedGraphs* done) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    torch::jit::Node* node = *it++;
    const c10::Symbol kind = node->kind();
    if (kind == c10::prim::CallFunction || kind == c10::prim::CallMethod) {
      if (torch::jit::GraphFunction* callee = torch::jit::tryToGraphFunction(node)) {
        std::shared_ptr<torch::jit::Graph> callee_graph = Inlined(callee, done);
        const torch::jit::SourceRange call_site = node->sourceRange();
        torch::jit::Node* before = node->prev();
        torch::jit::Node* after = node->next();
        if (kind == c10::prim::CallFunction) node->removeInput(0);  // the function constant
        torch::jit::inlineCallTo(node, callee, callee_graph.get());
        // The module instance inlineCallTo recorded for this call, from a node it did
        // annotate (its constructor is not exported).
        c10::optional<torch::jit::ModuleInstanceInfo> instance;
        for (torch::jit::Node* inlined = before->next(); inlined != after;
             inlined = inlined->next()) {
          c10::optional<torch::jit::InlinedCallStackPtr> stack = inlined->callstack();
          if (stack.has_value() && (*stack)->function() == callee &&
              (*stack)->source_range() == call_site) {
            instance = (*stack)->module_instance();
            break;
          }
        }
        for (torch::jit::Node* inlined = before->next(); inlined != after;
             inlined = inlined->next()) {
          CompleteCallStack(inlined, callee, call_site, instance);
        }
        continue;
      }
    }
    for (torch::jit::Block* inner : node->blocks()) InlineCalls(inner, done);
  }
}

struct PrivatePlan {
  // Holding the source graph keeps its address from being reused as another cache key.
  std::shared_ptr<torch::jit::Graph> source;
  std::deque<MarkedSite> sites;  // stable addresses, pointed at by the markers
  std::unique_ptr<torch::jit::GraphFunction> function;
};

// NOTE [Constant branches]
// TorchScript compiles a module's constants (`__constants__`, such as ReLU's `inplace`)
// into its graph as literals, so `if self.inplace:` stays an `If` on a literal in the
// method's graph until the model's own executor optimizes it away. The private plan folds
// such branches too, and nothing else (folding ops on constant inputs would drop ops the
// code runs): each ReLU of a model then runs one op and one marker, not a branch holding
// two of each.
void FoldConstantBranches(torch::jit::Block* block) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    torch::jit::Node* node = *it++;
    const c10::optional<c10::IValue> condition =
        node->kind() == c10::prim::If ? torch::jit::toIValue(node->input(0)) : c10::nullopt;
    if (!condition.has_value() || !condition->isBool()) {
      for (torch::jit::Block* inner : node->blocks()) FoldConstantBranches(inner);
      continue;
    }
    // The branch taken replaces the If; the other one is never looked into.
    torch::jit::Block* taken = node->blocks()[condition->toBool() ? 0 : 1];
    FoldConstantBranches(taken);
    for (auto inner = taken->nodes().begin(); inner != taken->nodes().end();) {
      torch::jit::Node* moved = *inner++;
      moved->moveBefore(node);
    }
    for (size_t i = 0; i < node->outputs().size(); ++i) {
      node->output(i)->replaceAllUsesWith(taken->outputs()[i]);
    }
    node->destroy();
  }
}

// NOTE [Marker placement]
// A marker must be the last one to run before its op dispatches, so nothing that dispatches
// may run between them. Within that constraint it goes before the nodes that only gather
// the op's arguments (attribute reads, constants, list and tuple packing), not between
// them and the op, where a marker stalls the reads that follow it (it halved the cost of
// markers on a large MLP; README "Performance"). Only these node kinds are stepped
// over: none of them dispatches, and none has blocks that could hold other ops' markers.
bool GathersArguments(const torch::jit::Node* node) {
  const c10::Symbol kind = node->kind();
  return node->blocks().empty() &&
         (kind == c10::prim::GetAttr || kind == c10::prim::Constant ||
          kind == c10::prim::ListConstruct || kind == c10::prim::TupleConstruct ||
          kind == c10::prim::ListUnpack || kind == c10::prim::TupleUnpack);
}

// Where the marker of `op_node` goes: before the argument-gathering nodes just above it.
torch::jit::Node* MarkerPosition(torch::jit::Node* op_node) {
  const torch::jit::Node* block_start = op_node->owningBlock()->param_node();
  torch::jit::Node* position = op_node;
  while (position->prev() != block_start && GathersArguments(position->prev())) {
    position = position->prev();
  }
  return position;
}

// Inlines a copy of `method`'s graph and puts a site marker before each node that
// dispatches an op (NOTE [Marker placement]).
std::shared_ptr<torch::jit::Graph> MarkedCopy(const torch::jit::GraphFunction& method,
                                              std::deque<MarkedSite>* sites) {
  std::shared_ptr<torch::jit::Graph> graph = method.graph()->copy();
  InlinedGraphs inlined;
  InlineCalls(graph->block(), &inlined);
  FoldConstantBranches(graph->block());
  MarkAssignments(graph->block());
  std::string top = "TOP";
  if (!graph->inputs().empty()) {
    if (auto self = graph->inputs()[0]->type()->cast<c10::ClassType>(); self && self->name()) {
      std::string type = self->name()->qualifiedName();
      top = absl::StrCat("TOP(", type.substr(type.find_last_of('.') + 1), ")");
    }
  }
  top = absl::StrCat(top, "::", method.name());
  std::vector<torch::jit::Node*> nodes;
  CollectOpNodes(graph->block(), &nodes);
  for (torch::jit::Node* node : nodes) {
    sites->push_back(SiteOf(node, top));
    torch::jit::WithInsertPoint insert_before(MarkerPosition(node));
    torch::jit::Value* site =
        graph->insertConstant(static_cast<int64_t>(reinterpret_cast<intptr_t>(&sites->back())));
    graph->insertNode(graph->create(kSiteMarker, {site}, /*num_outputs=*/0));
  }
  return graph;
}

class PlanCache {
 public:
  torch::jit::GraphFunction& Get(const torch::jit::GraphFunction& method) {
    std::shared_ptr<torch::jit::Graph> source = method.graph();
    std::lock_guard<std::mutex> lock(mutex_);
    PrivatePlan& plan = plans_[source.get()];
    if (plan.function == nullptr) {
      plan.source = source;
      plan.function = std::make_unique<torch::jit::GraphFunction>(
          method.qualname(), MarkedCopy(method, &plan.sites), /*function_creator=*/nullptr,
          torch::jit::ExecutorExecutionMode::SIMPLE);
    }
    return *plan.function;
  }

 private:
  std::mutex mutex_;
  absl::flat_hash_map<const torch::jit::Graph*, PrivatePlan> plans_;
};

PlanCache& Plans() {
  static PlanCache* cache = new PlanCache();  // never destroyed: used until exit
  return *cache;
}

}  // namespace

c10::IValue RunUnoptimized(torch::jit::Module& model, std::vector<c10::IValue> inputs,
                           const std::string& method) {
  const torch::jit::Function& function = model.get_method(method).function();
  torch::jit::GraphFunction& plan = Plans().Get(torch::jit::toGraphFunction(function));
  torch::jit::Stack stack;
  stack.reserve(inputs.size() + 1);
  stack.push_back(model._ivalue());
  for (c10::IValue& input : inputs) stack.push_back(std::move(input));
  function.getSchema().checkAndNormalizeInputs(stack, {});
  plan.run(stack);
  return stack.front();
}

}  // namespace torchlens
