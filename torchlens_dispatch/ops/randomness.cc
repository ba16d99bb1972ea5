#include "torchlens_dispatch/ops/randomness.h"

namespace torchlens {

bool ConsumesRandomness(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::nondeterministic_seeded)) return true;
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
