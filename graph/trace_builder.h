// Building a Trace by hand, for tests of graph/ and validation/ that need no capture.
//
//   TraceBuilder builder;
//   const TraceBuilder::Ref x = builder.AddInput(at::tensor({1.0f, 2.0f}));
//   const TraceBuilder::Ref y =
//       builder.AddOp("aten::mul", "Tensor", {x, TraceBuilder::Value(at::tensor(3.0f))},
//                     {at::tensor({3.0f, 6.0f})});
//   builder.AddOutput(y);
//   Trace trace = builder.Build();   // input_1, mul_1_1:1, output_1
//
// Ops are labelled as captures label them ("{type}_{type_index}_{step_index}:1", one pass
// each); arguments that are nodes become parents, with their saved value as the argument.
#ifndef TORCHLENS_GRAPH_TRACE_BUILDER_H_
#define TORCHLENS_GRAPH_TRACE_BUILDER_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <map>
#include <string>
#include <vector>

#include "graph/trace.h"

namespace torchlens {

class TraceBuilder {
 public:
  // An argument: output `output` of a node already added, or a value from outside.
  struct Ref {
    int node = -1;   // position in the trace; -1: `value` is a plain argument
    int output = 0;  // which output (negative: an alias write, as in Op::arg_sources)
    c10::IValue value;
  };
  static Ref Value(c10::IValue value) { return Ref{-1, 0, std::move(value)}; }

  Ref AddInput(const at::Tensor& value);
  // An op `name`.`overload` called on `args` that returned `outs`; `alias_writes` are
  // tensors it changed through views (their `before` names a node by label).
  Ref AddOp(const std::string& name, const std::string& overload, const std::vector<Ref>& args,
            const std::vector<at::Tensor>& outs, std::vector<AliasWrite> alias_writes = {});
  void AddOutput(const Ref& ref);
  // A registered buffer's read version and its written versions (`producer` the op
  // whose output `output` is the value written).
  Ref AddBufferRead(const std::string& address, const at::Tensor& value);
  Ref AddBufferWrite(const std::string& address, WriteKind kind, const Ref& producer,
                     const at::Tensor& value);

  // The label of the node `ref` names.
  const std::string& label(const Ref& ref) const { return parts_.ops[ref.node].label; }

  Trace Build();

 private:
  Op& Add(OpKind kind, const std::string& type, const std::string& label);
  void AddParent(Op* op, const Ref& ref);
  std::string BufferName(const std::string& address);  // "buffer_2": numbered by first use

  TraceParts parts_;
  std::map<std::string, int> layers_of_type_;
  std::map<std::string, int> versions_;
  int steps_ = 0;
  int inputs_ = 0;
  int outputs_ = 0;
  std::map<std::string, int> buffer_numbers_;
};

}  // namespace torchlens

#endif  // TORCHLENS_GRAPH_TRACE_BUILDER_H_
