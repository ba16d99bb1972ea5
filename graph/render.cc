#include "graph/render.h"

#include <graphviz/cgraph.h>
#include <graphviz/gvc.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/dead_nodes.h"
#include "graph/file_io.h"
#include "graph/render_groups.h"
#include "graph/summary.h"

namespace torchlens {
namespace {

// BatchNorm / InstanceNorm bookkeeping, hidden by ShowBuffers::kMeaningful.
bool Bookkeeping(absl::string_view address) {
  const absl::string_view name = address.substr(address.rfind('.') + 1);
  return name == "running_mean" || name == "running_var" || name == "num_batches_tracked";
}

std::string Quote(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

std::string NodeId(size_t index) { return absl::StrCat("n", index); }

// Modules as a tree of clusters: address -> nodes directly in it.
struct Cluster {
  std::vector<std::string> statements;
  std::set<std::string> children;
};

}  // namespace

bool BufferShown(const Op& op, ShowBuffers show) {
  if (!op.is_buffer_version()) return true;
  switch (show) {
    case ShowBuffers::kNever:
      return false;
    case ShowBuffers::kMeaningful:
      return !Bookkeeping(op.address);
    case ShowBuffers::kAlways:
      return true;
  }
  return true;
}

std::string RenderDot(const Trace& trace, RenderOptions options) {
  const std::vector<Op>& ops = trace.ops();
  std::vector<bool> dead(ops.size(), false);
  for (int index : DeadNodes(trace)) dead[index] = true;
  // A dead node's readers are dead too, so hiding dead nodes never hides a parent of a
  // node that is drawn.
  // An op that only reads and writes hidden bookkeeping (BatchNorm's
  // `num_batches_tracked.add_(1)` in training) is hidden with it: drawn, it would float
  // unconnected.
  const auto hidden_bookkeeping = [&](const Op& op) {
    if (options.show_buffers == ShowBuffers::kAlways || !op.is_compute() ||
        op.child_indices.empty()) {
      return false;
    }
    const auto hidden_buffer = [&](int32_t index) {
      return index >= 0 && ops[index].is_buffer_version() &&
             !BufferShown(ops[index], options.show_buffers);
    };
    return std::all_of(op.parent_indices.begin(), op.parent_indices.end(), hidden_buffer) &&
           std::all_of(op.child_indices.begin(), op.child_indices.end(), hidden_buffer);
  };
  auto shown = [&](const Op& op) {
    return BufferShown(op, options.show_buffers) && !hidden_bookkeeping(op) &&
           (options.show_dead || !dead[static_cast<size_t>(&op - ops.data())]);
  };

  std::map<std::string, Cluster> clusters;  // "" is the top level
  clusters[""];
  auto cluster_of = [&](const std::string& address) -> Cluster& {
    // Make sure every ancestor cluster exists and lists its child: walking up from the
    // address to the first cluster that exists, so each module's name is made once however
    // many ops it ran (made per op and level, a crafted file's deep addresses cost
    // quadratic time).
    if (auto it = clusters.find(address); it != clusters.end()) return it->second;
    std::string child = address;
    while (true) {
      const size_t dot = child.rfind('.');
      std::string parent = dot == std::string::npos ? std::string() : child.substr(0, dot);
      const bool known = clusters.count(parent) > 0;
      clusters[parent].children.insert(child);
      clusters[child];
      if (known) break;
      child = std::move(parent);
    }
    return clusters[address];
  };

  // See NOTE [Collapsed and rolled pictures].
  const RenderGrouping grouping = GroupForRender(trace, options.max_module_depth, options.rolled);
  std::map<std::string, int> calls_of;  // collapsed module -> its calls, unrolled
  for (const RenderGroup& group : grouping.groups) {
    if (group.kind == RenderGroup::Kind::kModule) {
      calls_of[group.name] = std::max(calls_of[group.name], group.call);
    }
  }
  // Each rolled buffer node's versions: whether one is a read, and the writes' kinds, so
  // that a buffer written on every pass says so rather than what its first version was.
  std::map<int, std::pair<bool, std::vector<WriteKind>>> versions_of_group;
  if (options.rolled) {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!ops[i].is_buffer_version()) continue;
      auto& [read, writes] = versions_of_group[grouping.group_of[i]];
      if (ops[i].buffer_write_kind.has_value()) {
        writes.push_back(*ops[i].buffer_write_kind);
      } else {
        read = true;
      }
    }
  }
  std::vector<bool> drawn(grouping.groups.size(), false);
  std::vector<std::string> edges;
  std::set<std::pair<int, int>> linked;  // (from, to) groups with an edge drawn
  auto link = [&](size_t from, size_t to, absl::string_view style) {
    const int a = grouping.group_of[from];
    const int b = grouping.group_of[to];
    if (a == b || !linked.emplace(a, b).second) return;
    edges.push_back(absl::StrCat(NodeId(a), " -> ", NodeId(b), style));
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (!shown(op)) continue;
    const int group_index = grouping.group_of[i];
    const RenderGroup& group = grouping.groups[group_index];
    std::vector<std::string> attributes;
    std::vector<std::string> hidden;
    std::vector<std::string> tooltip;  // lines: what is odd about the node first,
    std::vector<std::string> code;     // then where it is in the model's code
    std::string text;
    if (op.is_buffer_version()) {
      text = absl::StrCat(op.address, ":", op.buffer_pass, "\n",
                          op.buffer_write_kind ? WriteKindName(*op.buffer_write_kind) : "read", " ",
                          FormatShape(op.tensor_shape));
      attributes = {"shape=cylinder", "style=filled", "fillcolor=\"#f5e6c8\""};
    } else {
      text = absl::StrCat(op.label, "\n", op.type, " ", FormatShape(op.tensor_shape));
      if (!op.module_address.empty()) absl::StrAppend(&text, "\n@", op.module_address);
      if (!op.parent_params.empty()) {
        std::vector<std::string> params;
        for (const std::string& address : op.parent_params) {
          auto it = trace.params().find(address);
          params.push_back(it == trace.params().end()
                               ? address
                               : absl::StrCat(address.substr(address.rfind('.') + 1), " ",
                                              FormatShape(it->second.shape)));
        }
        absl::StrAppend(&text, "\nparams: ", absl::StrJoin(params, ", "));
      }
      if (op.is_constant() && !op.address.empty()) absl::StrAppend(&text, "\n", op.address);
      if (op.source_position != nullptr) {
        const SourcePosition& position = *op.source_position;
        code.push_back(absl::StrCat(FormatSourcePosition(position), ": ", position.text));
        // Which branches ran: why two requests' traces differ.
        for (const BranchTaken& branch : position.branches) {
          if (!options.library_branches && LibraryFile(branch.file)) continue;
          const std::string where =
              FormatSourcePosition(SourcePosition{branch.file, branch.line}, /*short_file=*/true);
          absl::StrAppend(&text, "\n", branch.then ? "then" : "else", " of if at ", where);
          code.push_back(
              absl::StrCat(branch.then ? "then" : "else", " of ", where, ": ", branch.text));
        }
      }
      if (op.is_input()) {
        attributes = {"shape=oval", "style=filled", "fillcolor=\"#c8f0c8\""};
      } else if (op.is_output()) {
        attributes = {"shape=oval", "style=filled", "fillcolor=\"#f5c8c8\""};
      } else if (op.is_constant()) {
        attributes = {"shape=note", "style=filled", "fillcolor=\"#e0e0e0\""};
      } else if (dead[i]) {
        attributes = {"shape=box", "style=\"rounded,dotted\"", "fontcolor=gray40"};
        tooltip.push_back("dead: nothing the forward produced depends on it");
      } else {
        attributes = {"shape=box", "style=\"rounded,filled\"", "fillcolor=white"};
      }
    }
    for (int32_t parent : op.parent_indices) {
      if (parent < 0) continue;
      const Op& from = ops[parent];
      if (shown(from)) {
        link(parent, i, "");
        continue;
      }
      if (!from.is_buffer_version()) continue;  // hidden bookkeeping op: its buffers are listed
      hidden.push_back(absl::StrCat(from.address, ":", from.buffer_pass));
      // Keep the data flow through a hidden written version visible.
      for (int32_t writer : from.parent_indices) {
        if (writer >= 0 && shown(ops[writer])) link(writer, i, " [style=dashed]");
      }
    }
    if (drawn[group_index]) continue;  // an earlier member drew the group's node
    drawn[group_index] = true;
    std::string cluster = op.is_input() || op.is_output() ? std::string() : op.module_address;
    if (group.kind == RenderGroup::Kind::kModule) {
      auto module = trace.modules().find(group.name);
      text = absl::StrCat(group.name,
                          module == trace.modules().end() || module->second.type_name.empty()
                              ? ""
                              : absl::StrCat(" (", module->second.type_name, ")"),
                          "\n", group.compute_ops, group.compute_ops == 1 ? " op" : " ops");
      if (options.rolled && group.passes > 1) {
        absl::StrAppend(&text, ", ", group.passes, " calls");
      } else if (!options.rolled && calls_of[group.name] > 1) {
        absl::StrAppend(&text, ", call ", group.call, " of ", calls_of[group.name]);
      }
      attributes = {"shape=box3d", "style=filled", "fillcolor=\"#dde6f5\""};
      hidden.clear();
      tooltip = {absl::StrCat("collapsed: ", group.name, " starting at ", op.label)};
      code.clear();
      const size_t dot = group.name.rfind('.');
      cluster = dot == std::string::npos ? std::string() : group.name.substr(0, dot);
    } else if (group.kind == RenderGroup::Kind::kLayer && group.passes > 1 &&
               op.is_buffer_version()) {
      // A rolled buffer: its versions' reads and writes, not its first version's kind.
      const auto& [read, writes] = versions_of_group[group_index];
      std::vector<std::string> kinds;
      for (const WriteKind kind : writes) {
        const std::string name(WriteKindName(kind));
        if (std::find(kinds.begin(), kinds.end(), name) == kinds.end()) kinds.push_back(name);
      }
      std::vector<std::string> what;
      if (read) what.push_back("read");
      if (!writes.empty()) {
        what.push_back(absl::StrCat(writes.size(), writes.size() == 1 ? " write (" : " writes (",
                                    absl::StrJoin(kinds, ", "), ")"));
      }
      text = absl::StrCat(op.address, "\n", absl::StrJoin(what, ", "), " ",
                          FormatShape(op.tensor_shape), "\n", group.passes, " versions");
    } else if (group.kind == RenderGroup::Kind::kLayer && group.passes > 1) {
      // The first line names the layer, not one pass of it.
      text = absl::StrCat(group.name, text.substr(std::min(text.find('\n'), text.size())), "\n",
                          group.passes, " passes");
    }
    if (!hidden.empty()) {
      attributes.push_back("peripheries=2");
      tooltip.push_back(absl::StrCat("Hidden buffers: ", absl::StrJoin(hidden, ", ")));
    }
    tooltip.insert(tooltip.end(), code.begin(), code.end());
    if (!tooltip.empty()) {
      attributes.push_back(absl::StrCat("tooltip=", Quote(absl::StrJoin(tooltip, "\n"))));
    }
    attributes.push_back(absl::StrCat("label=", Quote(text)));
    cluster_of(cluster).statements.push_back(
        absl::StrCat(NodeId(group_index), " [", absl::StrJoin(attributes, ", "), "];"));
  }

  std::string dot =
      "digraph torchlens {\n"
      "  rankdir=TB;\n"
      "  node [fontname=\"Helvetica\", fontsize=10];\n"
      "  edge [color=\"#555555\"];\n";
  // Clusters, depth first.
  std::function<void(const std::string&, int)> emit = [&](const std::string& address, int depth) {
    const Cluster& cluster = clusters[address];
    const std::string indent(2 * depth, ' ');
    for (const std::string& statement : cluster.statements)
      absl::StrAppend(&dot, indent, statement, "\n");
    for (const std::string& child : cluster.children) {
      const Cluster& inner = clusters[child];
      if (inner.children.empty() && inner.statements.size() == 1) {
        // A module drawn as one node needs no frame around it: its node says "@module".
        // Graphviz lays out each cluster on its own, which makes a model with a module per
        // op many times slower to draw.
        absl::StrAppend(&dot, indent, inner.statements[0], "\n");
        continue;
      }
      auto module = trace.modules().find(child);
      const std::string title = module == trace.modules().end() || module->second.type_name.empty()
                                    ? child
                                    : absl::StrCat(child, " (", module->second.type_name, ")");
      absl::StrAppend(&dot, indent, "subgraph ", Quote(absl::StrCat("cluster_", child)), " {\n",
                      indent, "  label=", Quote(title),
                      "; style=\"rounded,dashed\"; color=\"#8888aa\";\n");
      emit(child, depth + 1);
      absl::StrAppend(&dot, indent, "}\n");
    }
  };
  emit("", 1);
  for (const std::string& edge : edges) absl::StrAppend(&dot, "  ", edge, ";\n");
  if (options.show_backward) {
    // NOTE [Gradients in a trace] in graph/gradients.h: the latest backward, in a frame of
    // its own colour beside the forward, each op tied to the forward node it differentiates
    // by a dotted line that does not move the layout.
    const std::vector<const Op*> backward = trace.backward_ops();
    if (!backward.empty()) {
      absl::StrAppend(&dot,
                      "  subgraph \"cluster_backward\" {\n"
                      "    label=\"backward (the latest backward(), gradients flowing down)\"; "
                      "style=\"rounded,filled\"; color=\"#9b6bc0\"; fillcolor=\"#f7f0fb\";\n");
      absl::flat_hash_map<absl::string_view, size_t> index;
      for (size_t b = 0; b < backward.size(); ++b) {
        const Op& op = *backward[b];
        index.emplace(op.label, b);
        std::string text = absl::StrCat(op.label, "\n", FormatShape(op.tensor_shape));
        if (!op.address.empty()) absl::StrAppend(&text, "\n", op.address);
        absl::StrAppend(&dot, "    b", b,
                        " [shape=box, style=\"rounded,filled\", fillcolor=\"#e4d0f2\", "
                        "color=\"#9b6bc0\", tooltip=",
                        Quote(absl::StrCat("differentiates ",
                                           op.address.empty() ? op.forward_label : op.address)),
                        ", label=", Quote(text), "];\n");
      }
      absl::StrAppend(&dot, "  }\n");
      for (size_t b = 0; b < backward.size(); ++b) {
        const Op& op = *backward[b];
        for (const std::string& child : op.children) {
          auto it = index.find(child);
          if (it != index.end())
            absl::StrAppend(&dot, "  b", b, " -> b", it->second, " [color=\"#9b6bc0\"];\n");
        }
        // A parameter's accumulation is drawn with its parameter's name, untied.
        const int forward = !op.address.empty() || op.forward_label.empty()
                                ? -1
                                : trace.IndexOfLabel(op.forward_label);
        if (forward < 0 || !drawn[grouping.group_of[forward]]) continue;
        absl::StrAppend(&dot, "  b", b, " -> ", NodeId(grouping.group_of[forward]),
                        " [style=dotted, color=\"#9b6bc0\", arrowhead=none, "
                        "constraint=false];\n");
      }
    }
  }
  dot += "}\n";
  return dot;
}

absl::Status RenderToFile(const Trace& trace, const std::string& path, RenderOptions options) {
  std::string format;
  for (const char* candidate : {"svg", "png", "pdf"}) {
    if (absl::EndsWithIgnoreCase(path, absl::StrCat(".", candidate))) format = candidate;
  }
  if (format.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot render to '", path, "': the file name must end in .svg, .png or .pdf"));
  }
  const std::string dot = RenderDot(trace, options);
  // One Graphviz context for the process, used under a lock: Graphviz is not thread-safe,
  // and freeing a context leaves its text-layout plugin's font cache dangling (a
  // use-after-free in libgvplugin_pango on the next context, seen under ASan).
  static std::mutex* graphviz_mutex = new std::mutex();
  static GVC_t* graphviz = gvContext();
  std::lock_guard<std::mutex> lock(*graphviz_mutex);
  GVC_t* const context = graphviz;
  if (context == nullptr) return absl::InternalError("Graphviz: cannot create a context");
  Agraph_t* graph = agmemread(dot.c_str());
  if (graph == nullptr) return absl::InternalError("Graphviz: cannot parse the generated DOT");
  // NOTE [Graphviz never writes files]
  // Graphviz's own file output ends the process when a write fails (`gvwrite_no_z
  // problem 7`, then exit(1): a full disk or /dev/full). It therefore renders into
  // memory, where writes cannot fail, and WriteFileBytes writes the file with every error
  // a status.
  absl::Status status;
  char* rendered = nullptr;
  unsigned int length = 0;
  if (gvLayout(context, graph, "dot") != 0) {
    status = absl::InternalError("Graphviz: layout failed");
  } else {
    if (gvRenderData(context, graph, format.c_str(), &rendered, &length) != 0 ||
        rendered == nullptr) {
      status = absl::InternalError(absl::StrCat("Graphviz: rendering ", format, " failed"));
    }
    gvFreeLayout(context, graph);
  }
  agclose(graph);
  if (status.ok()) {
    status = WriteFileBytes(path, absl::string_view(rendered, length), "rendered graph");
  }
  if (rendered != nullptr) gvFreeRenderData(rendered);
  return status;
}

}  // namespace torchlens

// LeakSanitizer (tools/bazelw test --config=asan): Graphviz's text layout loads fontconfig,
// pango and cairo, which keep font caches for the life of the process by design. Only a
// LeakSanitizer build calls this hook.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libfontconfig.so\nleak:libpango\nleak:libcairo.so\nleak:libgvc.so\n"
         "leak:libgvplugin_\nleak:libglib-2.0.so\nleak:libgobject-2.0.so\n";
}

// Used suppressions are printed to stderr at exit by default, which would add lines to the
// command-line tool's one-line errors.
extern "C" const char* __lsan_default_options() { return "print_suppressions=0"; }
