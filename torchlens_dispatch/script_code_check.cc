#include "torchlens_dispatch/script_code_check.h"

#include <torch/csrc/jit/frontend/lexer.h>
#include <torch/csrc/jit/frontend/parser.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/frontend/tree_views.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/source_range_serialization.h>

#include <memory>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "torchlens_dispatch/ops/exception_text.h"
#include "torchlens_dispatch/script_errors.h"

namespace torchlens {
namespace {

// Class-body names the importer reads itself rather than as constants.
bool ImporterMetadata(const std::string& name) {
  return name == "__parameters__" || name == "__buffers__" || name == "__annotations__";
}

// See NOTE [Code LibTorch 1.13 crashes on].
absl::Status CheckClass(const torch::jit::ClassDef& class_def) {
  for (const torch::jit::Stmt& statement : class_def.body()) {
    if (statement.kind() != torch::jit::TK_ASSIGN) continue;
    const torch::jit::Assign assign(statement);
    if (assign.lhs_list().size() != 1 || assign.lhs().kind() != torch::jit::TK_VAR) continue;
    const std::string name = torch::jit::Var(assign.lhs()).name().name();
    if (ImporterMetadata(name) || !assign.rhs().present() || assign.type().present()) continue;
    std::string where;
    if (auto place = assign.range().file_line_col()) {
      where = absl::StrCat(" at ", std::get<0>(*place), ":", std::get<1>(*place));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "class ", class_def.name().name(), where, " gives '", name,
        "' a value without a type, which LibTorch 1.13 cannot load safely (TorchScript "
        "writes class constants as '",
        name, " : Final[T] = value')"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDebugInfo(absl::string_view pickle, const std::string& filename) {
  try {
    const c10::IValue root = torch::jit::unpickle(pickle.data(), pickle.size());
    const auto& items = root.toTupleRef().elements();
    // The forms NOTE [Debug information] lists, deserialized as LibTorch 1.13 does.
    std::vector<std::shared_ptr<std::string>> table;
    c10::IValue lines = root;
    if (!items.empty() && items[0].isString() &&
        items[0].toStringRef() == torch::jit::kFormatWithStringTable) {
      for (const c10::IValue& text : items[1].toTupleRef().elements()) {
        table.push_back(std::make_shared<std::string>(text.toStringRef()));
      }
      lines = items[2];
    }
    // One Source per source tuple, as LibTorch shares them.
    std::unordered_map<const c10::ivalue::Tuple*, std::shared_ptr<torch::jit::Source>> sources;
    for (const c10::IValue& line : lines.toTupleRef().elements()) {
      const auto& range = line.toTupleRef().elements()[1].toTupleRef().elements();
      const c10::ivalue::Tuple* key = &range[0].toTupleRef();
      std::shared_ptr<torch::jit::Source>& source = sources[key];
      if (source == nullptr) {
        const auto& parts = key->elements();
        if (!table.empty()) {
          std::vector<c10::string_view> pieces;
          std::vector<std::shared_ptr<std::string>> owned;
          for (int64_t index : parts[0].toIntList()) {
            pieces.emplace_back(*table[index]);
            owned.push_back(table[index]);
          }
          source = std::make_shared<torch::jit::Source>(
              torch::jit::StringCordView(std::move(pieces), std::move(owned)),
              *table[parts[1].toInt()], parts[2].toInt());
        } else {
          source = std::make_shared<torch::jit::Source>(
              parts[0].toStringRef(), parts[1].toOptional<std::string>(), parts[2].toInt());
        }
      }
      std::ostringstream printed;
      torch::jit::SourceRange(source, range[1].toInt(), range[2].toInt()).highlight(printed);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(filename, ": debug information LibTorch cannot print: ", FirstLine(e)));
  }
  return absl::OkStatus();
}

// NOTE [Code LibTorch recurses over]
// LibTorch parses TorchScript code by recursive descent, and frees and compiles the trees
// it builds by recursion too, with no depth limit of its own: 200,000 nested parentheses,
// a run of `not`s, a chain of `**` or of `x + x + ...` a million terms long overflows the
// stack (a crash, whatever the caller catches). Code that
// TorchScript prints is flat: one call per statement, brackets a few deep. So before
// anything parses a record its tokens are counted: brackets and blocks nested at most 256
// deep, and at most 1,024 operator tokens (and 65,536 tokens in all) per logical line.
// Operators are what makes an expression deep; names, numbers, strings, commas and
// brackets are not (a list of 10,000 names is as deep as one).
constexpr int kMaxCodeNesting = 256;
constexpr int kMaxOperatorsPerLine = 1024;
constexpr int kMaxTokensPerLine = 65536;

absl::Status CheckCodeShape(absl::string_view code, const std::string& filename,
                            int64_t* functions) {
  torch::jit::Lexer lexer(
      std::make_shared<torch::jit::Source>(std::string(code), filename, /*starting_line_no=*/1));
  int brackets = 0, blocks = 0, operators = 0, tokens = 0;
  auto refuse = [&](absl::string_view what) {
    const torch::jit::SourceRange& at = lexer.cur().range;
    return absl::InvalidArgumentError(absl::StrCat(
        filename, " line ", at.source()->lineno_for_offset(at.start()) + 1, ": ", what,
        "; TorchScript's printer writes flat code, and LibTorch's parser would recurse past "
        "its stack (NOTE [Code LibTorch recurses over])"));
  };
  for (int kind = lexer.cur().kind; kind != torch::jit::TK_EOF; kind = lexer.cur().kind) {
    switch (kind) {
      case '(':
      case '[':
      case '{':
        if (++brackets > kMaxCodeNesting) return refuse("brackets nest more than 256 deep");
        break;
      case ')':
      case ']':
      case '}':
        --brackets;
        break;
      case torch::jit::TK_INDENT:
        if (++blocks > kMaxCodeNesting) return refuse("blocks nest more than 256 deep");
        break;
      case torch::jit::TK_DEDENT:
        --blocks;
        break;
      case torch::jit::TK_NEWLINE:
        operators = tokens = 0;
        break;
      case torch::jit::TK_DEF:
        if (functions != nullptr) ++*functions;
        break;
      case torch::jit::TK_IDENT:
      case torch::jit::TK_NUMBER:
      case torch::jit::TK_STRINGLITERAL:
      case torch::jit::TK_TRUE:
      case torch::jit::TK_FALSE:
      case torch::jit::TK_NONE:
      case ',':
      case ':':
      case '=':
        break;
      default:
        if (++operators > kMaxOperatorsPerLine) {
          return refuse("more than 1,024 operators in one statement");
        }
    }
    if (++tokens > kMaxTokensPerLine) return refuse("more than 65,536 tokens in one statement");
    lexer.next();
  }
  return absl::OkStatus();
}

absl::Status CheckScriptCode(absl::string_view code, const std::string& filename,
                             int64_t* functions) {
  try {
    if (absl::Status shape = CheckCodeShape(code, filename, functions); !shape.ok()) {
      return shape;
    }
    torch::jit::Parser parser(
        std::make_shared<torch::jit::Source>(std::string(code), filename, /*starting_line_no=*/1));
    torch::jit::Lexer& lexer = parser.lexer();
    // As LibTorch's importer reads a code record: an optional version line, imports,
    // then classes and functions. Anything else is left to it to report.
    if (lexer.cur().kind == torch::jit::TK_IDENT && lexer.cur().text() == "op_version_set") {
      lexer.next();
      lexer.expect('=');
      lexer.expect(torch::jit::TK_NUMBER);
      lexer.expect(torch::jit::TK_NEWLINE);
    }
    while (lexer.cur().kind != torch::jit::TK_EOF) {
      while (lexer.nextIf(torch::jit::TK_IMPORT)) {
        while (lexer.cur().kind != torch::jit::TK_NEWLINE) {
          if (lexer.cur().kind == torch::jit::TK_EOF) {
            return absl::InvalidArgumentError(
                absl::StrCat(filename, " ends inside an import line"));
          }
          lexer.next();
        }
        lexer.expect(torch::jit::TK_NEWLINE);
      }
      if (lexer.cur().kind == torch::jit::TK_CLASS_DEF) {
        if (absl::Status s = CheckClass(torch::jit::ClassDef(parser.parseClass())); !s.ok()) {
          return s;
        }
      } else if (lexer.cur().kind == torch::jit::TK_DEF) {
        parser.parseFunction(/*is_method=*/false);
      } else {
        break;
      }
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(ParseCompileError(MessageOf(e)).OneLine());
  }
  return absl::OkStatus();
}

}  // namespace torchlens
