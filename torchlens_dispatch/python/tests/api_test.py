#!/usr/bin/python3
"""The Python API on TorchLens's documented buffer examples, run as a Python user writes them.

Expected values come from the examples' own semantics (tanh recurrences, counters that
count, BatchNorm's update rule) computed here in eager PyTorch, never from torchlens.
"""
import os
import sys
import tempfile
import warnings

# Bazel runs the test from its runfiles, where the built package is.
sys.path.insert(0, os.path.join(os.environ["TEST_SRCDIR"], "torchlens", "torchlens_dispatch", "python"))

import pytest  # noqa: E402
import torch  # noqa: E402

import torchlens_cpp as tl  # noqa: E402


class Cell(torch.nn.Module):
    """TorchLens's recurrent cell: a buffer `h` reassigned twice."""

    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(2))

    def forward(self, x):
        self.h = torch.tanh(self.h + x)
        self.h = torch.tanh(self.h + x)
        return self.h


class Counter(torch.nn.Module):
    """TorchLens's counter: `self.b.add_(1.0)` three times."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(()))

    def forward(self, x):
        for _ in range(3):
            self.b.add_(1.0)
        return x * self.b


class ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_cell_buffer_versions():
    x = torch.tensor([0.5, -1.0])
    first = torch.tanh(torch.zeros(2) + x)
    second = torch.tanh(first + x)
    trace = tl.trace(Cell(), x)
    h = trace.buffers["h"]
    assert torch.equal(h.initial_value, torch.zeros(2))
    assert len(h.versions) == 3
    assert h.num_overwrites == 2
    assert torch.equal(h.final_value, second)
    assert [v.buffer_write_kind for v in h.versions] == [None, "reassign", "reassign"]
    assert torch.equal(h.value_at(2), first)
    assert torch.equal(h.value_after(1), first)
    assert torch.equal(h.value_after(2), second)
    with pytest.raises(IndexError):
        h.value_at(4)
    with pytest.raises(IndexError):
        h.value_after(0)
    assert torch.equal(trace["h:3"].out, second)
    assert torch.equal(trace.output, second)
    assert trace.validate().passed


def test_edges_follow_the_seed():
    trace = tl.trace(Cell(), torch.ones(2))
    versions = trace.buffers["h"].versions
    # producer op -> buffer version -> reader op
    write = versions[1]
    producer = trace[write.parents[0]]
    assert producer.type == "tanh"
    assert write.label in producer.children
    reader = trace[write.children[0]]
    assert reader.type == "add"
    assert write.label in reader.parents
    assert versions[0].children == [trace.ops[2].label]


def test_batchnorm_train_versions_and_modules():
    torch.manual_seed(0)
    model = ConvBn().train()
    x = torch.randn(2, 3, 6, 6)
    conv_out = model.conv(x).detach()
    expected_mean = 0.9 * torch.zeros(4) + 0.1 * conv_out.mean((0, 2, 3))
    trace = tl.trace(model, x)
    mean = trace["bn.running_mean:2"]
    assert mean.is_buffer and mean.buffer_write_kind == "fused"
    assert mean.buffer_value_changed is True
    assert torch.allclose(mean.out, expected_mean, atol=1e-6)
    assert trace["bn.running_mean:1"].buffer_write_kind is None
    count = trace["bn.num_batches_tracked:2"]
    assert count.buffer_write_kind == "inplace"
    assert int(count.out) == 1
    assert trace.buffers["bn.num_batches_tracked"].num_overwrites == 1
    assert sorted(trace.modules["bn"].buffers) == [
        "bn.num_batches_tracked", "bn.running_mean", "bn.running_var"]
    assert trace.modules["bn"].type_name == "BatchNorm2d"
    assert trace.params["conv.weight"].shape == (4, 3, 3, 3)
    assert trace.params["conv.weight"].module_address == "conv"
    # In execution order: the counter's add_ runs before the kernel updates the statistics.
    assert [o.address for o in trace.buffer_write_ops] == [
        "bn.num_batches_tracked", "bn.running_mean", "bn.running_var"]
    assert all(o.is_buffer and o.buffer_write_kind is None for o in trace.buffer_read_ops)
    assert trace.validate().passed


def test_counter_edit_threads_through_versions():
    trace = tl.trace(Counter(), torch.ones(2))
    assert [float(v.out) for v in trace.buffers["b"].versions] == [0.0, 1.0, 2.0, 3.0]
    edited = trace.do({"b:1": torch.tensor(7.0)})
    assert [float(v.out) for v in edited.buffers["b"].versions] == [7.0, 8.0, 9.0, 10.0]
    assert torch.equal(edited[edited.output_labels[0]].out, torch.full((2,), 10.0))
    # The original is never written.
    assert [float(v.out) for v in trace.buffers["b"].versions] == [0.0, 1.0, 2.0, 3.0]


def test_fused_write_gap_warns_and_strict_raises():
    torch.manual_seed(1)
    model = ConvBn().train()
    trace = tl.trace(model, torch.randn(2, 3, 5, 5))
    bn = next(o for o in trace.ops if o.type == "batch_norm")
    edit = {bn.label: torch.zeros_like(bn.out)}
    with pytest.warns(tl.BufferThreadGapWarning):
        edited = trace.do(edit)
    # The running statistics keep their captured values (the gap the warning names).
    assert torch.equal(edited["bn.running_mean:2"].out, trace["bn.running_mean:2"].out)
    assert torch.equal(edited[edited.output_labels[0]].out,
                       torch.zeros_like(trace[trace.output_labels[0]].out))
    with pytest.raises(tl.BufferThreadGapError):
        trace.do(edit, strict=True)
    assert issubclass(tl.BufferThreadGapWarning, UserWarning)
    assert issubclass(tl.BufferThreadGapError, tl.Error)
    assert issubclass(tl.Error, RuntimeError)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.BufferThreadGapWarning)
        with pytest.raises(tl.BufferThreadGapWarning):
            trace.do(edit)


class SetData(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.ones(3))

    def forward(self, x):
        self.mask.data = torch.zeros(3)
        return x + self.mask


def test_data_assignment_is_unjournaled():
    with pytest.raises(tl.UnjournaledBufferWriteError, match="mask"):
        tl.trace(SetData(), torch.ones(3))
    trace = tl.trace(SetData(), torch.ones(3), allow_unjournaled_writes=True)
    assert len(trace.diagnostics) == 1 and '"mask"' in trace.diagnostics[0]
    assert issubclass(tl.UnjournaledBufferWriteError, tl.Error)


def test_show_buffers_modes():
    torch.manual_seed(2)
    trace = tl.trace(ConvBn().train(), torch.randn(1, 3, 5, 5))
    always = trace.to_dot(show_buffers="always")
    meaningful = trace.to_dot(show_buffers="meaningful")
    never = trace.to_dot()  # meaningful is the default
    assert never == meaningful
    assert always.count("shape=cylinder") == 6  # three buffers, a read and a write each
    assert meaningful.count("shape=cylinder") == 0  # BatchNorm's bookkeeping is hidden
    assert "peripheries=2" in meaningful
    cell = tl.trace(Cell(), torch.ones(2))
    assert cell.to_dot(show_buffers="never").count("shape=cylinder") == 0
    assert cell.to_dot(show_buffers="meaningful").count("shape=cylinder") == 3
    with pytest.raises(ValueError):
        cell.to_dot(show_buffers="sometimes")


def test_lookups():
    trace = tl.trace(Cell(), torch.ones(2))
    with pytest.raises(KeyError):
        trace["relu_9_9:1"]
    assert "h:1" in trace and "nothing:1" not in trace
    assert len(trace) == len(trace.ops)
    assert trace.input_labels == ["input_1"]
    assert trace.output_labels == ["output_1"]
    assert "h" in trace.buffers and len(trace.buffers) == 1
    assert "Cell" == trace.modules[""].type_name
    assert repr(trace["h:1"]).startswith("<Op ")


def test_save_load_render(tmp_path):
    trace = tl.trace(Cell(), torch.ones(2))
    path = str(tmp_path / "cell.pt")
    trace.save(path)
    loaded = tl.load(path)
    assert [o.label for o in loaded.ops] == [o.label for o in trace.ops]
    assert torch.equal(loaded.buffers["h"].final_value, trace.buffers["h"].final_value)
    assert loaded.validate().passed
    # The file is what torch.load reads.
    raw = torch.load(path)
    assert "buffers" in raw
    svg = str(tmp_path / "cell.svg")
    trace.render(svg, show_buffers="always")
    assert open(svg).read().lstrip().startswith(("<?xml", "<svg"))
    with pytest.raises(tl.Error):
        tl.load(str(tmp_path / "missing.pt"))


if __name__ == "__main__":
    # Bazel runs a link named after the target; pytest collects only *.py files.
    sys.exit(pytest.main([os.path.realpath(__file__), "-q", "-p", "no:cacheprovider"]))
