#include "torchlens_dispatch/python/trace_binding.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/render.h"
#include "graph/summary.h"
#include "graph/trace.h"
#include "graph/trace_file.h"
#include "torchlens_dispatch/ops/capture_key.h"
#include "torchlens_dispatch/python/exceptions.h"
#include "torchlens_dispatch/python/trace_handle.h"
#include "torchlens_dispatch/python/trace_objects.h"
#include "validation/intervene.h"
#include "validation/validate.h"

namespace py = pybind11;

namespace torchlens {
namespace python {
namespace {

ShowBuffers ParseShowBuffers(const std::string& show) {
  if (show == "never") return ShowBuffers::kNever;
  if (show == "meaningful") return ShowBuffers::kMeaningful;
  if (show == "always") return ShowBuffers::kAlways;
  Raise(PyExc_ValueError, absl::StrCat("show_buffers is \"", show,
                                       "\"; expected \"never\", \"meaningful\" or \"always\""));
}

Handle DoEdits(const Handle& handle, const py::dict& edits, bool strict) {
  handle->CheckUnchanged("replay edits");
  std::vector<Edit> list;
  for (auto [key, value] : edits) {
    const std::string label = py::str(key);
    FindOrKeyError(handle->trace, label);
    list.push_back(Edit{label, TensorArgument(value, absl::StrCat("the edit of ", label))});
  }
  absl::StatusOr<DoResult> result;
  {
    py::gil_scoped_release no_gil;
    NoCapture no_capture(kCaptureKey);
    result = Do(handle->trace, std::move(list), DoOptions{/*strict=*/false});
  }
  if (!result.ok()) RaiseStatus(result.status());
  for (const Diagnostic& gap : result->warnings) {
    const bool buffer_gap = gap.kind == DiagnosticKind::kBufferThreadGap;
    if (strict) Raise(buffer_gap ? Exceptions().gap_error : Exceptions().error, gap.message);
    if (PyErr_WarnEx(buffer_gap ? Exceptions().gap_warning : Exceptions().replay_gap_warning,
                     gap.message.c_str(), 2) != 0) {
      throw py::error_already_set();  // warnings turned into errors (-W error)
    }
  }
  auto fork = std::make_shared<TraceHandle>();
  fork->trace = std::move(result->trace);
  fork->base = handle;
  return fork;
}

}  // namespace

void BindTrace(py::module_& m) {
  py::class_<ValidationReport>(m, "ValidationReport", "What ValidateForwardPass found.")
      .def_readonly("passed", &ValidationReport::passed)
      .def_readonly("ops_checked", &ValidationReport::ops_checked)
      .def_readonly("failures", &ValidationReport::failures)
      .def_readonly("dead", &ValidationReport::dead)
      .def_readonly("unproved", &ValidationReport::unproved)
      .def_readonly("not_checked", &ValidationReport::not_checked)
      .def_readonly("state_transition_only", &ValidationReport::state_transition_only)
      .def_readonly("perturbations_checked", &ValidationReport::perturbations_checked)
      .def("__repr__", [](const ValidationReport& r) {
        return absl::StrCat("<ValidationReport ", r.passed ? "passed" : "FAILED", ": ",
                            r.ops_checked, " checked, ", r.failures.size(), " failures, ",
                            r.unproved.size(), " unproved, ", r.dead.size(), " dead>");
      });

  py::class_<TraceHandle, Handle>(m, "Trace", "A captured forward pass.")
      .def_property_readonly("ops",
                             [](const Handle& h) {
                               std::vector<OpRef> ops;
                               ops.reserve(h->trace.ops().size());
                               for (size_t i = 0; i < h->trace.ops().size(); ++i) {
                                 ops.push_back(OpRef{h, static_cast<int>(i)});
                               }
                               return ops;
                             })
      .def("__getitem__",
           [](const Handle& h, const std::string& key) {
             return OpRef{h, h->trace.IndexOf(&FindOrKeyError(h->trace, key))};
           })
      .def("__contains__",
           [](const Handle& h, const std::string& key) { return h->trace.Find(key).ok(); })
      .def("__len__", [](const Handle& h) { return h->trace.ops().size(); })
      .def_property_readonly("buffers",
                             [](const Handle& h) {
                               py::dict buffers;
                               for (const auto& [address, buffer] : h->trace.buffers()) {
                                 buffers[py::str(address)] = BufferRef{h, &buffer};
                               }
                               return buffers;
                             })
      .def_property_readonly("modules",
                             [](const Handle& h) {
                               py::dict modules;
                               for (const auto& [address, module] : h->trace.modules()) {
                                 modules[py::str(address)] = module;
                               }
                               return modules;
                             })
      .def_property_readonly("params",
                             [](const Handle& h) {
                               py::dict params;
                               for (const auto& [address, param] : h->trace.params()) {
                                 params[py::str(address)] = param;
                               }
                               return params;
                             })
      .def_property_readonly("buffer_read_ops",
                             [](const Handle& h) { return OpRefs(h, h->trace.buffer_read_ops()); })
      .def_property_readonly("buffer_write_ops",
                             [](const Handle& h) { return OpRefs(h, h->trace.buffer_write_ops()); })
      .def_property_readonly(
          "backward_ops",
          [](const Handle& h) {
            std::vector<OpRef> ops;
            const size_t count = h->trace.backward_ops().size();
            for (size_t i = 0; i < count; ++i) ops.push_back(OpRef{h, static_cast<int>(i), true});
            return ops;
          },
          "The ops autograd ran in the latest backward() that reached the trace, in execution "
          "order, each linked to its forward node (Op.forward_label).")
      .def_property_readonly(
          "param_grads",
          [](const Handle& h) {
            NoCapture no_capture(kCaptureKey);
            py::dict grads;
            for (const auto& [address, grad] : h->trace.param_grads()) {
              grads[py::str(address)] = TensorOrNone(grad.detach());
            }
            return grads;
          },
          "The parameters' gradients from that backward, by address.")
      .def_property_readonly("records_gradients",
                             [](const Handle& h) { return h->trace.records_gradients(); })
      .def_property_readonly("input_labels",
                             [](const Handle& h) { return h->trace.input_labels(); })
      .def_property_readonly("output_labels",
                             [](const Handle& h) { return h->trace.output_labels(); })
      .def_property(
          "output", [](const Handle& h) { return h->output; },
          [](const Handle& h, py::object output) { h->output = std::move(output); },
          "tl.trace: the forward's return value, as the model returned it.")
      .def_property_readonly("diagnostics",
                             [](const Handle& h) {
                               std::vector<std::string> messages;
                               for (const TraceDiagnostic& d : h->trace.diagnostics()) {
                                 messages.push_back(d.message);
                               }
                               return messages;
                             })
      .def_property_readonly("partial", [](const Handle& h) { return h->trace.partial(); })
      .def_property_readonly("partial_reason",
                             [](const Handle& h) { return h->trace.partial_reason(); })
      .def_property_readonly("training", [](const Handle& h) { return h->trace.training(); })
      .def_property_readonly("has_saved_values",
                             [](const Handle& h) { return h->trace.has_saved_values(); })
      .def(
          "validate",
          [](const Handle& h, int threads) {
            h->CheckUnchanged("be validated");
            absl::StatusOr<ValidationReport> report;
            {
              py::gil_scoped_release no_gil;
              NoCapture no_capture(kCaptureKey);
              report = ValidateForwardPass(h->trace, ValidationOptions{threads});
            }
            return ValueOrRaise(std::move(report));
          },
          py::arg("threads") = 1,
          "Replays every op from its saved arguments and checks values and edges "
          "(ValidateForwardPass); a ValidationReport.")
      .def(
          "validate_gradients",
          [](const Handle& h) {
            h->CheckUnchanged("have its gradients validated");
            absl::StatusOr<ValidationReport> report;
            {
              py::gil_scoped_release no_gil;
              NoCapture no_capture(kCaptureKey);
              report = ValidateGradients(h->trace);
            }
            return ValueOrRaise(std::move(report));
          },
          "Re-runs the backward of every op from its saved arguments and its outputs' saved "
          "gradients and checks each saved gradient (ValidateGradients); a ValidationReport.")
      .def("do", &DoEdits, py::arg("edits"), py::arg("strict") = false,
           "A new Trace with the edits ({label: tensor}) applied and their cone of effect "
           "re-executed; this trace is never written. A buffer version that cannot be "
           "recomputed warns with BufferThreadGapWarning, or raises BufferThreadGapError "
           "with strict=True.")
      .def(
          "to_dot",
          [](const Handle& h, const std::string& show_buffers) {
            RenderOptions options;
            options.show_buffers = ParseShowBuffers(show_buffers);
            return RenderDot(h->trace, options);
          },
          py::arg("show_buffers") = "meaningful",
          "The graph as Graphviz DOT text; show_buffers: \"never\", \"meaningful\", \"always\".")
      .def(
          "render",
          [](const Handle& h, const std::string& path, const std::string& show_buffers) {
            RenderOptions options;
            options.show_buffers = ParseShowBuffers(show_buffers);
            absl::Status rendered;
            {
              py::gil_scoped_release no_gil;
              rendered = RenderToFile(h->trace, path, options);
            }
            if (!rendered.ok()) RaiseStatus(rendered);
          },
          py::arg("path"), py::arg("show_buffers") = "meaningful",
          "Draws the graph to `path` (.svg, .png or .pdf).")
      .def(
          "save",
          [](const Handle& h, const std::string& path) {
            h->CheckUnchanged("be saved");
            absl::Status saved;
            {
              py::gil_scoped_release no_gil;
              NoCapture no_capture(kCaptureKey);
              saved = SaveTrace(h->trace, path);
            }
            if (!saved.ok()) RaiseStatus(saved);
          },
          py::arg("path"),
          "Writes the trace file the command-line tool writes with --save (torch.load reads it).")
      .def(
          "summary", [](const Handle& h) { return FormatSummary(h->trace); },
          "The summary the command-line tool prints.")
      .def("__repr__", [](const Handle& h) {
        return absl::StrCat("<Trace: ", h->trace.ops().size(), " nodes, ",
                            h->trace.buffers().size(), " buffers",
                            h->trace.partial() ? ", partial" : "", ">");
      });

  m.def(
      "load",
      [](const std::string& path) {
        absl::StatusOr<Trace> trace;
        {
          py::gil_scoped_release no_gil;
          NoCapture no_capture(kCaptureKey);
          trace = LoadTrace(path);
        }
        auto handle = std::make_shared<TraceHandle>();
        handle->trace = ValueOrRaise(std::move(trace));
        return handle;
      },
      py::arg("path"), "Reads a trace file (trace.save, or the command-line tool's --save).");
}

}  // namespace python
}  // namespace torchlens
