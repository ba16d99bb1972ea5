// How torchlens names an operator for people: the type of an op node and of its labels.
#ifndef TORCHLENS_DISPATCH_OPS_OP_NAMES_H_
#define TORCHLENS_DISPATCH_OPS_OP_NAMES_H_

#include <ATen/core/operator_name.h>

#include <string>

namespace torchlens {

// "add_" for aten::add_, "conv2d" for aten::conv2d, "and" for aten::__and__.
std::string OpTypeName(const c10::OperatorName& name);

}  // namespace torchlens

#endif  // TORCHLENS_DISPATCH_OPS_OP_NAMES_H_
