#include "graph/trace_file_checks.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace torchlens {
namespace {

// Module addresses name modules as capture writes them ("layer1.0.conv1"): dot-separated
// names, none empty. Their nesting bounds the recursion of the pictures' clusters and the
// size of the per-module listings (a crafted address of 200,000 levels made the summary's
// module totals quadratic); the depth bench's 1,000-level model is the deepest we build.
constexpr size_t kMaxModuleAddressBytes = 64 << 10;
constexpr size_t kMaxModuleDepth = 2048;
absl::Status CheckModuleAddress(absl::string_view address, absl::string_view where) {
  if (address.empty()) return absl::OkStatus();  // the model itself
  size_t depth = 1, component = 0;
  for (const char c : address) {
    if (c != '.') {
      ++component;
      continue;
    }
    if (component == 0) break;
    component = 0;
    ++depth;
  }
  if (component == 0 || address.size() > kMaxModuleAddressBytes || depth > kMaxModuleDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed trace file: ", where, " has the module address \"",
                     absl::CHexEscape(address.substr(0, 200)), address.size() > 200 ? "..." : "",
                     "\" (", address.size(),
                     " bytes); a module address is module names joined by single dots, at "
                     "most ",
                     kMaxModuleDepth, " levels and ", kMaxModuleAddressBytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckConsistent(const std::vector<Op>& ops) {
  absl::flat_hash_map<absl::string_view, size_t> index;
  index.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    for (const std::string& parent : op.parents) {
      auto it = index.find(parent);
      if (it == index.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "malformed trace file: op \"", absl::CHexEscape(op.label), "\" (op ", i,
            ") lists parent \"", absl::CHexEscape(parent),
            "\", which is not an op before it; ops are in execution order and parents run "
            "first"));
      }
    }
    int64_t end_ns = 0;
    if (op.start_ns < -1 || op.duration_ns < -1 ||
        (op.duration_ns >= 0 && __builtin_add_overflow(op.start_ns, op.duration_ns, &end_ns))) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed trace file: op \"", absl::CHexEscape(op.label),
                       "\" records start ", op.start_ns, " ns and duration ", op.duration_ns,
                       " ns; times are -1 (not timed) or nanoseconds from the first op"));
    }
    if (!index.emplace(op.label, i).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed trace file: label \"", absl::CHexEscape(op.label), "\" appears twice"));
    }
    if (!op.out.defined()) continue;
    if (c10::IntArrayRef(op.tensor_shape) != op.out.sizes() ||
        op.tensor_dtype != c10::toString(op.out.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed trace file: op \"", absl::CHexEscape(op.label), "\" records shape [",
          absl::StrJoin(op.tensor_shape, ", "), "] and dtype \"", absl::CHexEscape(op.tensor_dtype),
          "\", but its saved value has shape [", absl::StrJoin(op.out.sizes(), ", "),
          "] and dtype ", c10::toString(op.out.scalar_type())));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGradients(const TraceParts& parts) {
  absl::flat_hash_map<absl::string_view, size_t> forward;
  for (size_t i = 0; i < parts.ops.size(); ++i) {
    const Op& op = parts.ops[i];
    forward.emplace(op.label, i);
    if (op.grad.defined() && op.grad.sizes() != c10::IntArrayRef(op.tensor_shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed trace file: op \"", absl::CHexEscape(op.label), "\" records shape [",
          absl::StrJoin(op.tensor_shape, ", "), "] but its gradient has shape [",
          absl::StrJoin(op.grad.sizes(), ", "), "]"));
    }
  }
  absl::flat_hash_map<absl::string_view, size_t> backward;
  for (size_t i = 0; i < parts.backward_ops.size(); ++i) {
    const Op& op = parts.backward_ops[i];
    if (!backward.emplace(op.label, i).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed trace file: backward op \"", absl::CHexEscape(op.label), "\" appears twice"));
    }
    if (!op.forward_label.empty() && !forward.contains(op.forward_label)) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed trace file: backward op \"", absl::CHexEscape(op.label),
                       "\" differentiates \"", absl::CHexEscape(op.forward_label),
                       "\", which is not a node of the trace"));
    }
  }
  for (const Op& op : parts.backward_ops) {
    for (const std::vector<std::string>* edges : {&op.parents, &op.children}) {
      for (const std::string& label : *edges) {
        if (backward.contains(label)) continue;
        return absl::InvalidArgumentError(
            absl::StrCat("malformed trace file: backward op \"", absl::CHexEscape(op.label),
                         "\" is linked to \"", absl::CHexEscape(label),
                         "\", which is not a backward op of the trace"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckModuleAddresses(const TraceParts& parts) {
  for (const Op& op : parts.ops) {
    if (absl::Status s = CheckModuleAddress(
            op.module_address, absl::StrCat("op \"", absl::CHexEscape(op.label), "\""));
        !s.ok()) {
      return s;
    }
  }
  for (const auto& [address, module] : *parts.modules) {
    if (absl::Status s = CheckModuleAddress(address, "a module"); !s.ok()) return s;
  }
  for (const auto& [address, param] : *parts.params) {
    if (absl::Status s = CheckModuleAddress(param.module_address, "a param"); !s.ok()) return s;
  }
  for (const auto& [address, buffer] : parts.buffers) {
    if (absl::Status s = CheckModuleAddress(buffer.module_address, "a buffer"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckListedBuffers(const Trace& trace,
                                const std::map<std::string, ListedBuffer>& listed) {
  for (const auto& [address, entry] : listed) {
    const BufferSummary& summary = entry.summary;
    const Buffer& buffer = trace.buffers().at(address);
    const BufferSummary rebuilt = SummarizeBuffer(buffer);
    if (summary.versions != rebuilt.versions || summary.write_kinds != rebuilt.write_kinds ||
        entry.num_overwrites != buffer.num_overwrites) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed trace file: buffer \"", absl::CHexEscape(address), "\" lists versions [",
          absl::StrJoin(summary.versions, ", "), "] with ", entry.num_overwrites, " overwrites (",
          absl::StrJoin(summary.write_kinds, ", "), ") but its ops give [",
          absl::StrJoin(rebuilt.versions, ", "), "] with ", buffer.num_overwrites, " overwrites (",
          absl::StrJoin(rebuilt.write_kinds, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace torchlens
