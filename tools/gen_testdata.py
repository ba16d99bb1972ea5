#!/usr/bin/python3
"""Generates torchlens' test models and the values eager PyTorch computes for them.

Run with Debian's python3-torch (1.13):   /usr/bin/python3 tools/gen_testdata.py

For each model NAME it writes, into testdata/:
  NAME.pt           the model scripted with torch.jit.script, in its initial state
  NAME.expected.pt  a scripted container whose buffers are the oracle values:
                      input_0, input_1, ...    the inputs the tests feed
                      output_0, output_1, ...  eager PyTorch's outputs for those inputs
                      buffer__ADDRESS          every registered buffer after the forward
                                               (dots in the address become "__")
                      initial__ADDRESS         every registered buffer before it
The eager module (not the scripted one) computes the expected values, so the tests compare
the C++ capture against an independent oracle. Everything is seeded: re-running the
generator reproduces the same values.
"""

import copy
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")


# ---------------------------------------------------------------------------------------
# Issue 2: capture and graph.

class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Linear(2 * 3 * 3, 2)

    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(y, 1))


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class LoopReuse(nn.Module):
    """A TorchScript loop that runs the same submodule three times."""

    def __init__(self):
        super().__init__()
        self.cell = Cell()

    def forward(self, x):
        for _ in range(3):
            x = self.cell(x)
        return x


class MultiOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        y = self.fc(x)
        return torch.sigmoid(y), y * 2.0


class CallTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))


class InplaceAfterRead(nn.Module):
    """y is saved as relu's output, then overwritten in place by mul_."""

    def forward(self, x):
        y = torch.relu(x)
        z = y + 1.0
        y.mul_(3.0)
        return z, y


class Raises(nn.Module):
    """Throws from an op when x has a negative first element (a shape error)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        if bool(x[0, 0] < 0.0):
            y = y @ torch.ones(5, 5)  # shapes do not fit: the op throws
        return y


# ---------------------------------------------------------------------------------------
# Issue 3: registered buffers.

class SeedRecurrent(nn.Module):
    """The seed example: self.h = tanh(self.h + x), twice."""

    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(2))

    def forward(self, x):
        self.h = torch.tanh(self.h + x)
        self.h = torch.tanh(self.h + x)
        return self.h


class RecurrentLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(3))
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        for _ in range(4):
            self.h = torch.tanh(self.fc(self.h) + x)
        return self.h


class MulAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.ones(2))

    def forward(self, x):
        self.b.mul_(2.0)
        self.b.add_(x)
        return x * 1.0


class CopyInto(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(3))

    def forward(self, x):
        self.b.copy_(x)
        return x + 1.0


class SliceCopy(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(4))

    def forward(self, x):
        self.b[:2].copy_(x)
        return x * 2.0


class SliceAssign(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(4))

    def forward(self, x):
        self.b[:2] = x
        return x * 2.0


class ReadOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.tensor([1.0, 2.0]))

    def forward(self, x):
        return x + self.b


class AddThenMul(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.ones(2))

    def forward(self, x):
        y = self.b.add_(x)
        return y * self.b


class ReturnBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.tensor([3.0, 4.0]))

    def forward(self, x):
        return self.b


class Bn1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(x)


class Bn2d(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(2)

    def forward(self, x):
        return self.bn(x)


class InstanceNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm1d(2, track_running_stats=True)

    def forward(self, x):
        return self.norm(x)


class ManyBuffers(nn.Module):
    """48 buffers nobody touches and 8 in-place writes to one more."""

    def __init__(self):
        super().__init__()
        for i in range(48):
            self.register_buffer(f"unused_{i}", torch.full((2,), float(i)))
        self.register_buffer("counter", torch.zeros(2))

    def forward(self, x):
        for _ in range(8):
            self.counter.add_(x)
        return self.counter * 1.0


class CounterCell(nn.Module):
    """Issue 5's threading example: b takes 1, 2, 3 while relu(cell(h) + b) runs."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(4))
        self.cell = nn.Linear(4, 4)

    def forward(self, h):
        for _ in range(3):
            self.b.add_(1.0)
            h = torch.relu(self.cell(h) + self.b)
        return h


class CausalMaskBn(nn.Module):
    """An eval-mode BatchNorm beside an architectural buffer used in the forward."""

    def __init__(self):
        super().__init__()
        self.register_buffer("causal_mask", torch.tril(torch.ones(4, 4)))
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(x @ self.causal_mask)


class BnLoop(nn.Module):
    """One BatchNorm applied five times in a loop (training mode: five fused writes)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        for _ in range(5):
            x = self.bn(x) * 1.5
        return x


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.fc(x)))


class InplaceActivation(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        h.add_(1.0)
        return h * 2.0


class GrowingList(nn.Module):
    """DenseNet's pattern: the list passed to torch.cat is appended to afterwards."""

    def forward(self, x):
        features = [x]
        for _ in range(3):
            y = torch.relu(torch.cat(features, 1)).sum(1, keepdim=True)
            features.append(y)
        return torch.cat(features, 1)


class StochasticDepth(nn.Module):
    """torchvision's stochastic depth: an uninitialized tensor filled by bernoulli_."""

    def forward(self, x):
        noise = torch.empty([x.shape[0], 1], dtype=x.dtype, device=x.device)
        noise = noise.bernoulli_(0.5)
        return x * noise


class ModuleListLoop(nn.Module):
    """torchvision's ASPP pattern: a ModuleList iterated in a loop, BatchNorms inside."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(
            [nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)) for _ in range(2)])

    def forward(self, x):
        outputs = []
        for conv in self.convs:
            outputs.append(conv(x))
        return torch.cat(outputs, 1)


class PadThroughView(nn.Module):
    """torchvision's batch_images: a new tensor filled through a slice, then used whole."""

    def forward(self, x):
        padded = torch.zeros(2, 4)
        padded[:, :3].copy_(x)
        return padded * 2.0


class ConvBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Demo(nn.Module):
    """The model `tools/bazelw run //tools:torchlens` traces when given no --model."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block1 = ConvBlock(8)
        self.block2 = ConvBlock(8)
        self.head = nn.Linear(8, 10)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls.add_(1.0)
        x = self.stem(x)
        x = x + self.block2(self.block1(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.log_softmax(self.head(x), dim=1)


# ---------------------------------------------------------------------------------------
# Issue 17: hostile inputs and faults.

class ChecksInput(nn.Module):
    """Asserts and raises on its input: a failing forward names the cause and the line."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        assert x.dim() == 2, "expected a 2-D input"
        if bool(x.sum() > 100):
            raise ValueError("the input sums to more than 100")
        return self.fc(x)


def _double(x):
    return x * 2


def _double_on_another_thread(x):
    return torch.jit.wait(torch.jit.fork(_double, x))


class Forks(nn.Module):
    """torch.jit.fork / wait: the mul runs on one of the interpreter's other threads."""

    def forward(self, x):
        future = torch.jit.fork(_double, x)
        y = torch.relu(x)
        return torch.jit.wait(future) + y


class ForksInHelper(nn.Module):
    """The fork hides in a free function the forward calls."""

    def forward(self, x):
        return _double_on_another_thread(x) + 1


class SparseOutput(nn.Module):
    """Returns a sparse tensor: trace files cannot hold it in a form Python reads."""

    def forward(self, x):
        return torch.relu(x).to_sparse()


class NestedLeaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(x)


class NestedWrap(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return torch.relu(self.inner(x))


def nested(depth):
    """`depth` modules, each wrapping the next: inner.inner.(...).fc (issue 17)."""
    def make():
        module = NestedLeaf()
        for _ in range(depth):
            module = NestedWrap(module)
        return module
    return make


# ---------------------------------------------------------------------------------------

def randomize_running_stats(module):
    """Non-trivial running statistics, so that eval-mode models use them visibly."""
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)


# name: (factory, inputs, training)
def models():
    g = torch.Generator().manual_seed(1234)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    return {
        "mlp": (Mlp, [rand(2, 4)], False),
        "convbn_train": (ConvBn, [rand(2, 1, 5, 5)], True),
        "convbn_eval": (ConvBn, [rand(2, 1, 5, 5)], False),
        "loop_reuse": (LoopReuse, [rand(1, 3)], False),
        "multi_output": (MultiOutput, [rand(2, 3)], False),
        "call_twice": (CallTwice, [rand(2, 3)], False),
        "inplace_after_read": (InplaceAfterRead, [rand(2, 3)], False),
        "raises": (Raises, [rand(2, 3).abs()], False),
        "seed_recurrent": (SeedRecurrent, [torch.ones(2)], False),
        "recurrent_loop": (RecurrentLoop, [rand(3)], False),
        "mul_add": (MulAdd, [torch.tensor([0.5, -1.0])], False),
        "copy_into": (CopyInto, [torch.tensor([1.0, 2.0, 3.0])], False),
        "slice_copy": (SliceCopy, [torch.ones(2)], False),
        "slice_assign": (SliceAssign, [torch.tensor([5.0, 6.0])], False),
        "read_only": (ReadOnly, [torch.tensor([10.0, 20.0])], False),
        "add_then_mul": (AddThenMul, [torch.tensor([1.0, 2.0])], False),
        "return_buffer": (ReturnBuffer, [torch.zeros(1)], False),
        "bn1d_train": (Bn1d, [rand(4, 3)], True),
        "bn2d_train": (Bn2d, [rand(3, 2, 2, 2)], True),
        "bn2d_eval": (Bn2d, [rand(3, 2, 2, 2)], False),
        "instancenorm_train": (InstanceNorm, [rand(2, 2, 5)], True),
        "many_buffers": (ManyBuffers, [torch.tensor([1.0, 0.5])], False),
        "counter_cell": (CounterCell, [rand(1, 4)], False),
        "causal_mask_bn": (CausalMaskBn, [rand(3, 4)], False),
        "demo": (Demo, [rand(1, 3, 16, 16)], False),
        "bn_loop_train": (BnLoop, [rand(4, 3)], True),
        "dropout_train": (DropoutNet, [rand(3, 6)], True),
        "inplace_activation": (InplaceActivation, [rand(1, 3)], False),
        "growing_list": (GrowingList, [rand(2, 2)], False),
        "stochastic_depth_train": (StochasticDepth, [rand(6, 3)], True),
        "modulelist_train": (ModuleListLoop, [rand(2, 2, 3, 3)], True),
        "pad_through_view": (PadThroughView, [rand(2, 3)], False),
        "checks_input": (ChecksInput, [rand(2, 3)], False),
        "forks": (Forks, [rand(2, 3)], False),
        "forks_in_helper": (ForksInHelper, [rand(2, 3)], False),
        "sparse_output": (SparseOutput, [rand(2, 3)], False),
        "nested_150": (nested(150), [rand(1, 2)], False),
    }


class Expected(nn.Module):
    def __init__(self, values):
        super().__init__()
        for key, value in values.items():
            self.register_buffer(key, value.detach().clone())

    def forward(self):
        return 0


def flatten_outputs(out):
    if isinstance(out, torch.Tensor):
        return [out.to_dense() if out.is_sparse else out]
    result = []
    for item in out:
        result.extend(flatten_outputs(item))
    return result


def buffer_key(prefix, address):
    return prefix + "__" + address.replace(".", "__")


def generate(name, factory, inputs, training):
    torch.manual_seed(0)
    model = factory()
    randomize_running_stats(model)
    model.train(training)
    scripted = torch.jit.script(copy.deepcopy(model))
    scripted.save(os.path.join(OUT, name + ".pt"))

    values = {}
    for address, buf in model.named_buffers():
        values[buffer_key("initial", address)] = buf
    values = {k: v.clone() for k, v in values.items()}
    for i, x in enumerate(inputs):
        values[f"input_{i}"] = x
    eager = copy.deepcopy(model)
    with torch.no_grad():
        out = eager(*[x.clone() for x in inputs])
    for i, y in enumerate(flatten_outputs(out)):
        values[f"output_{i}"] = y
    for address, buf in eager.named_buffers():
        values[buffer_key("buffer", address)] = buf
    torch.jit.script(Expected(values)).save(os.path.join(OUT, name + ".expected.pt"))


def main():
    sys.setrecursionlimit(20000)  # scripting nested_150 recurses through every level
    os.makedirs(OUT, exist_ok=True)
    # An input file for `torchlens --input` (torch.save of a tensor).
    torch.save(torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(7)),
               os.path.join(OUT, "demo_input.pt"))
    only = set(sys.argv[1:])
    for name, (factory, inputs, training) in models().items():
        if only and name not in only:
            continue
        generate(name, factory, inputs, training)
        print("wrote", name)


if __name__ == "__main__":
    main()
