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
// reference, as the saved value would); the name of this note is older than that rule. An
// entry pins
// the tensor's version counter: a small object that every new tensor allocates, shared
// only by views and detached aliases of the same data, so a different counter at a known
// address means a different tensor. Pinning it, not the TensorImpl (a weak reference),
// lets the allocator hand the hot TensorImpl memory to the next op's output, which is
// still in cache (README "Performance"). Tensors without a counter
// (created under InferenceMode) keep a weak reference instead.
//
// NOTE [Copy-on-write of saved values]
// Saved values are kept by reference (no copy). Before any write the capture sees (an
// annotated in-place argument at any depth, or a fused mutator's state argument), every
// saved value living in the written storage is replaced by a clone. Storages are indexed,
// so this costs one hash lookup per written tensor, never a scan. A saved value that is
// the written tensor itself is cloned even when it has no bytes to overlap: an out=
// destination of zero elements (`torch.empty(0)`) is resized by the write, and the saved
// value would otherwise take the new shape.
//
// NOTE [Saved values indexed when a write needs them]
// The storage index of NOTE [Copy-on-write of saved values] is read only before a write
// (and at the end), so Save only appends the value to a list; the values are added to
// the index when something reads it. A model that writes nothing in place never builds
// it; one with in-place ops moves the values saved since the last write into it at each
// write, which is the work that indexing them one by one did. Built eagerly, an index of
// mlp2000's 4,000 values (a table in memory the forward has evicted) cost a cache miss
// per saved value (README "Performance"). Every saved value keeps its storage alive, so
// a listed storage's address stays its own until the value is indexed.
//
// NOTE [Writes into memory no saved value shares]
// Most nested writes fill the tensor their kernel has just made (addmm copies the bias
// into its result before the product), so indexing the values saved since the last write
// at each of them cost recurrent100 a hash insert per saved value and step. A saved value
// holds a TensorImpl: either the written tensor itself, which the tensor table then knows
// (its slot pins it, so its entry is not stale), or another TensorImpl on the same
// storage, which then has more than one holder. So a write to a tensor the table does not
// know, alone on its storage, shares no byte with an unindexed value, and leaves the list
// as it is; the storage index is still read for what it already holds (dead views).
//
// NOTE [Writes through views]
// `pad[:, :3].copy_(img)` writes the tensor `pad` through a view, and `x.mul_(2)` writes
// every view of `x` taken before. Before an op writes a tensor, every saved value whose
// bytes overlap it (found through the storage index, one lookup) is copied (NOTE
// [Copy-on-write of saved values]) and noted. After the op, each noted tensor that is
// still alive and is not one of the op's outputs becomes an alias write of the op
// (`AliasWrite` in graph/trace.h): its producer is now the writer, as output -(k + 1),
// with its value after the write saved by reference again, and the write remembers the
// tensor's earlier source and both geometries so that replay can redo it (NOTE [Writes
// through aliases] in validation/replay.h). Saved values are indexed by storage anyway; a
// view op whose values are not saved (every op without saved values, the ops a selective
// capture does not select, those after a budget ran out) indexes instead the tensors it
// returns and the arguments they alias (only view ops pay for it), so its edges follow
// the same writes.
//
// NOTE [Dead views are written too]
// A saved value keeps the tensor it came from alive, so a temporary view (`x[1:]` in
// `x[1:].select(0, 0).mul_(2)`) gets an alias write of the later write even after the
// program dropped it, and the write's parents include the view's producer. A trace must
// have the same edges whatever it saves (a selective capture, one over its budget,
// streaming to a sink), so the alias index of unsaved views keeps dead tensors too:
// weakly, so that neither their data nor their storage's data is kept, while the
// addresses of the TensorImpl and of the StorageImpl stay pinned until the capture ends
// and no new tensor can be mistaken for them. (VerdictsTest.EdgesAreTheSameWhatever-
// TheCaptureSaves compares the edges of every issue model across these captures.)
//
// NOTE [Aliases change place]
// An in-place op can move a tensor to another storage (`set_`), shrink or grow it
// (`resize_`) or give it new strides (`as_strided_`): after it, the bytes it held are no
// longer its bytes, and a write through a view of its old bytes must not reach it. A saved
// value follows, as the write copies it out of the storage index and the op's output is
// saved again where it now lives. The alias index of unsaved views does the same: a write
// takes the written tensor out of its storage's list, and after the op (or its throw) the
// tensor is indexed again with the storage and bytes it has then (IndexMovedAliases). A
// tensor that dies later keeps the bytes it had last, which are the right ones.
// (VerdictsTest's model regeometry_after_view does all three, alive and dead.)
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
// (its shape) gets a kInplace version, the op's output. Before 2026-12-06 these ops were
// writes of their bytes: the next write through the view then redid its value in the
// geometry from before the op, and validation failed (testdata inplace_view_ops).
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
// NOTE [Parameters read by reference]
// A parameter's value is the model's, read through its detached alias
// (ModelLayout::param_values), so a saving capture keeps nothing per parameter read: the
// source names the parameter, no slot, no tensor-table entry, and the trace's arguments
// take the layout's alias (CaptureRecord::param_values). A slot and a table entry per
// parameter cost mlp2000 (4,000 parameters read once each) a tenth of its capture: a cold
// reference count, a table twice the size of its op outputs, and their release with the
// trace (README "Performance"). A parameter becomes an ordinary saved value only when the
// forward writes the storage it lives in, which is rare (a weight clamped in `forward`, a
// bias entry set through a view): before the write, each parameter read so far from that
// storage is saved and entered in the table (KeepParameter), so that the write copies its
// value first as it copies any saved value (NOTE [Copy-on-write of saved values]), and
// CaptureRecord::param_slots gives the reads before it that copy. A parameter first read
// after its storage was written is kept the same way, its values copied at the end as the
// model may write it again (NOTE [Parameters written through views]). Deciding costs a
// write one look at its storage's holders: a storage with one holder is no parameter's
// when every parameter's value is a detached alias (its second holder); otherwise one
// lookup in ModelLayout::param_storages. Streaming captures read parameters as themselves
// already (below), and captures without saved values keep no parameter value.
//
// NOTE [Parameters restored after a halt]
// A halted forward leaves the model as it was (CaptureOptions::halt_after): its buffers
// through the journal, and the parameters the forward wrote in place (a weight clamped or
// normalised in the forward) through a copy of each, taken before its first write. Only
// captures that may halt keep them, and only for written parameters.
//
// NOTE [Parameters written through views]
// A parameter is read as itself (a "param" source) until something writes it. An
// in-place op that returns it (`w.mul_(0.5)`) makes it that op's output, as for any
// tensor. A write through a view of it (`bias[0] = 1.0`, `w.narrow(0, 0, 2).zero_()`)
// returns the view, so before the write the parameter gets a constant source node holding
// its value before the write, named by its address (as a returned parameter's, NOTE
// [Constants]); the write is then an alias write of that node (NOTE [Writes through
// views]), and later reads of the parameter resolve to the write's output. Its reads
// before the write keep the value they read, and the values saved in its storage are
// copied at the end, as a buffer's are: the model's next forward may write it again. A capture
// without saved values does the same, so the graph is the same either way. A streaming capture
// keeps no copy: its reads of a parameter name the parameter, which the sink's owner writes as it
// likes (the trace file writes parameters on its own thread), so the first write to a parameter
// calls SetBeforeParameterWrite's hook first, and the file keeps the value from before it.
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
#include "torchlens_dispatch/ops/fused_mutators.h"
#include "torchlens_dispatch/record_appender.h"
#include "torchlens_dispatch/script_sites.h"

namespace torchlens {

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

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
    before_parameter_write_ = std::move(hook);
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
  // the innermost open call closes. EnterModule returns false (and opens nothing) for a
  // module the model does not have.
  bool EnterModule(const void* module);
  void ExitModule();
  // Eager models: the buffer `name` of module `module` now holds `tensor`.
  void OnBufferAssigned(const void* module, const std::string& name, const at::Tensor& tensor);

  // Whether the forward was stopped by CaptureOptions::halt_after or stop_at_non_finite (it
  // threw CaptureHalted).
  bool halted() const { return halted_; }
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
    int32_t type_id = -1;         // in numbering_, when labels are computed while capturing
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
  struct SavedValue {
    int32_t slot;
    const c10::TensorImpl* tensor;
  };
  // A tensor sharing its storage with a view of it, whose values are not saved (NOTE
  // [Writes through views]). Held weakly: the index neither keeps its data alive nor lets
  // its address go to a new tensor, so a dead one still gets its alias writes, as a saved
  // value would (NOTE [Dead views are written too]).
  struct AliasedTensor {
    WeakImpl alive;
    int64_t begin_byte, end_byte;
  };
  struct StorageEntry {
    absl::InlinedVector<SavedValue, 2> saved;  // saved values living in this storage
    std::vector<AliasedTensor> aliased;        // of view ops whose values are not saved
    // A pin on the storage's address, when a streaming capture saved a value in it (NOTE
    // [Streaming identity]) or it holds aliased tensors (NOTE [Dead views are written too]).
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> pinned;
    // A streaming capture: the parameter living here, not yet written (NOTE [Parameters
    // written through views]); -1 otherwise.
    int32_t streamed_param = -1;
    // A parameter living here was written by the forward: values saved here are copied at
    // the end (CopySavedValuesOfModelState), as the model may write it again.
    bool written_param = false;
  };
  // A saved value the current op's write overlapped (NOTE [Writes through views]).
  struct OverwrittenValue {
    SavedValue saved;
    at::Tensor alias;        // shares the live tensor's storage and geometry
    int32_t written_tensor;  // which tensor argument the op wrote; -1: a nested write
    TensorGeometry written;
    int32_t node_before;    // the live tensor's producer before the write, or -1
    int32_t output_before;  // and which of its outputs (0 when none)
    at::Tensor held;        // without saved values: the tensor, alive until the write is recorded
    // Saved, or dead with its address pinned by the alias index: see Find.
    bool pinned = false;
  };
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
  // The parameter id of `impl`, or -1 (ModelLayout::param_order, then param_ids).
  int32_t ParamId(const c10::TensorImpl* impl);
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
  // A tensor over `storage` with the geometry of streamed slot `slot`: the value that slot
  // would hold, as a saved value aliasing the storage does.
  at::Tensor StreamedAlias(const c10::Storage& storage, int32_t slot) const;
  void Remember(const at::Tensor& tensor, TensorEntry entry);
  // What tells a later lookup whether `tensor` is still the one at its address, for an
  // entry that is neither a parameter nor a buffer (NOTE [Address reuse in unsaved mode],
  // NOTE [Streaming identity]).
  void Pin(const at::Tensor& tensor, TensorEntry* entry);
  // Adds unindexed_values_ to storages_; called before storages_ is read for saved values.
  void IndexSavedValues();
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
  // Without saved values: indexes a view op's output and the arguments it aliases.
  void IndexAliases(const at::Tensor& view, c10::ArrayRef<at::Tensor> bases);
  // Indexes one tensor of `storage`, whose entry `*entry` is found on first use.
  void IndexAlias(const at::Tensor& tensor, c10::StorageImpl* storage, StorageEntry** entry);
  // `tensor`, just taken out of its storage's alias list, is indexed again after the op
  // (once, whichever of its arguments it is).
  void NoteMovedAlias(const at::Tensor& tensor);
  // Indexes again, where they are now, the written tensors PrepareWrite and
  // PrepareInplaceView took out of the alias index (NOTE [Aliases change place]).
  void IndexMovedAliases();
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

  // Before a write of `tensor` when the forward may be halted: keeps the value of the
  // parameter it writes, the first time (NOTE [Parameters restored after a halt]).
  void KeepParameterBeforeHalt(const at::Tensor& tensor);
  // Halt's part: the parameters back to their values before the forward.
  void RestoreWrittenParameters();

  // The steps of Finish. CopySavedValuesOfModelState also copies the values saved in
  // `restored` (storages a halt is about to write back).
  void CopySavedValuesOfModelState(c10::ArrayRef<const c10::StorageImpl*> restored = {});
  void AddOutputNodes(const c10::IValue& outputs);
  void StoreSizes();

  int32_t LayerOf(int32_t module, int32_t op_index, const ScriptSite& site);
  // Eager models: the module of the op being identified, and its position in that
  // module's open call, as LayerOf takes them (NOTE [Layers and passes] in script_sites.h).
  ScriptSite EagerSite();
  // Whether module `inner` is a descendant of module `outer` (both model modules).
  bool IsWithin(int32_t inner, int32_t outer);

  std::shared_ptr<const ModelLayout> layout_;
  CaptureOptions options_;
  RecordAppender record_;
  ModuleAddresses module_addresses_;
  ScriptSites script_sites_;

  int depth_ = 0;
  // Eager models: the open module calls, innermost last, each with the number of ops run
  // in it so far (eager_scope.h).
  struct OpenCall {
    int32_t module;
    uint32_t ops;
  };
  std::vector<OpenCall> open_calls_;
  bool inputs_marked_ = false;
  bool finished_ = false;
  // NOTE [Capture failures]
  // Two things end a capture early. An exception from the model's forward pass propagates
  // unchanged to the caller, and Finish reports kAborted. A failure of the capture's own
  // work (out of memory while saving a value) must not change what the model computes:
  // the recorder becomes inert (ops just run) and Finish reports kResourceExhausted with
  // no trace, rather than a half-built trace presented as whole.
  absl::Status failure_;
  bool inert_ = false;

  absl::flat_hash_map<const void*, OpInfo> op_infos_;  // keyed by &op.schema()
  absl::flat_hash_map<const c10::TensorImpl*, TensorEntry> tensors_;
  TensorEntry unsaved_param_;  // what AddUnseen returns for a parameter read by reference
  // Per parameter id, in a saving capture that does not stream (NOTE [Parameters read by
  // reference]): kParamRead once read, kParamKept once KeepParameter saved it. Empty until
  // the first parameter read.
  static constexpr uint8_t kParamRead = 1, kParamKept = 2;
  std::vector<uint8_t> param_reads_;
  bool param_storage_written_ = false;  // KeepWrittenParameters found a parameter's storage
  std::function<void(const at::Tensor&)> before_parameter_write_;  // SetBeforeParameterWrite
  size_t next_param_ = 0;  // in layout_->param_order: the parameter expected next
  absl::flat_hash_map<const c10::StorageImpl*, StorageEntry> storages_;
  // Saved values not yet in storages_ (NOTE [Saved values indexed when a write needs them]).
  struct UnindexedValue {
    const c10::StorageImpl* storage;
    SavedValue saved;
  };
  std::vector<UnindexedValue> unindexed_values_;
  std::vector<OverwrittenValue> overwritten_;  // by the op being recorded
  // Indexed tensors the op being recorded writes, out of the index until it ran (NOTE
  // [Aliases change place]).
  std::vector<at::Tensor> moved_aliases_;
  // Plain tensor attributes of the model (NOTE [Constants]): index into
  // record_.constant_addresses.
  absl::flat_hash_map<const c10::TensorImpl*, int32_t> attributes_;
  // For the slots of op outputs: (node, output index). See NOTE [Shallow copies].
  std::vector<std::pair<int32_t, int32_t>> slot_producers_;

  struct LayerKey {
    int32_t module;
    int32_t op;
    uint64_t position;
    bool operator==(const LayerKey& other) const {
      return module == other.module && op == other.op && position == other.position;
    }
    template <typename H>
    friend H AbslHashValue(H h, const LayerKey& key) {
      return H::combine(std::move(h), key.module, key.op, key.position);
    }
  };
  absl::flat_hash_map<LayerKey, int32_t> layers_;
  std::vector<int32_t> layer_of_class_;  // by NOTE [Layer classes] number; -1: not run yet
  int32_t next_layer_ = 0;

  // NOTE [Streaming without saving]: a value sink and no saved values; set first (the
  // appender and the journal are told in the constructor).
  const bool streaming_ = false;
  const bool saves_ = false;  // save_activations or streaming_: values are kept or streamed
  // Per slot of a streaming capture, the geometry of the value streamed (NOTE [Streaming
  // identity]); empty otherwise.
  struct StreamedSlot {
    std::pair<int64_t, int64_t> bytes;
    TensorGeometry geometry;
    at::ScalarType dtype;
  };
  std::vector<StreamedSlot> streamed_slots_;
  // NOTE [Selective saving] and early stop.
  bool selective_ = false;                // some save_* option is set
  bool labels_needed_ = false;            // labels are computed while capturing
  std::string halt_label_;                // CaptureOptions::halt_after, when it is a label
  int32_t halt_module_ = -1;              // or a module (id), entered once ops ran in it
  std::vector<int32_t> save_module_ids_;  // CaptureOptions::save_modules, as module ids
  bool halt_module_entered_ = false;
  bool halted_ = false;
  // NOTE [Parameters restored after a halt]: when the forward may be halted, the
  // parameters' storages (filled on the first write) and each written parameter's value
  // from before its first write.
  bool may_halt_ = false;
  absl::flat_hash_map<const c10::StorageImpl*, int32_t> param_storages_;
  std::vector<std::pair<int32_t, at::Tensor>> params_before_writes_;
  LayerNumbering numbering_;
  int64_t saved_bytes_ = 0;  // of activations Save kept (CaptureOptions::max_saved_bytes)
  bool over_budget_ = false;
  // Last: its constructor registers the buffers' tensors in the tables above.
  BufferJournal journal_;
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_RECORDER_H_
