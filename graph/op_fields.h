// The fields of `Op` that trace files and JSON carry, listed once.
//
// NOTE [One Op field table]
// `VisitOpFields(op, visitor)` calls `visitor(name, member, field)` for every field a trace
// file holds, in file order. The trace file writer and reader (trace_file_save.cc,
// trace_file_load.cc) and the JSON writer (json_export.cc) are visitors over it, and
// `OpFieldNames` lists it for the Python checker (tools/op_fields.cc prints it for
// tools/check_trace_file.py). A field
// added here reaches every format; one added to `Op` but not here reaches none, which
// suits state the trace rebuilds on load:
//   * `kind`, from `type` and `is_buffer` (`OpKindOf`);
//   * `parent_indices`, `child_indices` and each argument source's `node`, from the labels
//     (`Trace::Assemble`).
// A visitor handles each member type the table uses: strings, int, int64_t, bool, string
// lists, `at::DimVector`, `std::optional<WriteKind>`, `std::optional<bool>`, tensors,
// tensor lists (shared and plain), argument lists, `ArgSource` and `AliasWrite` lists, and the
// shared `SourcePosition` (null or a dict).
#ifndef TORCHLENS_GRAPH_OP_FIELDS_H_
#define TORCHLENS_GRAPH_OP_FIELDS_H_

#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"
#include "graph/trace.h"

namespace torchlens {

// What a format does with a field beyond writing it.
struct OpField {
  // Saved values (tensors, arguments): trace files hold them, JSON (metadata only) does not.
  bool saved_value = false;
  // The first trace file version that holds the field; readers of older files leave the
  // member as `Op` initializes it.
  int since_version = 1;
};

inline constexpr OpField kMetadata{};
inline constexpr OpField kSavedValue{/*saved_value=*/true};
inline constexpr OpField kMetadataSince2{/*saved_value=*/false, /*since_version=*/2};
inline constexpr OpField kMetadataSince3{/*saved_value=*/false, /*since_version=*/3};
inline constexpr OpField kMetadataSince4{/*saved_value=*/false, /*since_version=*/4};
inline constexpr OpField kSavedValueSince4{/*saved_value=*/true, /*since_version=*/4};

// `OpT` is `Op` (readers fill it) or `const Op` (writers read it).
template <typename OpT, typename Visitor>
void VisitOpFields(OpT& op, Visitor&& visit) {
  static_assert(std::is_same_v<std::remove_const_t<OpT>, Op>);
  visit("label", op.label, kMetadata);
  visit("type", op.type, kMetadata);
  visit("func_name", op.func_name, kMetadata);
  visit("overload_name", op.overload_name, kMetadata);
  visit("parents", op.parents, kMetadata);
  visit("children", op.children, kMetadata);
  visit("module_address", op.module_address, kMetadata);
  visit("out", op.out, kSavedValue);
  visit("is_buffer", op.is_buffer, kMetadata);
  visit("address", op.address, kMetadata);
  visit("buffer_pass", op.buffer_pass, kMetadata);
  visit("buffer_write_kind", op.buffer_write_kind, kMetadata);
  visit("buffer_value_changed", op.buffer_value_changed, kMetadata);
  visit("pass", op.pass, kMetadata);
  visit("layer_type_index", op.layer_type_index, kMetadata);
  visit("layer_step_index", op.layer_step_index, kMetadata);
  visit("tensor_shape", op.tensor_shape, kMetadata);
  visit("tensor_dtype", op.tensor_dtype, kMetadata);
  visit("parent_params", op.parent_params, kMetadata);
  visit("outs", op.outs, kSavedValue);
  visit("creation_args", op.creation_args, kSavedValue);
  visit("arg_sources", op.arg_sources, kMetadata);
  visit("rng_state", op.rng_state, kSavedValue);
  visit("alias_writes", op.alias_writes, kMetadataSince2);
  visit("start_ns", op.start_ns, kMetadataSince2);
  visit("duration_ns", op.duration_ns, kMetadataSince2);
  visit("source_position", op.source_position, kMetadataSince3);
  visit("forward_label", op.forward_label, kMetadataSince4);
  visit("grad", op.grad, kSavedValueSince4);
  visit("grads", op.grads, kSavedValueSince4);
}

// The table's field names, in order; `saved_values` false leaves out the saved-value
// fields (the names a JSON op holds).
std::vector<absl::string_view> OpFieldNames(bool saved_values);

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_OP_FIELDS_H_
