#include "torchlens_dispatch/source_positions.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"

namespace torchlens {
namespace {

// See NOTE [Source positions].
std::optional<SourcePosition> PlaceOf(const torch::jit::SourceRange& range) {
  torch::jit::SourceRange place = range;
  if (c10::optional<torch::jit::SourceRange> original = range.findSourceRangeThatGenerated()) {
    place = *original;
  }
  const std::shared_ptr<torch::jit::Source>& source = place.source();
  if (source == nullptr || place.start() >= source->size()) return std::nullopt;
  const size_t line = source->lineno_for_offset(place.start());
  SourcePosition position;
  if (source->filename().has_value()) {
    position.file = *source->filename();
    // A Source that names its file starts at its 1-based `starting_line_no`.
    position.line = static_cast<int>(source->lineno_to_source_lineno(line));
  } else {
    position.file = "<unknown>";
    position.line = static_cast<int>(line) + 1;
  }
  position.column = static_cast<int>(place.start() - source->offset_for_line(line));
  position.text = std::string(absl::StripAsciiWhitespace(source->get_line(line).str()));
  return position;
}

}  // namespace

std::shared_ptr<const SourcePosition> SourcePositionOf(const torch::jit::SourceRange& range) {
  std::optional<SourcePosition> place = PlaceOf(range);
  if (!place.has_value()) return nullptr;
  return std::make_shared<const SourcePosition>(*std::move(place));
}

std::shared_ptr<const SourcePosition> SourcePositionOfNode(const torch::jit::Node* node) {
  std::optional<SourcePosition> place = PlaceOf(node->sourceRange());
  if (!place.has_value()) return nullptr;
  std::vector<BranchTaken> branches;  // innermost first, reversed below
  for (const torch::jit::Block* block = node->owningBlock();
       block != nullptr && block->owningNode() != nullptr;
       block = block->owningNode()->owningBlock()) {
    const torch::jit::Node* owner = block->owningNode();
    if (owner->kind() != c10::prim::If) continue;
    std::optional<SourcePosition> condition = PlaceOf(owner->sourceRange());
    if (!condition.has_value()) continue;
    branches.push_back(BranchTaken{std::move(condition->file), condition->line,
                                   std::move(condition->text), owner->blocks()[0] == block});
  }
  place->branches.assign(std::make_move_iterator(branches.rbegin()),
                         std::make_move_iterator(branches.rend()));
  return std::make_shared<const SourcePosition>(*std::move(place));
}

}  // namespace torchlens
