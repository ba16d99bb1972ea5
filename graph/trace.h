// The trace: what one captured forward pass did, as a graph of plain `Op` nodes.
//
// A `Trace` holds one `Op` per executed op, per model input and output, and per observed
// version of every registered buffer, in execution order. An op's `parents` are the nodes
// whose values it read (in argument order), its `children` the nodes that read its value,
// each named by label for people and files, and by position in `ops()` for code
// (`parent_indices`, `child_indices`, `ArgSource::node`). Beside the graph it keeps
// address-level metadata:
// `buffers()` (each buffer's versions, initial and final value), `modules()` and
// `params()`, addressed exactly as `named_buffers()`, `named_modules()` and
// `named_parameters()` name them.
//
// Labels follow TorchLens:
//   * ops:     "{type}_{type_index}_{step_index}:{pass}", e.g. "conv2d_1_1:1". `type_index`
//              counts layers of that type and `step_index` all layers, both from 1 in order
//              of first execution; `pass` counts executions of the same layer (see
//              "Layers and passes" in graph/TRACE.md).
//   * buffers: "buffer_{n}:{version}", n numbering buffers in order of first appearance.
//   * inputs and outputs: "input_{n}", "output_{n}".
//
// Example:
//
//   absl::StatusOr<torchlens::Trace> trace = torchlens::TraceModule(model, {x});
//   if (!trace.ok()) return trace.status();
//   for (const torchlens::Op& op : trace->ops()) {
//     std::cout << op.label << " " << op.type << " " << op.module_address << "\n";
//   }
//   absl::StatusOr<const torchlens::Op*> relu = trace->Find("relu_1_2");
//   if (!relu.ok()) return relu.status();
//   const torchlens::Buffer& rm = trace->buffers().at("bn.running_mean");
//   absl::StatusOr<at::Tensor> after_first_write = rm.value_after(1);
//
// A `Trace` owns its tensors. Pointers it hands out (`Find`, `Buffer::versions`) stay valid
// while that `Trace` object lives, including after it is moved from one variable to another.
#ifndef TORCHLENS_GRAPH_TRACE_H_
#define TORCHLENS_GRAPH_TRACE_H_

#include <ATen/core/DimVector.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/shared_vector.h"
#include "torchlens_dispatch/ops/tensor_geometry.h"

namespace torchlens {

// How a buffer version came to be.
//   kReassign: the buffer slot was pointed at another tensor (`self.h = t` in TorchScript).
//   kInplace:  an op annotated as writing its argument wrote the buffer's storage, directly
//              or through a view or slice (`b.add_(1)`, `b[:2].copy_(x)`).
//   kFused:    a native kernel wrote the buffer without an alias annotation (BatchNorm and
//              InstanceNorm running statistics).
enum class WriteKind { kReassign, kInplace, kFused };

absl::string_view WriteKindName(WriteKind kind);  // "reassign", "inplace", "fused"

// Where one tensor argument of an op came from (see `Op::arg_sources`).
struct ArgSource {
  enum class Kind {
    kNode,      // the output `output_index` of the node labelled `name`
    kParam,     // the parameter whose address is `name`
    kConstant,  // a tensor from outside the capture that is not a model input
    kNone,      // an undefined tensor (an absent optional argument)
  };
  Kind kind = Kind::kNone;
  std::string name;  // what files and people read
  int output_index = 0;
  // kNode: the position in `Trace::ops()` of the node `name` labels, what code follows;
  // -1 when the trace holds no such node. Filled wherever a trace is made (NodeSource,
  // or from the labels by `Trace::Assemble`).
  int32_t node = -1;
};

absl::string_view ArgSourceKindName(ArgSource::Kind kind);  // "node", "param", ...

// Whether `a` and `b` name the same value: the same node's same output (by position), or
// the same parameter.
bool SameSource(const ArgSource& a, const ArgSource& b);

// A tensor that an op changed by writing another tensor on the same storage: the base of
// a view the op wrote (`x[0].add_(1)` changes `x`), a view whose base it wrote, or a
// registered buffer written through a slice or a permuted view. Readers of the changed
// tensor after the op name it as output -(k + 1) of the op, k its position in
// `Op::alias_writes` (see `OutputValue`). NOTE [Writes through aliases] in
// validation/replay.h says how replay recomputes it.
struct AliasWrite {
  ArgSource before;        // where the changed tensor's value before the write came from
  int written_tensor = 0;  // the tensor argument written (ForEachTensor order); -1: unknown
  TensorGeometry aliased;  // the changed tensor,
  TensorGeometry written;  // and the argument written, in their shared storage
  at::Tensor value;        // the changed tensor after the write (undefined when not saved)
};

// What a node is. `Op::type` names it for people ("conv2d", "buffer", "input"); the kind
// is what code branches on.
enum class OpKind : uint8_t {
  kOp,             // an executed operator
  kInput,          // a model input
  kOutput,         // a model output
  kBufferVersion,  // an observed version of a registered buffer (`Op::is_buffer`)
  kConstant,       // a tensor from outside the capture that is not an input
  kBackward,       // a node autograd ran in backward (`Trace::backward_ops`, never in `ops`)
};

// The kind a node of `type` has ("input", "output", "constant"; buffer versions have
// `is_buffer`): for traces read from files, which store the type. Backward ops are listed
// apart in files and are kBackward by where they are.
OpKind OpKindOf(absl::string_view type, bool is_buffer);

// An `if` of TorchScript code that an op ran inside, and which of its branches ran.
struct BranchTaken {
  std::string file;  // where the `if` statement is, as SourcePosition names it
  int line = 0;
  std::string text;  // "if bool(x.sum() > 0):"
  bool then = true;  // true: the `if` body ran; false: the `else` body

  friend bool operator==(const BranchTaken& a, const BranchTaken& b) {
    return a.file == b.file && a.line == b.line && a.text == b.text && a.then == b.then;
  }
};

// Where in the model's source code an op ran: the statement of the innermost function
// (for an op inside `nn.Linear`, the line of torch/nn/modules/linear.py that calls
// `F.linear`). TorchScript only: LibTorch's debug information maps the compiled code back
// to the Python file the model was scripted from (the path on the machine that scripted
// it); a model saved without it names its serialized code ("code/__torch__/...").
// Shared by every op of one statement, across captures of one model.
struct SourcePosition {
  std::string file;
  int line = 0;      // 1-based
  int column = 0;    // 0-based
  std::string text;  // the line, without its indentation
  // The `if`s the statement is inside, outermost first; empty when none (or when the
  // capture could not tell: see README "Source positions and branches").
  std::vector<BranchTaken> branches;

  friend bool operator==(const SourcePosition& a, const SourcePosition& b) {
    return a.file == b.file && a.line == b.line && a.column == b.column && a.text == b.text &&
           a.branches == b.branches;
  }
};

// "file:line" ("linear.py:114" keeps the file's base name only with `short_file`).
std::string FormatSourcePosition(const SourcePosition& position, bool short_file = false);

// One graph node. Buffer versions, inputs and outputs are plain `Op`s too.
struct Op {
  std::string label;      // unique, pass-qualified: "conv2d_1_1:1", "buffer_2:3", "input_1"
  std::string type;       // "conv2d", "batch_norm", "add_", "buffer", "input", "output"
  std::string func_name;  // "aten::batch_norm"; empty for buffer/input/output nodes
  std::vector<std::string> parents;   // labels, in argument order, without repeats
  std::vector<std::string> children;  // labels, in execution order
  std::string module_address;         // innermost module that ran it ("" = root)
  at::Tensor out;  // saved value (undefined when not saved); the first tensor output

  // Buffer version fields (meaningful when `is_buffer`).
  // `kind == OpKind::kBufferVersion`, for users: set from `kind` when the trace is made
  // (`Trace::Assemble`), and code inside the library tests `kind`.
  bool is_buffer = false;
  std::string address;                         // "bn.running_mean", "h"
  int buffer_pass = 0;                         // 1-based version index for this address
  std::optional<WriteKind> buffer_write_kind;  // nullopt = a read of the initial value
  std::optional<bool> buffer_value_changed;    // set for kFused versions

  // Beyond the TorchLens core fields.
  std::string overload_name;  // "Tensor" for aten::add.Tensor; with func_name names the op
  int pass = 1;               // execution count of this layer (the ":N" of the label)
  int layer_type_index = 0;   // the {type_index} of the label (0 for non-op nodes)
  int layer_step_index = 0;   // the {step_index} of the label (0 for non-op nodes)
  // Shape of `out`, recorded even when not saved. Inline storage, like LibTorch's own
  // DimVector: building a trace allocates as little per op as it can.
  at::DimVector tensor_shape;
  std::string tensor_dtype;  // "float", "long", ...; empty when not a tensor
  // Parameter addresses read, in argument order (most ops read at most two).
  absl::InlinedVector<std::string, 2> parent_params;
  // `outs`, `creation_args` and `arg_sources` read like const vectors; copies of an op
  // share them until one is written (NOTE [Ops shared by forks] in shared_vector.h).
  // Every tensor output, in return order (`out` is the first). Saved values only.
  SharedVector<at::Tensor> outs;
  // The arguments the op was called with, as saved for replay: tensors are the saved
  // pre-call values, other arguments as passed. Empty when not saved.
  SharedVector<c10::IValue> creation_args;
  // One entry per tensor inside `creation_args`, in visiting order (see ivalue_tensors.h).
  SharedVector<ArgSource> arg_sources;
  // For an op that consumes randomness (dropout, rand*, ...): the CPU generator's state
  // just before it ran, so that replay draws the same numbers. Saved values only.
  at::Tensor rng_state;
  // Tensors this op changed through an alias of what it wrote (see AliasWrite).
  std::vector<AliasWrite> alias_writes;
  // When it ran, relative to the first timed op of the capture, and for how long (its
  // nested calls included), with CaptureOptions::time_ops; -1 otherwise.
  int64_t start_ns = -1;
  int64_t duration_ns = -1;
  // Where in the model's code it ran (see SourcePosition); null for ops outside TorchScript
  // code and for buffer versions, inputs and outputs.
  std::shared_ptr<const SourcePosition> source_position;

  // Gradients (CaptureOptions::save_grads; NOTE [Gradients in a trace] in graph/gradients.h).
  // The gradient of the first tensor output after the latest backward() that reached the
  // trace; undefined when no gradient reached it (or no backward ran). Buffer versions and
  // outputs have their value's; inputs and constants theirs when they require grad.
  at::Tensor grad;
  // Every tensor output's gradient, in return order (`grad` is the first); empty when none
  // reached the node.
  std::vector<at::Tensor> grads;
  // A backward op (`kind == kBackward`): the label of the forward node whose gradient it
  // computes, the op that made it (or the input it accumulates into). A parameter's
  // accumulation (`AccumulateGrad`, whose `address` names the parameter) is linked to the
  // op that read the parameter (the first to feed it, when several did). Empty for forward
  // nodes.
  std::string forward_label;

  OpKind kind = OpKind::kOp;
  // The positions in `Trace::ops()` of `parents` and `children`, in the same order (-1 for
  // a label the trace does not hold). Filled by `Trace::Assemble`.
  absl::InlinedVector<int32_t, 2> parent_indices;
  absl::InlinedVector<int32_t, 2> child_indices;

  bool is_input() const { return kind == OpKind::kInput; }
  bool is_output() const { return kind == OpKind::kOutput; }
  // A tensor from outside the capture that is not a model input: a plain tensor attribute
  // (its `address` names it), a TorchScript constant, or a parameter returned as an output.
  bool is_constant() const { return kind == OpKind::kConstant; }
  bool is_compute() const { return kind == OpKind::kOp; }
  bool is_backward() const { return kind == OpKind::kBackward; }
  bool is_buffer_version() const { return kind == OpKind::kBufferVersion; }
  // Whether the capture kept this node's values (outputs, or the arguments that re-run
  // it). False for every node of a trace captured without saved values, and in a trace
  // with them for the ops that selective saving left out or that ran after the memory
  // budget was reached (NOTE [Selective saving] in torchlens_dispatch/capture_options.h).
  bool saved() const {
    if (out.defined() || !creation_args.empty()) return true;
    for (const at::Tensor& t : outs) {
      if (t.defined()) return true;
    }
    return false;
  }
};

// The source naming output `output_index` of `ops[node]`, by position and by label; a
// position outside `ops` names no node (-1, no name).
ArgSource NodeSource(const std::vector<Op>& ops, int32_t node, int output_index);

// The node `source` names among `ops` (a trace's, or a copy of them in the same order),
// or null when it names none.
const Op* SourceNode(const std::vector<Op>& ops, const ArgSource& source);

// The value a reader of output `output_index` of `op` sees: `op.outs[k]` for k >= 0 (or
// `op.out` when `outs` is empty), `op.alias_writes[k].value` for -(k + 1). Undefined when
// out of range or not saved.
const at::Tensor& OutputValue(const Op& op, int output_index);

// Address-level state of one registered buffer: a projection over its version nodes.
struct Buffer {
  std::string address;
  at::Tensor initial_value;         // captured before the forward pass
  at::Tensor final_value;           // value of the last observed version (initial if none)
  std::vector<const Op*> versions;  // initial read version first, then one per write
  int num_overwrites = 0;           // number of write versions
  std::string module_address;       // the module that registered it
  // NOTE [Buffers on one storage]: the other buffers that were this very tensor when the
  // capture started (`register_buffer("a", t); register_buffer("c", t)`), and those that
  // shared only some of its bytes (`self.c = self.b[:2]`).
  std::vector<std::string> same_tensor_as;
  std::vector<std::string> shares_storage_with;

  // The n-th observed version (1-based); kOutOfRange naming the valid range otherwise.
  absl::StatusOr<at::Tensor> value_at(int n) const;
  // The value after the n-th write (1-based); kOutOfRange naming the valid range otherwise.
  absl::StatusOr<at::Tensor> value_after(int n) const;
};

struct Module {
  std::string address;               // "" for the root
  std::string type_name;             // "Linear", "BatchNorm2d"
  std::vector<std::string> buffers;  // addresses of the buffers it owns (recursively)
  std::vector<std::string> params;   // addresses of the parameters it owns (recursively)
};

struct Param {
  std::string address;  // "fc.weight"
  std::vector<int64_t> shape;
  std::string module_address;  // the module that registered it
};

// Something the capture could not prove and reports instead of guessing.
struct TraceDiagnostic {
  std::string address;  // the buffer concerned; empty when it is about a node
  std::string message;
  std::string label;  // the node concerned (an input written in place); may be empty
};

// Counters of what the capture did, for tests and the benchmark.
struct CaptureStats {
  int64_t user_ops = 0;              // dispatched calls recorded as op nodes
  int64_t nested_ops = 0;            // calls made inside them that declare a write, checked
  int64_t buffer_slot_reads = 0;     // reads of TorchScript buffer slots (reassignment checks)
  int64_t copy_on_write_clones = 0;  // saved values copied before an in-place write
  int64_t marked_sites = 0;          // TorchScript ops located by site markers
  int64_t interpreter_sites = 0;     // TorchScript ops located by asking the interpreter
};

class Trace;
class GradientStore;

// Everything a `Trace` is made of (see `Trace::Assemble`).
struct TraceParts {
  std::vector<Op> ops;
  std::map<std::string, Buffer> buffers;
  // Immutable, shared by the traces of one model (null means empty).
  std::shared_ptr<const std::map<std::string, Module>> modules;
  std::shared_ptr<const std::map<std::string, Param>> params;
  std::vector<TraceDiagnostic> diagnostics;
  bool has_saved_values = false;
  bool training = false;
  CaptureStats stats;
  // Empty for a complete trace; otherwise why it is partial (see Trace::partial).
  std::string partial_reason;
  // Whether every op's `children`, `parent_indices`, `child_indices` and the `node` of its
  // argument sources are already filled in (the trace builder does it while labelling;
  // forks copy them); otherwise Assemble computes them from the labels.
  bool children_linked = false;
  // Gradients as they are now (NOTE [Gradients in a trace] in graph/gradients.h): the ops
  // autograd ran, in execution order, and the parameters' gradients by address.
  std::vector<Op> backward_ops;
  std::map<std::string, at::Tensor> param_grads;
  bool records_gradients = false;  // captured with save_grads, or read from a file that was
  // A capture with save_grads: the hooks' store, which fills the gradients of the trace
  // made from these parts (and of no copy of it). Null otherwise.
  std::shared_ptr<GradientStore> gradients;
};

class Trace {
 public:
  Trace() = default;
  Trace(const Trace& other);
  Trace& operator=(const Trace& other);
  Trace(Trace&&) noexcept = default;
  Trace& operator=(Trace&&) noexcept = default;
  ~Trace();  // NOTE [Destroying a trace]

  const std::vector<Op>& ops() const { return graph().ops; }
  // Accepts "relu_1_2:1", "relu_1_2" (when it has one pass), "bn.running_mean:2",
  // "h" (a buffer address with one version), "buffer_1:3", "input_1", "output_1".
  // kInvalidArgument for a malformed key or an ambiguous one; kNotFound (naming the
  // closest labels) for an unknown one.
  absl::StatusOr<const Op*> Find(absl::string_view key) const;
  const std::map<std::string, Buffer>& buffers() const { return graph().buffers; }
  const std::map<std::string, Module>& modules() const { return *modules_; }
  const std::map<std::string, Param>& params() const { return *params_; }
  std::vector<const Op*> buffer_read_ops() const;   // is_buffer && !buffer_write_kind
  std::vector<const Op*> buffer_write_ops() const;  // is_buffer && buffer_write_kind
  std::vector<std::string> input_labels() const;
  std::vector<std::string> output_labels() const;
  // NOTE [Gradients in a trace] in graph/gradients.h. The ops autograd ran in the latest
  // backward() that reached this trace, in execution order, each linked to the forward node
  // it differentiates (`Op::forward_label`); empty without CaptureOptions::save_grads or
  // before the first backward. Pointers stay valid until the next backward reaches the trace.
  std::vector<const Op*> backward_ops() const;
  // The parameters' gradients from that backward, by address (those it reached).
  const std::map<std::string, at::Tensor>& param_grads() const { return graph().param_grads; }
  // Whether gradients are recorded (captured with save_grads, or read from a file that has
  // them).
  bool records_gradients() const;
  // Unjournaled buffer changes accepted under `allow_unjournaled_writes`.
  const std::vector<TraceDiagnostic>& diagnostics() const { return graph().diagnostics; }
  // Whether tensor values were saved (`CaptureOptions::save_activations`).
  bool has_saved_values() const { return has_saved_values_; }
  // Whether the model ran in training mode during capture.
  bool training() const { return training_; }
  // Whether the trace holds less than the whole forward pass: it stopped early
  // (CaptureOptions::halt_after) or stopped saving at the memory budget; the reason says
  // which, and at which node.
  // A trace whose graph could not be built (NOTE [Graphs built on first use]) is partial
  // once the build was tried, with the reason.
  bool partial() const {
    return graph_ != nullptr && (partial_ || graph_->failed.load(std::memory_order_acquire));
  }
  const std::string& partial_reason() const { return graph().partial_reason; }
  const CaptureStats& capture_stats() const { return stats_; }
  // Position of `op` in `ops()`; -1 if it does not belong to this trace.
  int IndexOf(const Op* op) const;
  // Position in `ops()` of the node labelled exactly `label`; -1 if there is none.
  int IndexOfLabel(absl::string_view label) const;

  // Assembles a trace from its parts (used by the trace-file loader and intervention
  // forks). Computes children, buffer projections, lookup indexes and each op's
  // `is_buffer` (from its `kind`).
  static Trace Assemble(TraceParts parts);
  // A trace whose graph (ops, buffers, diagnostics, partial reason) `build` makes when an
  // accessor first needs it (NOTE [Graphs built on first use]); the rest is taken from
  // `known` now. `partial` says whether the built graph will have a partial reason.
  static Trace Deferred(TraceParts known, bool partial, absl::AnyInvocable<TraceParts()> build);
  // The parts of this trace, for building a fork with Assemble: ops and buffers are copies
  // whose tensors are shared, module and parameter metadata is shared. The gradients are a
  // snapshot; with `gradients_follow`, the trace assembled from the parts is the one the
  // gradient store fills from then on, instead of this one (a trace rebuilt in its place,
  // graph/trace_file_writer.cc; NOTE [Gradients in a trace] in graph/gradients.h).
  TraceParts Parts(bool gradients_follow = false) const;

 private:
  template <typename T>
  static std::shared_ptr<const std::map<std::string, T>> Empty() {
    static const auto* empty = new std::shared_ptr<const std::map<std::string, T>>(
        std::make_shared<const std::map<std::string, T>>());
    return *empty;
  }
  // NOTE [Graphs built on first use]
  // Labelling the nodes and building one `Op` per node (strings, edge lists) costs a capture
  // about as much as recording the forward did, on small-op models.
  // A service that captures on its request thread and hands the trace to another thread
  // (to write it, or validate it) should not pay that on the request thread, and a sampled
  // capture that is dropped should not pay it at all. So a captured trace keeps its compact
  // capture record, and the first accessor that needs the graph builds it, once, also when
  // several threads read the same trace at once; later reads cost an acquire load. What
  // needs no labels (modules, parameters, stats, flags) is known from the start.
  // `absl::call_once` does not survive an exception (every later reader would wait
  // forever), and the record is gone once the builder ran: a build that throws (out of
  // memory) leaves an empty graph whose partial reason and diagnostic say why.
  struct Graph {
    absl::once_flag built;
    absl::AnyInvocable<TraceParts()> build;  // empty when the graph was given built
    std::atomic<bool> failed{false};         // the build threw
    std::vector<Op> ops;
    std::map<std::string, Buffer> buffers;
    std::vector<TraceDiagnostic> diagnostics;
    std::string partial_reason;
    // Filled by `gradients` once attached (NOTE [Gradients in a trace]).
    std::vector<Op> backward_ops;
    std::map<std::string, at::Tensor> param_grads;
    std::shared_ptr<GradientStore> gradients;
    bool records_gradients = false;  // TraceParts::records_gradients
    Graph() = default;
    ~Graph();  // detaches `gradients` from the ops first
  };
  // A trace with what `parts` says of the model and the capture (modules, parameters,
  // flags, stats), taken out of `parts`, and an empty graph.
  static Trace WithoutGraph(TraceParts& parts, bool partial);
  // This trace's graph, built first if it is pending.
  const Graph& graph() const;
  // Moves the graph of `parts` into `graph`, with children (unless already linked) and
  // buffer projections.
  static void AdoptGraph(TraceParts parts, Graph& graph);
  // The buffer projections (`Buffer::versions`, initial and final values) from the ops.
  static void LinkBuffers(Graph& graph);
  // NOTE [Lazy label index]
  // Finding an op by label needs a hash index of every label, which costs a capture a
  // hash per op (labels longer than 16 bytes hash slower), and many traces are never
  // searched. The index is built by the first `Find`, once, also when several
  // threads search the same trace at once.
  struct LabelIndex {
    absl::once_flag built;
    absl::flat_hash_map<absl::string_view, int> positions;  // views into the ops' labels
  };
  const absl::flat_hash_map<absl::string_view, int>& by_label() const;

  // Null only in a moved-from trace.
  std::unique_ptr<Graph> graph_ = std::make_unique<Graph>();
  std::shared_ptr<const std::map<std::string, Module>> modules_ = Empty<Module>();
  std::shared_ptr<const std::map<std::string, Param>> params_ = Empty<Param>();
  bool has_saved_values_ = false;
  bool training_ = false;
  bool partial_ = false;
  CaptureStats stats_;
  // Null only in a moved-from trace. Made anew whenever the ops change.
  std::unique_ptr<LabelIndex> label_index_ = std::make_unique<LabelIndex>();
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_TRACE_H_
