#include "graph/trace_builder.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/label.h"

namespace torchlens {

Op& TraceBuilder::Add(OpKind kind, const std::string& type, const std::string& label) {
  Op& op = parts_.ops.emplace_back();
  op.kind = kind;
  op.type = type;
  op.label = label;
  return op;
}

std::string TraceBuilder::BufferName(const std::string& address) {
  auto [it, inserted] = buffer_numbers_.try_emplace(address, buffer_numbers_.size() + 1);
  return absl::StrCat("buffer_", it->second);
}

void TraceBuilder::AddParent(Op* op, const Ref& ref) {
  const std::string& parent = parts_.ops[ref.node].label;
  if (std::find(op->parents.begin(), op->parents.end(), parent) == op->parents.end()) {
    op->parents.push_back(parent);
  }
  op->arg_sources.push_back(ArgSource{ArgSource::Kind::kNode, parent, ref.output});
}

TraceBuilder::Ref TraceBuilder::AddInput(const at::Tensor& value) {
  Op& op = Add(OpKind::kInput, "input", absl::StrCat("input_", ++inputs_));
  op.out = value;
  op.outs = {value};
  return Ref{static_cast<int>(parts_.ops.size()) - 1, 0, {}};
}

TraceBuilder::Ref TraceBuilder::AddOp(const std::string& name, const std::string& overload,
                                      const std::vector<Ref>& args,
                                      const std::vector<at::Tensor>& outs,
                                      std::vector<AliasWrite> alias_writes) {
  const std::string type = name.substr(name.rfind(':') + 1);
  const int type_index = ++layers_of_type_[type];
  Op& op = Add(OpKind::kOp, type, LayerPassLabel(type, type_index, ++steps_, 1));
  op.func_name = name;
  op.overload_name = overload;
  op.layer_type_index = type_index;
  op.layer_step_index = steps_;
  for (const Ref& arg : args) {
    if (arg.node < 0) {
      op.creation_args.push_back(arg.value);
      if (arg.value.isTensor()) op.arg_sources.push_back(ArgSource{ArgSource::Kind::kConstant});
      continue;
    }
    op.creation_args.push_back(OutputValue(parts_.ops[arg.node], arg.output));
    AddParent(&op, arg);
  }
  for (const AliasWrite& write : alias_writes) {
    if (std::find(op.parents.begin(), op.parents.end(), write.before.name) == op.parents.end()) {
      op.parents.push_back(write.before.name);
    }
  }
  op.alias_writes = std::move(alias_writes);
  op.outs = outs;
  if (!outs.empty()) {
    op.out = outs[0];
    op.tensor_shape.assign(outs[0].sizes().begin(), outs[0].sizes().end());
    op.tensor_dtype = c10::toString(outs[0].scalar_type());
  }
  return Ref{static_cast<int>(parts_.ops.size()) - 1, 0, {}};
}

void TraceBuilder::AddOutput(const Ref& ref) {
  Op& op = Add(OpKind::kOutput, "output", absl::StrCat("output_", ++outputs_));
  op.out = OutputValue(parts_.ops[ref.node], ref.output);
  op.outs = {op.out};
  AddParent(&op, ref);
}

TraceBuilder::Ref TraceBuilder::AddBufferRead(const std::string& address, const at::Tensor& value) {
  const int version = ++versions_[address];
  Op& op = Add(OpKind::kBufferVersion, "buffer", PassLabel(BufferName(address), version));
  op.address = address;
  op.buffer_pass = op.pass = version;
  op.out = value;
  op.outs = {value};
  Buffer& buffer = parts_.buffers[address];
  buffer.address = address;
  buffer.initial_value = value.clone();  // NOTE [Independent initial values]
  return Ref{static_cast<int>(parts_.ops.size()) - 1, 0, {}};
}

TraceBuilder::Ref TraceBuilder::AddBufferWrite(const std::string& address, WriteKind kind,
                                               const Ref& producer, const at::Tensor& value) {
  const int version = ++versions_[address];
  Op& op = Add(OpKind::kBufferVersion, "buffer", PassLabel(BufferName(address), version));
  op.address = address;
  op.buffer_pass = op.pass = version;
  op.buffer_write_kind = kind;
  op.out = value;
  op.outs = {value};
  AddParent(&op, producer);
  return Ref{static_cast<int>(parts_.ops.size()) - 1, 0, {}};
}

Trace TraceBuilder::Build() {
  parts_.has_saved_values = true;
  parts_.children_linked = false;
  return Trace::Assemble(std::move(parts_));
}

}  // namespace torchlens
