#!/usr/bin/python3
"""Reads a trace file, its JSON and its SVG from Python; exits non-zero on any mismatch.

usage: check_trace_file.py TRACE.pt TRACE.json GRAPH.svg FIELDS.txt

FIELDS.txt is what tools/op_fields prints: the field table (graph/op_fields.h) that each
op of the trace file and of the JSON follows.

The trace is of testdata/demo.pt in training mode. Values are checked against PyTorch
recomputing them in Python, an oracle independent of the C++ capture.
"""

import inspect
import json
import sys
import xml.dom.minidom

import torch
import torch.nn.functional as F


def read_fields(fields_path):
    """The field table: every field in order, and the metadata ones (JSON's)."""
    with open(fields_path) as f:
        rows = [line.split() for line in f if line.strip()]
    assert rows and all(len(row) == 2 and row[1] in ("metadata", "saved_value") for row in rows)
    return [name for name, _ in rows], [name for name, kind in rows if kind == "metadata"]


def main(trace_path, json_path, svg_path, fields_path):
    fields, metadata = read_fields(fields_path)
    trace = torch.load(trace_path)
    assert trace["format"] == "torchlens.trace", trace["format"]
    assert trace["version"] == 4
    assert trace["training"] is True
    ops = {op["label"]: op for op in trace["ops"]}
    labels = [op["label"] for op in trace["ops"]]
    assert labels[0] == "input_1", labels[:3]
    assert "conv2d_1_2:1" in ops and "log_softmax_1_15:1" in ops, labels
    # Every op holds the table's fields in its order; arguments Python cannot read are
    # marked by "creation_args_complete", beside "creation_args".
    file_fields = fields[:fields.index("creation_args") + 1] + ["creation_args_complete"] + \
        fields[fields.index("creation_args") + 1:]
    for op in trace["ops"]:
        assert list(op.keys()) == file_fields, (op["label"], list(op.keys()), file_fields)

    # Values: each op recomputed in Python from its parents' saved values.
    stem = ops["conv2d_1_2:1"]
    assert stem["module_address"] == "stem"
    weight, bias = stem["creation_args"][1], stem["creation_args"][2]
    expected = F.conv2d(ops["input_1"]["out"], weight, bias, padding=1)
    assert torch.allclose(stem["out"], expected, atol=1e-6), "conv2d value"
    relu = ops["relu_1_6:1"]
    assert relu["parents"] == ["batch_norm_1_5:1"], relu["parents"]
    assert torch.equal(relu["out"], torch.relu(ops["batch_norm_1_5:1"]["out"])), "relu value"
    softmax = ops["log_softmax_1_15:1"]
    assert torch.allclose(softmax["out"], F.log_softmax(ops["linear_1_14:1"]["out"], dim=1))
    assert torch.equal(ops["output_1"]["out"], softmax["out"])

    # Source positions: the stem's conv2d ran at the line of Conv2d._conv_forward that
    # calls F.conv2d (Python's inspect is the oracle); ops outside TorchScript code have none.
    lines, first = inspect.getsourcelines(torch.nn.Conv2d._conv_forward)
    conv_lines = [first + i for i, line in enumerate(lines) if "return F.conv2d(input" in line]
    position = stem["source_position"]
    assert position["file"].endswith("torch/nn/modules/conv.py"), position
    assert position["line"] in conv_lines, (position, conv_lines)
    assert position["text"] == lines[position["line"] - first].strip(), position
    assert position["branches"] == [] or all(b["taken"] in ("then", "else")
                                             for b in position["branches"]), position
    assert ops["input_1"]["source_position"] is None

    # Buffers: BatchNorm running statistics written by the fused kernel.
    buffers = {b["address"]: b for b in trace["buffers"]}
    mean = buffers["block1.bn.running_mean"]
    bn_input = ops["conv2d_2_3:1"]["out"]
    assert torch.allclose(mean["final_value"],
                          0.9 * mean["initial_value"] + 0.1 * bn_input.mean(dim=(0, 2, 3)),
                          atol=1e-6), "running_mean"
    versions = [op for op in trace["ops"] if op["is_buffer"] and op["address"] == "block1.bn.running_mean"]
    assert [v["buffer_write_kind"] for v in versions] == [None, "fused"], versions
    assert versions[1]["buffer_value_changed"] is True
    calls = buffers["calls"]
    assert calls["final_value"].item() == calls["initial_value"].item() + 1
    # The buffer entity (TorchLens's names): its version labels, initial read first, as the
    # ops list them; one write kind per write. In training each statistic is written once
    # by the fused kernel, the counters once in place (calls += 1, num_batches_tracked += 1).
    expected_kinds = {"running_mean": ["fused"], "running_var": ["fused"],
                      "num_batches_tracked": ["inplace"], "calls": ["inplace"]}
    for address, buffer in buffers.items():
        listed = [op["label"] for op in trace["ops"] if op["is_buffer"] and op["address"] == address]
        assert buffer["versions"] == listed, (address, buffer["versions"], listed)
        assert buffer["write_kinds"] == expected_kinds[address.rsplit(".", 1)[-1]], (address, buffer)
        assert buffer["num_overwrites"] == 1, (address, buffer["num_overwrites"])
        assert ops[buffer["versions"][-1]]["buffer_write_kind"] == buffer["write_kinds"][-1]

    # JSON: the same graph, with its schema.
    with open(json_path) as f:
        meta = json.load(f)
    assert meta["schema"] == "torchlens.trace.json" and meta["version"] == 3
    assert [op["label"] for op in meta["ops"]] == labels
    for op in meta["ops"]:  # the table's metadata, and the gradient's norm
        assert list(op.keys()) == metadata + ["grad_norm"], (op["label"], list(op.keys()), metadata)
    assert meta["ops"][labels.index("relu_1_6:1")]["parents"] == ["batch_norm_1_5:1"]
    assert meta["ops"][labels.index("conv2d_1_2:1")]["source_position"] == position
    for entry in meta["buffers"]:
        buffer = buffers[entry["address"]]
        assert (entry["versions"], entry["num_overwrites"], entry["write_kinds"]) == \
            (buffer["versions"], buffer["num_overwrites"], buffer["write_kinds"]), entry

    # SVG: well-formed XML with one node per drawn op (BatchNorm bookkeeping hidden).
    svg = xml.dom.minidom.parse(svg_path)
    nodes = [g for g in svg.getElementsByTagName("g") if g.getAttribute("class") == "node"]
    hidden = [op for op in trace["ops"] if op["is_buffer"] and
              op["address"].rsplit(".", 1)[-1] in ("running_mean", "running_var", "num_batches_tracked")]
    # ... and the ops that only update them: training's num_batches_tracked.add_(1).
    hidden_labels = {op["label"] for op in hidden}
    hidden += [op for op in trace["ops"] if not op["is_buffer"] and op["children"] and op["parents"] and
               set(op["parents"]) <= hidden_labels and set(op["children"]) <= hidden_labels]
    assert sum(op["type"] == "add_" for op in hidden) == 2, [op["label"] for op in hidden]
    assert len(nodes) == len(trace["ops"]) - len(hidden), (len(nodes), len(trace["ops"]), len(hidden))
    print("python read", len(labels), "nodes,", len(buffers), "buffers: OK")


if __name__ == "__main__":
    main(*sys.argv[1:])
