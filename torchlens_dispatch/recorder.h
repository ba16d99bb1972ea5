// The per-capture state behind the fallback: it turns dispatched calls into a
// `CaptureRecord` (graph/capture_record.h).
//
// NOTE [User-level and nested ops]
// With the capture key in the thread's included set, every call the thread dispatches
// reaches `Recorder::OnOp`, including calls that composite kernels make while running an
// outer op (`batch_norm` -> `_batch_norm_impl_index` -> `native_batch_norm`). A depth
// counter tells them apart: depth 0 calls are user-level ops and become graph nodes;
// deeper calls are nested. Nested calls matter only when they can write model state, and
// an op can only reach model state through its arguments, so an op whose arguments touch
// no registered buffer's storage is redispatched with the key excluded: its nested calls
// then cost nothing. Ops that touch a buffer, and the fused mutators, are redispatched
// with their nested calls watched, and each nested call that writes an argument is checked
// against the buffers' storages (NOTE [Buffer writes]). The write watch key sees only the
// calls that declare a write (NOTE [Watching nested writes] in write_watch.h).
//
// NOTE [Tensor identity]
// Edges follow tensor identity: the producer of an argument is the last node whose output
// was that TensorImpl. An in-place op becomes the new producer of the tensor it wrote. A
// registered buffer's TensorImpl maps to its latest version node instead, so readers of
// the buffer hang off the version.
//
// NOTE [Address reuse in unsaved mode]
// Without saved values the capture holds no tensor, so a freed TensorImpl's address can
// come back as a new tensor; one from outside the capture (a constant the interpreter
// makes without dispatching) must not inherit the dead tensor's producer. With saved
// values too, some tensors are held by no saved value: the ops a selective capture does
// not save (NOTE [Selective saving]), and those that require grad, whose saved value is a
// detached alias (another TensorImpl). Every entry whose TensorImpl its slot does not
// hold is pinned as below (a detached alias's original keeps its address with a weak
// reference, as the saved value would). An entry pins the tensor's version counter: a
// small object that every new tensor allocates, shared only by views and detached aliases
// of the same data, so a different counter at a known address means a different tensor.
// Pinning it, not the TensorImpl (a weak reference), lets the allocator hand the hot
// TensorImpl memory to the next op's output, which is still in cache. Tensors without a counter
// (created under InferenceMode) keep a weak reference instead.
//
// NOTE [In-place view ops]
// `t_`, `transpose_`, `swapdims_`, `squeeze_`, `unsqueeze_`, `as_strided_`, `detach_` (the
// ops LibTorch tags inplace_view, but `resize_`, which may allocate and is a write) declare
// a write of `self` and change only its sizes, strides and offset: no byte of any storage
// changes. So they write nothing that shares its bytes: no alias write, no buffer version
// through a view, no copy of the other saved values. What does change is the tensor
// itself: its own saved value, kept by reference, is copied first (it would change shape
// under the trace), it leaves the alias index and comes back with its new geometry (NOTE
// [Aliases change place]), and when it is a registered buffer's tensor, the buffer's state
// (its shape) gets a kInplace version, the op's output. Were they writes of their bytes,
// the next write through a view would be redone in the geometry from before the op
// (testdata inplace_view_ops).
//
// NOTE [Buffer writes]
// A write is attributed to a registered buffer by StorageImpl identity, then by byte range
// (views and slices included). All writes to one buffer during one user-level op make a
// single version: kFused when the op is a fused mutator (NOTE [Fused buffer writes]) or the
// write happened inside the kernel without the user-level op declaring it, kInplace when
// the user-level op's schema declares the write. A kInplace version whose written argument
// is the buffer itself (same place in the same storage) is the op's output that returned
// it; one written through a slice or a permuted view is an alias write of the op, whose
// earlier state is the buffer's previous version. `set_` moves a buffer to another
// storage: the index follows it. A tensor made without dispatching that has exactly the
// buffer's place in its storage (`b.data` in TorchScript, `b.data()` in C++) reads and
// writes the buffer like the registered tensor itself.
//
// NOTE [Buffer reassignment]
// `self.h = t` in TorchScript is a prim::SetAttr: no op is dispatched. The capture reads
// the attribute slots of the buffers that some method's code assigns (usually none or a
// few recurrent states) before each user-level op, after each `prim::SetAttr` of a tensor
// in a plan torchlens runs itself (script_runner.h marks them, so that `self.h = a;
// self.h = b` gives two versions), and every slot at forward boundaries it can see (a
// tensor never seen before, and the end of capture). A slot that holds another tensor than
// the last one seen is a kReassign version whose producer is that tensor's.
//
// NOTE [Constants]
// A tensor from outside the capture that is not a model input (a plain tensor attribute,
// a TorchScript constant, a tensor a C++ forward made without dispatching) gets a source
// node of its own, kind "constant", when first read, named by its attribute address when
// the model layout knows it. A parameter returned as a model output gets one too. Neither
// has versions: constants are not model state.
//

#ifndef TORCHLENS_DISPATCH_RECORDER_H_
#define TORCHLENS_DISPATCH_RECORDER_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "graph/capture_record.h"
#include "graph/layer_numbering.h"
#include "torchlens_dispatch/buffer_journal.h"
#include "torchlens_dispatch/capture_options.h"
#include "torchlens_dispatch/model_layout.h"
#include "torchlens_dispatch/op_placement.h"
#include "torchlens_dispatch/ops/fused_mutators.h"
#include "torchlens_dispatch/parameter_state.h"
#include "torchlens_dispatch/record_appender.h"
#include "torchlens_dispatch/save_policy.h"
#include "torchlens_dispatch/saved_value_index.h"

namespace torchlens {

class Recorder : private BufferJournal::Tensors {
 public:
  Recorder(std::shared_ptr<const ModelLayout> layout, bool training, CaptureOptions options);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // The recorder capturing on this thread, or nullptr.
  static Recorder* Current();
  // Makes `recorder` (or nullptr) this thread's current recorder.
  static void SetCurrent(Recorder* recorder);

  // A streaming capture calls `hook` with each parameter just before the model first
  // writes it (NOTE [Parameters written through views]). Set before the forward.
  void SetBeforeParameterWrite(std::function<void(const at::Tensor&)> hook) {
    params_.SetBeforeWrite(std::move(hook));
  }

  // CaptureOptions::save_grads: `hooks` see every value recorded (gradient_hooks.h). Set
  // before the forward.
  void SetGradientHooks(GradientHooks* hooks) { record_.SetGradientHooks(hooks); }

  // Called by the fallback for every dispatched call on this thread.
  void OnOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
  // Called by the write watch before a nested call that declares a written argument runs
  // (NOTE [Watching nested writes] in write_watch.h).
  void OnNestedWrite(const c10::OperatorHandle& op, torch::jit::Stack* stack);

  // Registers the tensors in `inputs` as the model inputs, in order. Tensors first seen
  // later that come from outside the capture are then constants rather than inputs.
  void MarkInputs(const c10::IValue& inputs);

  // Ends recording: adds output nodes for the tensors in `outputs`, checks the buffers for
  // reassignments and unjournaled changes, and hands over the record.
  absl::StatusOr<CaptureRecord> Finish(const c10::IValue& outputs);
  // Ends recording after the forward pass raised (in an op or between ops): the record of
  // what ran until then, without outputs, marked partial with `reason` ("{label}" stands
  // for the last node's label). Buffer changes no version explains become diagnostics. A
  // capture that failed on its own (NOTE [Capture failures]) or halted has no such record.
  absl::StatusOr<CaptureRecord> FinishAfterForwardError(std::string reason);

  // Called right after TorchScript code assigned a tensor attribute (NOTE [Buffer
  // reassignment]).
  void OnAttributeAssigned();

  // Eager models (eager_scope.h): the call of the module with this identity opens, and
  // the innermost open call closes (OpPlacement::EnterModule).
  bool EnterModule(const void* module) { return placement_.EnterModule(module); }
  void ExitModule() { placement_.ExitModule(); }
  // Eager models: the buffer `name` of module `module` now holds `tensor`.
  void OnBufferAssigned(const void* module, const std::string& name, const at::Tensor& tensor);

  // Whether the forward was stopped by CaptureOptions::halt_after or stop_at_non_finite (it
  // threw CaptureHalted).
  bool halted() const { return progress_.halted; }
  const CaptureOptions& options() const { return options_; }

 private:
  // Runs the recorder's own tensor operations (clones, comparisons, detach) without
  // capturing them.
  using NoCapture = c10::impl::ExcludeDispatchKeyGuard;

  // Facts about one operator, computed on its first call in this capture.
  struct OpInfo {
    int32_t index = 0;  // into record_.operators
    uint32_t num_arguments = 0;
    uint32_t num_returns = 0;
    absl::InlinedVector<uint32_t, 2> written_arguments;  // alias_info()->isWrite()
    const FusedMutator* fused = nullptr;
    c10::Symbol symbol;  // for matching marked sites
    // Consumes randomness: tagged nondeterministic_seeded or takes a Generator.
    bool random = false;
    // A return aliases an argument (select, view, transpose), or `set_`, whose self takes
    // the source's storage.
    bool returns_view = false;
    // Changes only the sizes, strides or offset of the argument it declares written
    // (NOTE [In-place view ops]).
    bool inplace_view = false;
    bool nested_watched = false;  // WriteWatchCovers(op)
    bool uninitialized = false;   // returns memory it never wrote (aten::empty)
    std::string type;             // "add", as labels name it (OpTypeName)
    int32_t type_id = -1;         // SavePolicy::TypeId
  };
  struct TensorEntry {
    int32_t node = -1;  // producing node; -1: a parameter, or a buffer not yet read
    int32_t output_index = 0;
    int32_t slot = -1;            // saved current value; -1 when not saved (yet)
    int32_t param = -1;           // a parameter
    int32_t buffer = -1;          // this TensorImpl is the registered buffer now
    int32_t former_buffer = -1;   // was it, unread (NOTE [Former registered tensors])
    int32_t buffer_view = -1;     // made without dispatch in the place of this buffer
    bool aliases_buffer = false;  // its storage overlaps a buffer's storage
    // When no saved value holds the TensorImpl: NOTE [Address reuse in unsaved mode].
    c10::VariableVersion version{c10::VariableVersion::DISABLED};
    std::optional<WeakImpl> alive;
  };
  // A saved value and the live tensor it was saved from (a detached alias when that one
  // requires grad).
  const OpInfo& Info(const c10::OperatorHandle& op);
  struct PreparedOp {
    bool touches_buffer = false;
    bool observe_nested = false;
    bool nested_watched = false;  // observed through the write watch, not the capture key
    bool save = false;            // keep its values (NOTE [Selective saving])
    bool halt_before = false;     // CaptureOptions::halt_after: stop before it runs
    bool halt_after = false;      // and after it ran
    // A view op's tensor arguments, when its values are not saved (see IndexAliases).
    absl::InlinedVector<at::Tensor, 1> view_bases;
    int32_t owner_module = -1;
    int32_t op_index = 0;
    uint32_t num_returns = 0;
    bool uninitialized = false;  // OpInfo::uninitialized
    c10::Symbol symbol;
  };
  void OnUserOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
  // Before the call: argument sources, saved arguments, copy-on-write, pending writes.
  PreparedOp Prepare(const c10::OperatorHandle& op, torch::jit::Stack* stack, NodeRecord* node);
  // After the call: the op node, its outputs, and the buffer versions it wrote; the node.
  int32_t Record(NodeRecord node, const PreparedOp& prepared, torch::jit::Stack* stack);
  void Abandon(const std::exception& e);
  void OnNestedOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack);
  // The writes a nested call declares, before it runs (NOTE [Buffer writes]).
  void PrepareNestedWrites(const OpInfo& info, const torch::jit::Stack& stack);

  // Resolves one tensor argument to its source, creating input or buffer read nodes.
  SourceRecord Resolve(const at::Tensor& tensor, bool* touches_buffer, int32_t* owner_module);
  TensorEntry* Lookup(const c10::TensorImpl* impl);
  // Lookup, or with `pinned` (the address cannot have gone to another tensor: a saved
  // value or a weak reference holds it) the entry as it is, without reading the
  // TensorImpl, which may be dead (NOTE [Dead views are written too]).
  TensorEntry* Find(const c10::TensorImpl* impl, bool pinned);
  // Whether `entry`, found at `impl`'s address, belongs to a dead tensor whose address
  // `impl` reuses (NOTE [Address reuse in unsaved mode]).
  bool Stale(const TensorEntry& entry, const c10::TensorImpl* impl) const;
  // The entry of a tensor first seen now: a parameter (from the layout) or from outside.
  // Valid until the next call (a parameter's entry in unsaved mode is not kept).
  TensorEntry* AddUnseen(const at::Tensor& tensor);
  // NOTE [Parameters read by reference]: parameter `param`, read so far by reference, as
  // a saved value with a table entry from now on; its entry.
  TensorEntry* KeepParameter(int32_t param);
  // Before a write of `tensor`: KeepParameter for each parameter read so far from its
  // storage.
  void KeepWrittenParameters(const at::Tensor& tensor);
  TensorEntry* AddShallowCopy(const at::Tensor& tensor);
  int32_t AddInputNode(const at::Tensor& tensor);
  void RecordOpOutput(int32_t node, int32_t output_index, const at::Tensor& tensor,
                      bool touches_buffer, bool save);
  // Which op this is (module, layer) and what the capture does with it (NOTE [Selective
  // saving], early stop, the memory budget); part of Prepare.
  void Identify(const OpInfo& info, NodeRecord* node, PreparedOp* prepared);
  // Stops the forward (CaptureOptions::halt_after, stop_at_non_finite) after node `node`:
  // restores the buffers, records `reason` ("{label}" stands for the node's label) and
  // throws CaptureHalted.
  [[noreturn]] void Halt(int32_t node, std::string reason);
  // Whether a floating tensor among the op's returns holds NaN or Inf.
  static bool ReturnsNonFinite(c10::ArrayRef<c10::IValue> returns);
  // A new slot for `tensor`, registered for copy-on-write as the saved value of `live`
  // (the tensor itself by default; see SavedValue).
  int32_t Save(const at::Tensor& tensor, const c10::TensorImpl* live = nullptr);
  // Save's part in a streaming capture: a slot with no value, indexed as a saved value.
  int32_t SaveStreamed(const at::Tensor& tensor, const c10::TensorImpl* live);
  void Remember(const at::Tensor& tensor, TensorEntry entry);
  // What tells a later lookup whether `tensor` is still the one at its address, for an
  // entry that is neither a parameter nor a buffer (NOTE [Address reuse in unsaved mode],
  // NOTE [Streaming identity]).
  void Pin(const at::Tensor& tensor, TensorEntry* entry);
  // Whether no saved value can share `tensor`'s bytes without the tensor table knowing
  // `tensor` (NOTE [Writes into memory no saved value shares]).
  bool AloneOnUnknownStorage(const at::Tensor& tensor) const;
  // Whether `tensor` shares its storage with a registered buffer.
  bool AliasesBuffer(const at::Tensor& tensor) const {
    return tensor.has_storage() &&
           journal_.BuffersIn(tensor.storage().unsafeGetStorageImpl()) != nullptr;
  }

  // Before `tensor` (tensor argument `written_tensor` of the op, -1 for a nested write) is
  // written: copy-on-write, and note the saved values and buffers it hits.
  void PrepareWrite(const at::Tensor& tensor, WriteKind kind, int32_t written_tensor);
  // Before an in-place view op gives `tensor` another geometry: NOTE [In-place view ops].
  void PrepareInplaceView(const at::Tensor& tensor, int32_t written_tensor);
  // After op `writer` ran: the alias writes of the values it overwrote (NOTE [Writes
  // through views]).
  void RecordAliasWrites(int32_t writer);
  // The source node of a tensor from outside the capture (NOTE [Constants]).
  int32_t AddConstantNode(const at::Tensor& tensor, std::string address);
  // Before a write through a view of parameter `param`, whose saved value (if any) is in
  // `slot`, already copied: the parameter's source node (NOTE [Parameters written through
  // views]).
  int32_t AddWrittenParameterNode(int32_t param, int32_t slot);
  // PrepareWrite's part for a streaming capture's parameter living in `storage`.
  void PrepareStreamedParameterWrite(const at::Tensor& tensor, int32_t written_tensor,
                                     StorageEntry* storage);
  // `tensor`, first seen, has exactly `buffer`'s place in its storage: it reads and writes
  // the buffer (NOTE [Buffer writes]).
  TensorEntry* RememberInPlaceOf(const at::Tensor& tensor, int32_t buffer);
  // The index of a constant's address in CaptureRecord::constant_addresses; -1 for "".
  int32_t ConstantAddress(std::string address);

  // BufferJournal::Tensors
  SourceRecord SourceOf(const at::Tensor& tensor) override;
  void SetBuffer(const at::Tensor& tensor, int32_t buffer) override;
  void SetFormerBuffer(const at::Tensor& tensor, int32_t buffer, int32_t version) override;
  // A former registered tensor's first use gets its buffer's initial read version.
  void ReadFormerBuffer(TensorEntry* entry);
  // The tensor's value is buffer version node `version`'s (its only output).
  void ProducedBy(TensorEntry* entry, int32_t version);

  // The steps of Finish. CopySavedValuesOfModelState also copies the values saved in
  // `restored` (storages a halt is about to write back).
  void CopySavedValuesOfModelState(c10::ArrayRef<const c10::StorageImpl*> restored = {});
  void AddOutputNodes(const c10::IValue& outputs);
  void StoreSizes();

  std::shared_ptr<const ModelLayout> layout_;
  CaptureOptions options_;
  RecordAppender record_;
  OpPlacement placement_;
  SavePolicy policy_;  // reads options_ and layout_

  // NOTE [Capture failures]
  // Two things end a capture early. An exception from the model's forward pass propagates
  // unchanged to the caller, and Finish reports kAborted. A failure of the capture's own
  // work (out of memory while saving a value) must not change what the model computes:
  // the recorder becomes inert (ops just run) and Finish reports kResourceExhausted with
  // no trace, rather than a half-built trace presented as whole.
  struct Progress {
    int depth = 0;  // NOTE [User-level and nested ops]
    bool inputs_marked = false;
    bool finished = false;
    bool halted = false;  // by CaptureOptions::halt_after or stop_at_non_finite
    bool inert = false;   // the capture failed or halted: ops just run
    absl::Status failure;
  };
  Progress progress_;

  absl::flat_hash_map<const void*, OpInfo> op_infos_;  // keyed by &op.schema()
  absl::flat_hash_map<const c10::TensorImpl*, TensorEntry> tensors_;
  TensorEntry unsaved_param_;  // what AddUnseen returns for a parameter read by reference
  ParameterState params_;
  SavedValueIndex index_;
  // Plain tensor attributes of the model (NOTE [Constants]): index into
  // record_.constant_addresses.
  absl::flat_hash_map<const c10::TensorImpl*, int32_t> attributes_;

  // Last: its constructor registers the buffers' tensors in the tables above.
  BufferJournal journal_;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_RECORDER_H_
