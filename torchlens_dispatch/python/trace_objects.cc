#include "torchlens_dispatch/python/trace_objects.h"

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/summary.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/python/exceptions.h"

namespace py = pybind11;

namespace torchlens {
namespace python {
namespace {

py::object WriteKindOrNone(const std::optional<WriteKind>& kind) {
  if (!kind.has_value()) return py::none();
  return py::str(std::string(WriteKindName(*kind)));
}

std::string Repr(const Op& op) {
  std::string repr = absl::StrCat("<Op ", op.label, " ", op.type);
  if (!op.tensor_shape.empty() || !op.tensor_dtype.empty()) {
    absl::StrAppend(&repr, " ", FormatShape(op.tensor_shape));
  }
  if (!op.module_address.empty()) absl::StrAppend(&repr, " in '", op.module_address, "'");
  return repr + ">";
}

}  // namespace

const Op& OpRef::op() const {
  if (!backward) return handle->trace.ops()[index];
  const std::vector<const Op*> ops = handle->trace.backward_ops();
  if (static_cast<size_t>(index) >= ops.size()) {
    Raise(Exceptions().error,
          "this backward op belongs to an earlier backward call; read trace.backward_ops "
          "again after each backward()");
  }
  return *ops[index];
}

std::vector<OpRef> OpRefs(const Handle& handle, const std::vector<const Op*>& ops) {
  std::vector<OpRef> refs;
  refs.reserve(ops.size());
  for (const Op* op : ops) refs.push_back(OpRef{handle, handle->trace.IndexOf(op)});
  return refs;
}

const Op& FindOrKeyError(const Trace& trace, const std::string& key) {
  absl::StatusOr<const Op*> found = trace.Find(key);
  if (!found.ok()) Raise(PyExc_KeyError, std::string(found.status().message()));
  return **found;
}

void BindTraceObjects(py::module_& m) {
  py::class_<OpRef>(m, "Op", "One node of a trace: an op, an input or output, or a buffer version.")
      .def_property_readonly("label", [](const OpRef& r) { return r.op().label; })
      .def_property_readonly("type", [](const OpRef& r) { return r.op().type; })
      .def_property_readonly("func_name", [](const OpRef& r) { return r.op().func_name; })
      .def_property_readonly("parents", [](const OpRef& r) { return r.op().parents; })
      .def_property_readonly("children", [](const OpRef& r) { return r.op().children; })
      .def_property_readonly("module_address", [](const OpRef& r) { return r.op().module_address; })
      .def_property_readonly(
          "out",
          [](const OpRef& r) {
            return r.handle->Hand(r.op().out, absl::StrCat("the value of ", r.op().label));
          },
          "The saved value (the first tensor output), or None when not saved.")
      .def_property_readonly(
          "outs",
          [](const OpRef& r) {
            py::list outs;
            for (const at::Tensor& out : r.op().outs) {
              outs.append(r.handle->Hand(out, absl::StrCat("an output of ", r.op().label)));
            }
            return outs;
          },
          "Every tensor output, in return order.")
      .def_property_readonly("is_buffer", [](const OpRef& r) { return r.op().is_buffer; })
      .def_property_readonly("address", [](const OpRef& r) { return r.op().address; })
      .def_property_readonly("buffer_pass", [](const OpRef& r) { return r.op().buffer_pass; })
      .def_property_readonly(
          "buffer_write_kind",
          [](const OpRef& r) { return WriteKindOrNone(r.op().buffer_write_kind); },
          "\"reassign\", \"inplace\" or \"fused\" for a buffer write; None for a read.")
      .def_property_readonly("buffer_value_changed",
                             [](const OpRef& r) -> py::object {
                               const std::optional<bool>& changed = r.op().buffer_value_changed;
                               if (!changed.has_value()) return py::none();
                               return py::bool_(*changed);
                             })
      .def_property_readonly("pass_num", [](const OpRef& r) { return r.op().pass; })
      .def_property_readonly("tensor_shape",
                             [](const OpRef& r) {
                               return std::vector<int64_t>(r.op().tensor_shape.begin(),
                                                           r.op().tensor_shape.end());
                             })
      .def_property_readonly("tensor_dtype", [](const OpRef& r) { return r.op().tensor_dtype; })
      .def_property_readonly("parent_params",
                             [](const OpRef& r) {
                               return std::vector<std::string>(r.op().parent_params.begin(),
                                                               r.op().parent_params.end());
                             })
      .def_property_readonly(
          "grad",
          [](const OpRef& r) {
            // Not remembered as shared: a gradient written in place is what
            // validate_gradients() exists to catch.
            NoCapture no_capture(kCaptureKey);
            return TensorOrNone(r.op().grad.defined() ? r.op().grad.detach() : at::Tensor());
          },
          "The gradient of the first output after the latest backward() that reached the "
          "trace (tl.trace(..., save_grads=True)), or None.")
      .def_property_readonly(
          "grads",
          [](const OpRef& r) {
            NoCapture no_capture(kCaptureKey);
            py::list grads;
            for (const at::Tensor& grad : r.op().grads) {
              grads.append(TensorOrNone(grad.defined() ? grad.detach() : at::Tensor()));
            }
            return grads;
          },
          "Every output's gradient (None where none reached it); empty when none did.")
      .def_property_readonly(
          "forward_label", [](const OpRef& r) { return r.op().forward_label; },
          "A backward op: the label of the forward node whose gradient it computes (for a "
          "parameter's accumulation, whose `address` names the parameter, the op that read "
          "it).")
      .def_property_readonly("is_backward", [](const OpRef& r) { return r.op().is_backward(); })
      .def_property_readonly("is_input", [](const OpRef& r) { return r.op().is_input(); })
      .def_property_readonly("is_output", [](const OpRef& r) { return r.op().is_output(); })
      .def("__repr__", [](const OpRef& r) { return Repr(r.op()); });

  py::class_<BufferRef>(m, "Buffer", "A registered buffer's state: its versions and values.")
      .def_property_readonly("address", [](const BufferRef& r) { return r.buffer->address; })
      .def_property_readonly("initial_value",
                             [](const BufferRef& r) {
                               return r.handle->Hand(r.buffer->initial_value,
                                                     absl::StrCat("the initial value of buffer '",
                                                                  r.buffer->address, "'"));
                             })
      .def_property_readonly("final_value",
                             [](const BufferRef& r) {
                               return r.handle->Hand(r.buffer->final_value,
                                                     absl::StrCat("the final value of buffer '",
                                                                  r.buffer->address, "'"));
                             })
      .def_property_readonly(
          "versions", [](const BufferRef& r) { return OpRefs(r.handle, r.buffer->versions); })
      .def_property_readonly("num_overwrites",
                             [](const BufferRef& r) { return r.buffer->num_overwrites; })
      .def_property_readonly("module_address",
                             [](const BufferRef& r) { return r.buffer->module_address; })
      .def_property_readonly("same_tensor_as",
                             [](const BufferRef& r) { return r.buffer->same_tensor_as; })
      .def_property_readonly("shares_storage_with",
                             [](const BufferRef& r) { return r.buffer->shares_storage_with; })
      .def(
          "value_at",
          [](const BufferRef& r, int n) {
            absl::StatusOr<at::Tensor> value = r.buffer->value_at(n);
            if (!value.ok()) Raise(PyExc_IndexError, std::string(value.status().message()));
            return r.handle->Hand(
                *value, absl::StrCat("version ", n, " of buffer '", r.buffer->address, "'"));
          },
          py::arg("n"), "The n-th observed version's value (1-based); IndexError outside.")
      .def(
          "value_after",
          [](const BufferRef& r, int n) {
            absl::StatusOr<at::Tensor> value = r.buffer->value_after(n);
            if (!value.ok()) Raise(PyExc_IndexError, std::string(value.status().message()));
            return r.handle->Hand(*value, absl::StrCat("the value after write ", n, " of buffer '",
                                                       r.buffer->address, "'"));
          },
          py::arg("n"), "The value after the n-th write (1-based); IndexError outside.")
      .def("__repr__", [](const BufferRef& r) {
        return absl::StrCat("<Buffer ", r.buffer->address, ": ", r.buffer->versions.size(),
                            " versions, ", r.buffer->num_overwrites, " overwrites>");
      });

  py::class_<Module>(m, "Module", "A module of the model: its type, buffers and parameters.")
      .def_readonly("address", &Module::address)
      .def_readonly("type_name", &Module::type_name)
      .def_readonly("buffers", &Module::buffers)
      .def_readonly("params", &Module::params)
      .def("__repr__", [](const Module& module) {
        return absl::StrCat("<Module '", module.address, "' ", module.type_name, ">");
      });

  py::class_<Param>(m, "Param", "A parameter of the model: its shape and module.")
      .def_readonly("address", &Param::address)
      .def_property_readonly("shape", [](const Param& p) { return py::tuple(py::cast(p.shape)); })
      .def_readonly("module_address", &Param::module_address)
      .def("__repr__", [](const Param& p) {
        return absl::StrCat("<Param ", p.address, " ", FormatShape(p.shape), ">");
      });
}

}  // namespace python
}  // namespace torchlens
