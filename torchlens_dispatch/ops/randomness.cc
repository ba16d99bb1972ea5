#include "torchlens_dispatch/ops/randomness.h"

namespace torchlens {

bool DrawsOnlyForDropout(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  bool dropout = false;
  for (const c10::Argument& argument : op.schema().arguments()) {
    const c10::TypeKind kind = argument.type()->kind();
    if (kind == c10::TypeKind::GeneratorType) return false;
    if (kind == c10::TypeKind::FloatType &&
        (argument.name() == "dropout" || argument.name() == "dropout_p")) {
      dropout = true;
    }
  }
  return dropout;
}

bool ConsumesRandomness(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::nondeterministic_seeded) || DrawsOnlyForDropout(op)) return true;
  for (const c10::Argument& argument : op.schema().arguments()) {
    const c10::TypePtr& type = argument.type();
    if (type->kind() == c10::TypeKind::GeneratorType) return true;
    if (type->kind() == c10::TypeKind::OptionalType &&
        type->expectRef<c10::OptionalType>().getElementType()->kind() ==
            c10::TypeKind::GeneratorType) {
      return true;
    }
  }
  return false;
}

}  // namespace torchlens
