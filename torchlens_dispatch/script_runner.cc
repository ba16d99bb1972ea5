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
#include "torchlens_dispatch/source_positions.h"

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
         type->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::TensorType;
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

// NOTE [Inlining from the top]
// The private plan inlines every call of the method, and each inlined node needs its
// complete call stack, outermost call first (the interpreter reads it for an op without a
// marker and for error messages), and its site: the named module instances of that stack
// and the hash of its source ranges (NOTE [Layers and passes]). Inlining from the top,
// each call is replaced by a copy of the callee's own, uninlined graph, and the copied
// nodes enter a call context made from the caller's in one step: its call stack (the
// caller's plus this call), its module path (a SitePath node, NOTE [Site paths]) and its
// position hash. The calls among the copied nodes are inlined the same way, in the inner
// context. Each call is thus inlined once, and a site is read off its context. LibTorch's
// Inline (and this file before) inline from the bottom: each callee's fully inlined graph
// is copied into its caller, and each site re-read its whole stack, which grows with the
// square of the nesting depth (README "Reliability"). What stays: LibTorch represents a
// node's call stack as a chain of entries from the outermost call inward, so a context k
// calls deep holds a chain of k entries of its own, as it does after LibTorch's Inline.
struct CallContext {
  c10::optional<torch::jit::InlinedCallStackPtr> stack;  // none at the top
  const SitePath* path = nullptr;                        // the root's
  std::string previous;  // the entry that entered the innermost module, "conv(Conv2d)::forward"
  bool unknown_instance = false;
  // The ranges from the innermost named module's code to this context's code, hashed.
  uint64_t position = kPositionSeed;
};

struct PrivatePlan {
  // The method graph it copies, held weakly: NOTE [Private plan lifetime].
  std::weak_ptr<torch::jit::Graph> source;
  // Stable addresses: markers point at sites, sites and contexts at paths.
  std::deque<MarkedSite> sites;
  std::deque<SitePath> paths;
  std::deque<CallContext> contexts;
  // Every site's source position, owned together (NOTE [Source positions]): a
  // std::vector<std::shared_ptr<const SourcePosition>>.
  std::shared_ptr<const void> source_positions;
  std::unique_ptr<torch::jit::GraphFunction> function;
};

// The stack of `outer` extended by one innermost call (see the NOTE: entries are copied).
torch::jit::InlinedCallStackPtr Extended(
    const c10::optional<torch::jit::InlinedCallStackPtr>& outer, torch::jit::Function* callee,
    const torch::jit::SourceRange& call_site,
    const c10::optional<torch::jit::ModuleInstanceInfo>& instance) {
  std::vector<const torch::jit::InlinedCallStack*> entries;  // outermost first
  for (const torch::jit::InlinedCallStack* entry = outer.has_value() ? outer->get() : nullptr;
       entry != nullptr;) {
    entries.push_back(entry);
    c10::optional<torch::jit::InlinedCallStackPtr> next = entry->callee();
    entry = next.has_value() ? next->get() : nullptr;
  }
  auto stack = c10::make_intrusive<torch::jit::InlinedCallStack>(callee, call_site, instance);
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    stack = c10::make_intrusive<torch::jit::InlinedCallStack>(
        stack, (*it)->function(), (*it)->source_range(), (*it)->module_instance());
  }
  return stack;
}

// The context the callee of a call from `outer` runs in (NOTE [Inlining from the top]).
const CallContext& Enter(const CallContext& outer, torch::jit::Function* callee,
                         const torch::jit::SourceRange& call_site,
                         const c10::optional<torch::jit::ModuleInstanceInfo>& instance,
                         PrivatePlan* plan) {
  CallContext& inner = plan->contexts.emplace_back(outer);
  inner.stack = Extended(outer.stack, callee, call_site, instance);
  // The entry the interpreter's module hierarchy shows for this call.
  const std::string entry = instance.has_value()
                                ? absl::StrCat(InstanceEntry(*instance), "::", callee->name())
                                : absl::StrCat("::", callee->name());
  HierarchyEntry step = ClassifyHierarchyEntry(entry, outer.previous);
  if (step.kind == HierarchyEntry::Kind::kEnters) {
    inner.path = &plan->paths.emplace_back(
        SitePath{outer.path, std::move(step.instance), std::move(step.type), {}});
    inner.previous = entry;
    inner.unknown_instance = false;
    inner.position = kPositionSeed;
  } else {
    inner.unknown_instance =
        outer.unknown_instance || step.kind == HierarchyEntry::Kind::kUnknownInstance;
    inner.position = MixPosition(outer.position, call_site);
  }
  return inner;
}

using NodeContexts = absl::flat_hash_map<const torch::jit::Node*, const CallContext*>;

// Gives `node` (and the nodes of its blocks) the stack and context of `context`.
void Adopt(torch::jit::Node* node, const CallContext& context, NodeContexts* contexts) {
  node->setCallStack(*context.stack);
  (*contexts)[node] = &context;
  for (torch::jit::Block* block : node->blocks()) {
    for (torch::jit::Node* inner : block->nodes()) Adopt(inner, context, contexts);
  }
}

void InlineBlock(torch::jit::Block* block, const CallContext& context, PrivatePlan* plan,
                 NodeContexts* contexts);

// Inlines the calls among the nodes from `first` up to (not including) `end`, which run in
// `context`, and the calls in their blocks.
void InlineNodes(torch::jit::Node* first, torch::jit::Node* end, const CallContext& context,
                 PrivatePlan* plan, NodeContexts* contexts) {
  for (torch::jit::Node* node = first; node != end;) {
    torch::jit::Node* next = node->next();
    const c10::Symbol kind = node->kind();
    torch::jit::GraphFunction* callee =
        kind == c10::prim::CallFunction || kind == c10::prim::CallMethod
            ? torch::jit::tryToGraphFunction(node)
            : nullptr;
    if (callee == nullptr) {
      for (torch::jit::Block* inner : node->blocks()) InlineBlock(inner, context, plan, contexts);
      node = next;
      continue;
    }
    const torch::jit::SourceRange call_site = node->sourceRange();
    torch::jit::Node* before = node->prev();
    if (kind == c10::prim::CallFunction) node->removeInput(0);  // the function constant
    torch::jit::inlineCallTo(node, callee, callee->graph().get());
    // The module instance inlineCallTo recorded for this call, from a node it annotated
    // (ModuleInstanceInfo's constructor is not exported).
    c10::optional<torch::jit::ModuleInstanceInfo> instance;
    for (torch::jit::Node* inlined = before->next(); inlined != next; inlined = inlined->next()) {
      if (c10::optional<torch::jit::InlinedCallStackPtr> stack = inlined->callstack()) {
        instance = (*stack)->module_instance();
        break;
      }
    }
    const CallContext& inner = Enter(context, callee, call_site, instance, plan);
    for (torch::jit::Node* inlined = before->next(); inlined != next; inlined = inlined->next()) {
      Adopt(inlined, inner, contexts);
    }
    InlineNodes(before->next(), next, inner, plan, contexts);
    node = next;
  }
}

void InlineBlock(torch::jit::Block* block, const CallContext& context, PrivatePlan* plan,
                 NodeContexts* contexts) {
  InlineNodes(block->param_node()->next(), block->return_node(), context, plan, contexts);
}

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
// them and the op, where a marker stalls the reads that follow it. Only these node kinds are
// stepped over: none of them dispatches, and none has blocks that could hold other ops' markers.
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

// Inlines a copy of `method`'s graph (NOTE [Inlining from the top]) and puts a site marker
// before each node that dispatches an op (NOTE [Marker placement]).
std::shared_ptr<torch::jit::Graph> MarkedCopy(const torch::jit::GraphFunction& method,
                                              PrivatePlan* plan) {
  std::shared_ptr<torch::jit::Graph> graph = method.graph()->copy();
  const CallContext& top = plan->contexts.emplace_back();
  NodeContexts contexts;  // the method's own nodes are in `top`
  InlineBlock(graph->block(), top, plan, &contexts);
  FoldConstantBranches(graph->block());
  MarkAssignments(graph->block());
  std::vector<torch::jit::Node*> nodes;
  CollectOpNodes(graph->block(), &nodes);
  auto positions = std::make_shared<std::vector<std::shared_ptr<const SourcePosition>>>();
  for (torch::jit::Node* node : nodes) {
    auto it = contexts.find(node);
    const CallContext& context = it == contexts.end() ? top : *it->second;
    MarkedSite& site = plan->sites.emplace_back();
    site.op = node->kind();
    site.path = context.path;
    site.unknown_instance = context.unknown_instance;
    site.position = MixPosition(context.position, node->sourceRange());
    std::shared_ptr<const SourcePosition> position = SourcePositionOfNode(node);
    site.source_position = position.get();
    site.source_position_owner = &plan->source_positions;
    if (position != nullptr) positions->push_back(std::move(position));
    torch::jit::WithInsertPoint insert_before(MarkerPosition(node));
    torch::jit::Value* marker =
        graph->insertConstant(static_cast<int64_t>(reinterpret_cast<intptr_t>(&site)));
    graph->insertNode(graph->create(kSiteMarker, {marker}, /*num_outputs=*/0));
  }
  plan->source_positions = std::move(positions);
  return graph;
}

// NOTE [Private plan lifetime]
// A plan is built once per method graph and kept while that graph lives: the graph belongs
// to the model's compilation unit, so a service that loads fresh model objects (a reload,
// a model per tenant) must not keep every plan it ever built. The cache holds each source
// graph weakly. A plan whose graph died is never run again (running one needs its model,
// which holds the graph), so it can be dropped; the cache sweeps dead plans whenever it has
// doubled since the last sweep, which keeps it within twice the live plans at a constant
// amortized cost. A new graph at a dead one's address finds the dead entry expired and
// gets a fresh plan.
class PlanCache {
 public:
  torch::jit::GraphFunction& Get(const torch::jit::GraphFunction& method) {
    std::shared_ptr<torch::jit::Graph> source = method.graph();
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<PrivatePlan>& plan = plans_[source.get()];
    if (plan == nullptr || plan->source.lock() != source) {
      plan = std::make_unique<PrivatePlan>();
      plan->source = source;
      plan->function = std::make_unique<torch::jit::GraphFunction>(
          method.qualname(), MarkedCopy(method, plan.get()), /*function_creator=*/nullptr,
          torch::jit::ExecutorExecutionMode::SIMPLE);
      if (plans_.size() >= 2 * live_after_sweep_) Sweep();
    }
    return *plan->function;
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.size();
  }

 private:
  void Sweep() {
    absl::erase_if(plans_, [](const auto& entry) { return entry.second->source.expired(); });
    live_after_sweep_ = std::max<size_t>(plans_.size(), kMinSweepSize);
  }

  static constexpr size_t kMinSweepSize = 8;
  std::mutex mutex_;
  // Plans are boxed: a plan's sites and paths must keep their addresses (the plan's graph
  // holds them) while the map rehashes.
  absl::flat_hash_map<const torch::jit::Graph*, std::unique_ptr<PrivatePlan>> plans_;
  size_t live_after_sweep_ = kMinSweepSize;
};

PlanCache& Plans() {
  static PlanCache* cache = new PlanCache();  // never destroyed: used until exit
  return *cache;
}

}  // namespace

size_t PrivatePlansForTesting() { return Plans().size(); }

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
