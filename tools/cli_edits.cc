#include "tools/cli_edits.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "torchlens_dispatch/ops/bit_identical.h"
#include "validation/intervene.h"

namespace torchlens {
namespace {

// A complex value as Python prints one: "1+0.5j".
std::string ComplexText(double real, double imag) {
  return absl::StrCat(real, std::signbit(imag) ? "-" : "+", std::abs(imag), "j");
}

std::string Values(const at::Tensor& t) {
  if (t.numel() > 16) return absl::StrCat("[", t.numel(), " values]");
  std::vector<std::string> values;
  if (t.is_complex()) {
    const at::Tensor parts =
        at::view_as_real(t.resolve_conj().reshape({-1}).to(at::kComplexDouble)).contiguous();
    const double* data = parts.data_ptr<double>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      values.push_back(ComplexText(data[2 * i], data[2 * i + 1]));
    }
  } else if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
    // Exactly, in int64: a double holds no integer beyond 2^53 exactly.
    const at::Tensor flat = t.reshape({-1}).to(at::kLong).contiguous();
    const int64_t* data = flat.data_ptr<int64_t>();
    for (int64_t i = 0; i < flat.numel(); ++i) values.push_back(absl::StrCat(data[i]));
  } else {
    const at::Tensor flat = t.reshape({-1}).to(at::kDouble).contiguous();
    const double* data = flat.data_ptr<double>();
    for (int64_t i = 0; i < flat.numel(); ++i) values.push_back(absl::StrCat(data[i]));
  }
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

// How `after` differs from `before`, or "unchanged" (bitwise, NOTE [Bitwise equality]).
std::string Change(const at::Tensor& before, const at::Tensor& after) {
  if (BitIdentical(before, after)) return "unchanged";
  if (!before.defined() || !after.defined()) return "changed (no saved value)";
  if (before.sizes() != after.sizes() || before.scalar_type() != after.scalar_type()) {
    return absl::StrCat("changed shape or dtype: ", Shape(before), " ",
                        c10::toString(before.scalar_type()), " -> ", Shape(after), " ",
                        c10::toString(after.scalar_type()), " ", Values(after));
  }
  // Complex values change by the modulus of their difference.
  const c10::ScalarType wide = after.is_complex() ? at::kComplexDouble : at::kDouble;
  const at::Tensor difference =
      (after.resolve_conj().to(wide) - before.resolve_conj().to(wide)).abs();
  return absl::StrCat("changed (max abs change ", difference.max().item<double>(), ") ",
                      Values(before), " -> ", Values(after));
}

}  // namespace

std::string Count(int64_t count, const std::string& singular, const std::string& plural) {
  return absl::StrCat(count, " ", count == 1 ? singular : plural);
}

absl::StatusOr<at::Tensor> EditValue(const at::Tensor& like, const EditFlag& edit) {
  const at::ScalarType type = like.scalar_type();
  if (at::isFloatingType(type) || at::isComplexType(type)) return at::full_like(like, edit.value);
  const std::string flag = absl::StrCat("--edit ", edit.label, "=", edit.text, ": the node holds ",
                                        c10::toString(type), " values");
  int64_t integer = 0;
  bool integral = absl::SimpleAtoi(edit.text, &integer);
  constexpr double kExact = 9007199254740992.0;  // 2^53: doubles hold every integer up to it
  if (!integral && std::isfinite(edit.value) && std::trunc(edit.value) == edit.value &&
      std::abs(edit.value) <= kExact) {
    integer = static_cast<int64_t>(edit.value);  // "7.0", "1e3"
    integral = true;
  }
  if (!integral) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ", and ", edit.text, " is not an integer; give an integer"));
  }
  if (type == at::kBool && integer != 0 && integer != 1) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "; give 0 or 1"));
  }
  try {
    return at::full_like(like, integer);
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ", and ", edit.text, " is outside their range"));
  }
}

absl::StatusOr<std::string> ApplyEdits(const Trace& trace, const std::vector<EditFlag>& flags) {
  std::vector<Edit> edits;
  for (const EditFlag& flag : flags) {
    absl::StatusOr<const Op*> node = trace.Find(flag.label);
    if (!node.ok()) {
      return absl::Status(node.status().code(), absl::StrCat("--edit ", flag.label, "=", flag.text,
                                                             ": ", node.status().message()));
    }
    const Op& op = **node;
    const int outputs = op.outs.empty() ? 1 : static_cast<int>(op.outs.size());
    for (int k = 0; k < outputs; ++k) {
      const at::Tensor& value = OutputValue(op, k);
      if (!value.defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--edit ", flag.label, ": output ", k, " has no saved value"));
      }
      absl::StatusOr<at::Tensor> edited = EditValue(value, flag);
      if (!edited.ok()) return edited.status();
      edits.push_back(Edit{flag.label, *std::move(edited), k});
    }
  }
  // Only the outputs and buffer versions are described: the fork keeps no more, so an
  // edit of a trace larger than memory replays with its working set.
  DoOptions options;
  options.keep_values = false;
  absl::StatusOr<DoResult> result = Do(trace, std::move(edits), options);
  if (!result.ok()) return result.status();
  std::string out = absl::StrCat(
      "\nIntervention: ", Count(result->reexecuted.size(), "node", "nodes"), " re-executed\n");
  for (const Diagnostic& warning : result->warnings) {
    absl::StrAppend(&out, "  warning (", DiagnosticKindName(warning.kind), " at ", warning.label,
                    "): ", warning.message, "\n");
  }
  // Do's trace holds every node of the trace it replayed, under the same labels; a missing
  // one reads as "no saved value".
  auto value_of = [](const Trace& in, const std::string& label) {
    const int index = in.IndexOfLabel(label);
    return index < 0 ? at::Tensor() : in.ops()[index].out;
  };
  for (const std::string& label : trace.output_labels()) {
    absl::StrAppend(&out, "  ", label, ": ",
                    Change(value_of(trace, label), value_of(result->trace, label)), "\n");
  }
  for (const Op* version : trace.buffer_write_ops()) {
    const at::Tensor after = value_of(result->trace, version->label);
    if (BitIdentical(version->out, after)) continue;
    absl::StrAppend(&out, "  buffer ", version->address, ":", version->buffer_pass, " (",
                    version->label, "): ", Change(version->out, after), "\n");
  }
  return out;
}

}  // namespace torchlens
