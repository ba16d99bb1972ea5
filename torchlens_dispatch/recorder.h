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
// with the key kept, and each nested call that writes an argument is checked against the
// buffers' storages (NOTE [Buffer writes]).
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
// makes without dispatching) must not inherit the dead tensor's producer. An entry pins
// the tensor's version counter: a small object that every new tensor allocates, shared
// only by views and detached aliases of the same data, so a different counter at a known
// address means a different tensor. Pinning it, not the TensorImpl (a weak reference),
// lets the allocator hand the hot TensorImpl memory to the next op's output; on
// mlp2000 that is 0.3 us per op (README "Benchmark"). Tensors without a counter
// (created under InferenceMode) keep a weak reference instead.
//
// NOTE [Copy-on-write of saved values]
// Saved values are kept by reference (no copy). Before any write the capture sees (an
// annotated in-place argument at any depth, or a fused mutator's state argument), every
// saved value living in the written storage is replaced by a clone. Storages are indexed,
// so this costs one hash lookup per written tensor, never a scan.
//
// NOTE [Writes through views]
// `pad[:, :3].copy_(img)` writes the tensor `pad` through a view. The copy-on-write keeps
// `pad`'s saved value from before the write; after it, `pad` is produced by the writer, as
// output -1 ("the base the op wrote through a view", not one of its outputs), and its new
// value is saved by reference again. Validation does not compare such an argument with
// the writer's outputs, and an intervention does not recompute it (README "Limitations").
//
// NOTE [Buffer writes]
// A write is attributed to a registered buffer by StorageImpl identity, then by byte range
// (views and slices included). All writes to one buffer during one user-level op make a
// single version: kFused when the op is a fused mutator (NOTE [Fused buffer writes]) or the
// write happened inside the kernel without the user-level op declaring it, kInplace when
// the user-level op's schema declares the write.
//
// NOTE [Buffer reassignment]
// `self.h = t` in TorchScript is a prim::SetAttr: no op is dispatched. The capture reads
// the attribute slots of the buffers that some method's code assigns (usually none or a
// few recurrent states) before each user-level op, and every slot at forward boundaries it
// can see (a tensor never seen before, and the end of capture). A slot that holds another
// tensor than the last one seen is a kReassign version whose producer is that tensor's.
#ifndef TORCHLENS_DISPATCH_RECORDER_H_
#define TORCHLENS_DISPATCH_RECORDER_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "graph/capture_record.h"
#include "graph/fused_mutators.h"
#include "torchlens_dispatch/capture_options.h"
#include "torchlens_dispatch/model_layout.h"
#include "torchlens_dispatch/script_sites.h"

namespace torchlens {

class Recorder {
 public:
  Recorder(std::shared_ptr<const ModelLayout> layout, bool training, CaptureOptions options);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // The recorder capturing on this thread, or nullptr.
  static Recorder* Current();
  // Makes `recorder` (or nullptr) this thread's current recorder.
  static void SetCurrent(Recorder* recorder);

  // Called by the fallback for every dispatched call on this thread.
  void OnOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

  // Registers the tensors in `inputs` as the model inputs, in order. Tensors first seen
  // later that come from outside the capture are then constants rather than inputs.
  void MarkInputs(const c10::IValue& inputs);

  // Ends recording: adds output nodes for the tensors in `outputs`, checks the buffers for
  // reassignments and unjournaled changes, and hands over the record.
  absl::StatusOr<CaptureRecord> Finish(const c10::IValue& outputs);

 private:
  // Facts about one operator, computed on its first call in this capture.
  struct OpInfo {
    int32_t index = 0;  // into record_.operators
    uint32_t num_arguments = 0;
    uint32_t num_returns = 0;
    absl::InlinedVector<uint32_t, 2> written_arguments;  // alias_info()->isWrite()
    const FusedMutator* fused = nullptr;
    c10::Symbol symbol;  // for matching marked sites
    bool random =
        false;  // consumes randomness: tagged nondeterministic_seeded or takes a Generator
  };
  struct TensorEntry {
    int32_t node = -1;  // producing node; -1: a parameter, or a buffer not yet read
    int32_t output_index = 0;
    int32_t slot = -1;            // saved current value; -1 when not saved (yet)
    int32_t param = -1;           // a parameter
    int32_t buffer = -1;          // this TensorImpl is the registered buffer now
    bool aliases_buffer = false;  // its storage overlaps a buffer's storage
    // Unsaved mode only: see NOTE [Address reuse in unsaved mode].
    c10::VariableVersion version{c10::VariableVersion::DISABLED};
    std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> alive;
  };
  struct StorageEntry {
    absl::InlinedVector<int32_t, 1> buffers;      // buffers living in this storage
    absl::InlinedVector<int32_t, 2> saved_slots;  // saved values living in this storage
    // The live tensors whose saved values were just copied (NOTE [Writes through views]).
    std::vector<at::Tensor> written;
  };
  struct BufferState {
    const ModelLayout::BufferEntry* entry;   // in layout_
    at::Tensor holder;                       // the registered tensor as last seen
    std::vector<at::Tensor> former_holders;  // kept alive: see NOTE [Tensor identity]
    int64_t begin_byte = 0, end_byte = 0;    // range of `holder` in its storage
    int32_t last_version = -1;               // latest version node
    // Copy of the latest version's value (the initial value until the first write):
    // buffer versions are snapshots, compared against to see fused writes change a value
    // and unjournaled changes at the end.
    at::Tensor latest;
  };
  struct PendingWrite {
    int32_t buffer;
    WriteKind kind;
  };

  const OpInfo& Info(const c10::OperatorHandle& op);
  struct PreparedOp {
    bool touches_buffer = false;
    bool observe_nested = false;
    int32_t owner_module = -1;
    int32_t op_index = 0;
    uint32_t num_returns = 0;
    c10::Symbol symbol;
    absl::InlinedVector<at::Tensor, 1> written;  // annotated written arguments
  };
  void OnUserOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
  // Before the call: argument sources, saved arguments, copy-on-write, pending writes.
  PreparedOp Prepare(const c10::OperatorHandle& op, torch::jit::Stack* stack, NodeRecord* node);
  // After the call: the op node, its outputs, and the buffer versions it wrote.
  void Record(NodeRecord node, const PreparedOp& prepared, torch::jit::Stack* stack);
  void Abandon(const std::exception& e);
  void OnNestedOp(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack);

  // Resolves one tensor argument to its source, creating input or buffer read nodes.
  SourceRecord Resolve(const at::Tensor& tensor, bool* touches_buffer, int32_t* owner_module);
  TensorEntry* Lookup(const c10::TensorImpl* impl);
  // The entry of a tensor first seen now: a parameter (from the layout) or from outside.
  // Valid until the next call (a parameter's entry in unsaved mode is not kept).
  TensorEntry* AddUnseen(const at::Tensor& tensor);
  // The parameter id of `impl`, or -1 (ModelLayout::param_order, then param_ids).
  int32_t ParamId(const c10::TensorImpl* impl);
  TensorEntry* AddShallowCopy(const at::Tensor& tensor);
  int32_t AddInputNode(const at::Tensor& tensor);
  int32_t EnsureBufferVersion(int32_t buffer);  // the read version if none exists yet
  void AddOutput(const at::Tensor& tensor, int32_t slot);
  void RecordOpOutput(int32_t node, int32_t output_index, const at::Tensor& tensor,
                      bool touches_buffer);
  int32_t Save(const at::Tensor& tensor);            // a new slot (copy-on-write registered)
  int32_t SaveSnapshot(const at::Tensor& snapshot);  // a new slot for a private copy
  void Remember(const at::Tensor& tensor, TensorEntry entry);

  // Before `tensor` is written: copy-on-write, and note the buffers it hits.
  void PrepareWrite(const at::Tensor& tensor, WriteKind kind);
  void AddPendingWrite(int32_t buffer, WriteKind kind);
  void CommitPendingWrites(int32_t producer);
  // After op `writer` wrote `tensor`: other tensors on its storage now hold what the write
  // made of them. See NOTE [Writes through views].
  void UpdateAliasesOfWrite(int32_t writer, const at::Tensor& tensor);
  int32_t AddBufferVersion(int32_t buffer, std::optional<WriteKind> kind, int32_t producer,
                           int32_t producer_output, at::Tensor snapshot,
                           std::optional<bool> changed);

  void CheckAssignedBuffers();
  void CheckAllBuffers();
  void OnReassign(int32_t buffer, const at::Tensor& tensor);
  void SetHolder(int32_t buffer, const at::Tensor& tensor);

  int32_t LayerOf(int32_t module, int32_t op_index, const ScriptSite& site);
  // Whether module `inner` is a descendant of module `outer` (both model modules).
  bool IsWithin(int32_t inner, int32_t outer);

  std::shared_ptr<const ModelLayout> layout_;
  CaptureOptions options_;
  CaptureRecord record_;
  ModuleAddresses module_addresses_;
  ScriptSites script_sites_;

  int depth_ = 0;
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
  TensorEntry unsaved_param_;  // what AddUnseen returns for a parameter in unsaved mode
  size_t next_param_ = 0;      // in layout_->param_order: the parameter expected next
  absl::flat_hash_map<const c10::StorageImpl*, StorageEntry> storages_;
  std::vector<BufferState> buffers_;
  std::vector<int32_t> assigned_buffers_;  // buffers whose slot code may reassign
  absl::InlinedVector<PendingWrite, 4> pending_writes_;
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
};

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_RECORDER_H_
