#!/usr/bin/python3
"""Generates torchlens' test models and the values eager PyTorch computes for them.

(Over 600 lines on purpose: one small class per test model, each beside the values it
must produce, and the tests name them; a model is read where it is defined.)

Run with Debian's python3-torch (1.13):   /usr/bin/python3 tools/gen_testdata.py

For each model NAME it writes, into testdata/:
  NAME.pt           the model scripted with torch.jit.script, in its initial state
  NAME.expected.pt  a scripted container whose buffers are the oracle values:
                      input_0, input_1, ...    the inputs the tests feed
                      output_0, output_1, ...  eager PyTorch's outputs for those inputs
                      buffer__ADDRESS          every registered buffer after the forward
                                               (dots in the address become "__")
                      initial__ADDRESS         every registered buffer before it
and testdata/MANIFEST, the hashes that //tools:testdata_manifest_test checks: edit the
generator, then regenerate every model, or that test fails.
The eager module (not the scripted one) computes the expected values, so the tests compare
the C++ capture against an independent oracle. Everything is seeded: re-running the
generator reproduces the same values.
"""

import copy
import inspect
import os
import sys
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

import gen_testdata_grads
import testdata_manifest

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
# Issue 16 (verdicts), 22 (writes through views) and 17 (perturbation that proves): each
# a correct forward pass that must validate, and whose interventions must equal eager
# PyTorch's recomputation of the edited model (see EDITS below).

class DataCopy(nn.Module):
    """`buf.data.copy_(x)`: prim::data is not dispatched; the write is b's next version."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(3))

    def forward(self, x):
        self.b.data.copy_(x * 2.0)
        return self.b + 1.0


class SharedStorage(nn.Module):
    """Two registered buffers on one storage: c is a view of b's first two elements."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.arange(4.0))
        self.register_buffer("c", self.b[:2])

    def forward(self, x):
        self.c.add_(x)
        return self.b * 2.0, self.c + 1.0


class TransposedWrite(nn.Module):
    """A write covering the whole buffer through a permuted view."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(2, 2))

    def forward(self, x):
        self.b.t().copy_(x)
        return self.b * 1.0


class DoubleReassign(nn.Module):
    """Two reassignments of one buffer with no op between them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(2))

    def forward(self, x):
        a = x + 1.0
        b = x * 3.0
        self.h = a
        self.h = b
        return self.h - 1.0


class ReassignedStatistics(nn.Module):
    """Running statistics reassigned, then updated by a fused batch_norm in training."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(2))
        self.register_buffer("var", torch.ones(2))

    def forward(self, x):
        self.mean = x[0] * 1.0
        return F.batch_norm(x, self.mean, self.var, training=True, momentum=0.5)


class ReassignThenWrite(nn.Module):
    """A reassigned state written in place: the reassignment's version keeps its value."""

    def __init__(self):
        super().__init__()
        self.register_buffer("h", torch.zeros(2))

    def forward(self, x):
        self.h = x * 2.0
        self.h.add_(1.0)
        return self.h * 3.0


class PlainAttribute(nn.Module):
    """A tensor attribute that is not a registered buffer, used and returned."""

    def __init__(self):
        super().__init__()
        self.scale = torch.tensor([2.0, -1.0, 0.5])
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x) * self.scale, self.scale


class ReturnParam(nn.Module):
    """Returns a parameter as an output beside a computed value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(x), self.fc.bias


class SetStorage(nn.Module):
    """`self.b.set_(t)`: a dispatched in-place op that swaps the buffer's storage."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(3))

    def forward(self, x):
        self.b.set_(x * 2.0)
        self.b.add_(1.0)
        return self.b * 3.0


class BnMomentumZero(nn.Module):
    """momentum=0 in training: the running statistics never change value."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3, momentum=0.0)

    def forward(self, x):
        y = self.bn(x)
        # A second call reads the version the first call wrote.
        return self.bn(y * 2.0)


class BnCumulative(nn.Module):
    """momentum=None: a cumulative average weighted by 1 / num_batches_tracked."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3, momentum=None)

    def forward(self, x):
        return self.bn(x)


class NanBuffer(nn.Module):
    """A buffer holding NaN, written in place (NaN survives the write)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.tensor([float("nan"), 1.0, -0.0]))

    def forward(self, x):
        self.b.mul_(x)
        return self.b + 0.0


class TwoHeads(nn.Module):
    def forward(self, y):
        return torch.relu(y), torch.sigmoid(y) * 2.0


class DeadBranch(nn.Module):
    """Computes a value and discards it: torchvision's RPN returns its kept proposals'
    scores, which the caller drops (TorchScript keeps code across a call boundary)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.heads = TwoHeads()

    def forward(self, x):
        kept, unused = self.heads(self.fc(x))
        return kept


class ViewWrite(nn.Module):
    """The issue's example: a write through a view of an activation, then the base read."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        x = self.lin(x)
        y = x.unsqueeze(0)
        y.fill_(0.5)
        return x * 2.0


class ViewWritePartial(nn.Module):
    """Several writes through different views of one base, each covering part of it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        h[0].add_(1.0)
        h[:, 1].mul_(2.0)
        h.transpose(0, 1)[2].sub_(0.5)
        return h * 1.5


class ViewBeforeWrite(nn.Module):
    """A view taken before the base is written in place, read after the write."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        row = h[1]
        h.mul_(2.0)
        return row + 1.0, h


class InputViewWrite(nn.Module):
    """Writes the user's input tensor through a view of it."""

    def forward(self, x):
        x[0].zero_()
        return x * 2.0


class ViewOfViewWrite(nn.Module):
    """A write through a view of a view; the base is returned as well."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        v = h.view(3, 4)[1:]
        v[:, 2:].add_(10.0)
        return h - 1.0, h


class MaskedNan(nn.Module):
    """alpha.masked_fill(isnan(alpha), 0) where alpha holds no NaN."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        alpha = torch.softmax(self.fc(x), dim=-1)
        return alpha.masked_fill(torch.isnan(alpha), 0.0)


class TopkAny(nn.Module):
    """(topk_idx == i).any(dim=-1): a predicate over indices."""

    def forward(self, x):
        idx = x.topk(2, dim=-1).indices
        hit = (idx == 1).any(dim=-1)
        return x.sum(-1) * hit.float()


class LogNan(nn.Module):
    """log of negative numbers: NaN values flow through the rest of the forward."""

    def forward(self, x):
        y = torch.log(x)
        return y * 2.0 + 1.0


class PositiveCount(nn.Module):
    """int((x > 0).sum()) with exactly half the values positive."""

    def forward(self, x):
        n = int((x > 0).sum())
        return x * float(n)


class OutArguments(nn.Module):
    """out= destinations, a buffer and an activation: written whole, whatever they held."""

    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(2, 3))

    def forward(self, x):
        torch.add(x, 1.0, out=self.buf)
        y = torch.zeros(2, 3)
        torch.mul(x, 2.0, out=y)
        return self.buf * 2 + y


class OutPair(nn.Module):
    """out= calls with two destinations, two buffers and two activations: LibTorch's boxed
    wrapper returns references to them (NOTE [Written arguments outlive the boxed call])."""

    def __init__(self):
        super().__init__()
        self.register_buffer("values", torch.zeros(3))
        self.register_buffer("indices", torch.zeros(3, dtype=torch.long))

    def forward(self, x):
        torch.ops.aten.max(x, 1, False, max=self.values, max_values=self.indices)
        sorted_values = torch.empty(0)
        order = torch.empty(0, dtype=torch.long)
        torch.ops.aten.sort(x, 1, False, values=sorted_values, indices=order)
        return self.values * 2 + sorted_values[:, 0] + order[:, 0] + self.indices


class ScatterCover(nn.Module):
    """Writes that reach every element of their destination, whatever it held: scatter_ into
    a buffer with a permutation, and a permutation inverted by scattering into empty_like
    (pack_padded_sequence does this)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(3))

    def forward(self, x):
        self.b.scatter_(0, torch.tensor([2, 0, 1]), x[0])
        order = torch.argsort(x[1])
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel()))
        return self.b + 0, x[1][order][inverse] * 2


class IndexWrites(nn.Module):
    """More writes through an index that reach every element of their destination, or
    none: whatever the destination (or the value) held does not reach the output."""

    def forward(self, x):
        perm = torch.tensor([1, 2, 0])
        a = torch.zeros(3).scatter_reduce(0, perm, x[0], "sum", include_self=False)
        b = torch.zeros(2, 3).index_copy(1, perm, x)
        c = torch.zeros(3).index_fill_(0, perm, 2.0)
        d = torch.zeros(3).put_(perm, x[1])
        e = torch.zeros(3).index_reduce_(0, perm, x[0], "prod", include_self=False)
        f = x[1].clone().masked_fill_(x[1] == x[1], 4.0)
        g = x[0].index_fill(0, torch.zeros(0, dtype=torch.long), x[1].sum())
        return a + b[0] + c + d + e + f + g + torch.pow(x[0], 0)


class GuardsNotFired(nn.Module):
    """Branches their masks never select (no element above 5): masked_fill with a tensor
    value, where with out=, masked_scatter and a boolean-mask assignment."""

    def forward(self, x):
        filled = x.masked_fill(x > 5, torch.tensor(1.0))
        chosen = torch.empty(0)
        torch.where(x > 5, x * 3, x, out=chosen)
        scattered = x.masked_scatter(x > 5, x * 4)
        y = x.clone()
        y[y > 5] = 0.0
        return filled + chosen + scattered + y


class ShapeOnlyReads(nn.Module):
    """Ops that read their input only for its shape: fill and copy's destination."""

    def forward(self, x):
        return torch.fill(x, 2.0) * x.sum(), torch.ops.aten.copy(torch.zeros(2, 3), x) + 1


class ConjView(nn.Module):
    """A lazy conjugate view (c.conj() sets a bit instead of copying) read by a product."""

    def forward(self, x):
        c = torch.complex(x, x.flip(0))
        return torch.view_as_real(c * c.conj())


class LstsqGelsy(nn.Module):
    """lstsq's default CPU driver (gelsy) reads a pivot array LibTorch 1.13 never
    initialized: its rounding varies from call to call on the same arguments."""

    def forward(self, x):
        tall = torch.linalg.lstsq(x[:, :3], x).solution
        wide = torch.linalg.lstsq(x.t(), x[:3].t(), driver="gelsy").solution
        return tall, wide


class QuantizedNet(nn.Module):
    """Post-training static quantization: conv and linear run as quantized:: ops on packed
    parameters (TorchBind objects), which a trace file cannot pickle."""

    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv = nn.Conv2d(2, 3, 3)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(3 * 4 * 4, 4)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        x = self.relu(self.conv(self.quant(x)))
        return self.dequant(self.fc(x.flatten(1)))


def quantized_net():
    model = QuantizedNet().eval()
    model.qconfig = torch.ao.quantization.get_default_qconfig("fbgemm")
    torch.ao.quantization.prepare(model, inplace=True)
    model(torch.randn(8, 2, 6, 6, generator=torch.Generator().manual_seed(3)))
    return torch.ao.quantization.convert(model)


class ComplexScalar(nn.Module):
    """A Python complex scalar argument (`* (0.5 + 2j)`): a trace file pickles it as
    builtins.complex."""

    def forward(self, x):
        return torch.view_as_real(torch.complex(x, x * 2) * (0.5 + 2j))


class NanAbsorbs(nn.Module):
    """NaN in one argument decides the sum whatever the other holds: no perturbation of
    the ones can show through."""

    def forward(self, x):
        y = torch.log(x - 10.0)
        return y + torch.ones(y.shape), x * 2


class EqualChoices(nn.Module):
    """Selectors whose choices hold equal values, so no perturbation of the selector can
    show: where between equal branches, a fill with the value already there, heaviside's
    values with no zero input."""

    def forward(self, x):
        y = x * 2
        chosen = torch.where(x > 0, y, y)
        filled = torch.zeros(x.shape).masked_fill(x > 0.5, 0.0)
        stepped = torch.heaviside(x, torch.full(x.shape, 0.5) * x.mean())
        return chosen + filled, stepped


class EqualWrites(nn.Module):
    """Writes through an index or a mask of the value the destination already holds
    everywhere, so no perturbation of the index or mask can show: `y[mask] = 0` into zeros,
    and a running argmax that records step 0 into its zeros buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("arg", torch.zeros(4, dtype=torch.long))
        self.register_buffer("best", torch.full((4,), -1e9))

    def forward(self, x):
        row = x[0]
        positive = row > 0
        index = row.argsort()[:2]  # computed, within 8 whatever a perturbation adds
        masked = torch.zeros(4)
        masked[positive] = 0.0
        indexed = torch.zeros(8)
        indexed[index] = 0.0
        filled = torch.zeros(8).index_fill_(0, index, 0.0)
        scattered = torch.zeros(4).masked_scatter_(positive, torch.zeros(4))
        copied = torch.zeros(8).index_copy_(0, index, torch.zeros(2))
        put = torch.zeros(8).put_(index, torch.zeros(2))
        improved = row > self.best
        self.arg[improved] = 0
        self.best.copy_(torch.maximum(self.best, row))
        eights = indexed + filled + copied + put
        return masked + scattered + row + eights[:4], self.arg + 1


class IgnoredArguments(nn.Module):
    """Ops that, for these values, do not depend on an argument: no perturbation can prove
    those edges, and the model is correct (validation lists them as unproved)."""

    def forward(self, x):
        w = torch.ones(3, 3)
        beta0 = torch.addmm(x.exp(), x, w, beta=0.0)  # the input is not read
        zero_power = torch.pow(x, torch.zeros(1))  # ones whatever x
        one_base = torch.pow(torch.ones_like(x), x)  # ones whatever x
        upper = torch.triu(x, 5)  # past the last diagonal of a 4 x 3 matrix: zeros
        same = torch.where(x > 0, 1.0, 1.0)  # equal scalar branches
        return beta0 + zero_power + one_base + upper + same


class StridedReads(nn.Module):
    """Reductions over values whose layout decides the order of the sum: slices with gaps
    and an expanded row. A trace file written during the capture keeps their strides."""

    def forward(self, x):
        y = x * 1.0
        gaps = y[:, ::2].sum(1)
        rows = y[::3, ::2].sum(0)
        expanded = y[:1].expand(512, 128).mean()
        return gaps, rows, expanded


class EmptyIndexWrites(nn.Module):
    """Writes through an empty index: the source written reaches nothing."""

    def forward(self, x):
        added = torch.zeros(2, 4).scatter_add(0, torch.zeros(0, 4, dtype=torch.long), x[:2] * 2)
        reduced = torch.zeros(4).scatter_reduce(0, torch.zeros(0, dtype=torch.long), x[0] * 3,
                                                "amax")
        return added + x[:2], reduced + x[0]


class UnalignableCtc(nn.Module):
    """A CTC loss whose 5 targets cannot be aligned to 3 frames: infinite whatever the
    frames hold."""

    def forward(self, x):
        log_probs = torch.log_softmax(x * 2, 2)
        targets = torch.ones(1, 5, dtype=torch.long)
        return torch.nn.functional.ctc_loss(log_probs, targets, torch.tensor([3]),
                                            torch.tensor([5]), reduction="sum")


class TwinBuffers(nn.Module):
    """One tensor registered under two names: the capture attributes each read to one of
    them, and an edit of either name's version is an edit of both."""

    def __init__(self):
        super().__init__()
        shared = torch.zeros(4)
        self.register_buffer("a", shared)
        self.register_buffer("c", shared)

    def forward(self, x):
        self.a.add_(x.sum(0))
        return self.c * 2.0


class StatsViews(nn.Module):
    """Running statistics written through views: rows of one buffer by two batch norms in
    a row (the second also changing the first one's views), a row of one buffer beside a
    buffer of its own, and an instance norm's columns."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rows", torch.stack([torch.zeros(4), torch.ones(4)]))
        self.register_buffer("means", torch.zeros(2, 4))
        self.register_buffer("var", torch.full((4,), 2.0))
        self.register_buffer("cols", torch.stack([torch.zeros(4), torch.ones(4)], 1))

    def forward(self, x):
        y = F.batch_norm(x, self.rows[0], self.rows[1], training=True, momentum=0.2)
        y = F.batch_norm(y * 2 + 1, self.rows[0], self.rows[1], training=True, momentum=0.3)
        z = F.batch_norm(x - 1, self.means[1], self.var, training=True)
        w = F.instance_norm(x.t()[None], self.cols[:, 0], self.cols[:, 1], use_input_stats=True)
        return y + z + self.rows.sum(), w


class StatsViewsKept(nn.Module):
    """Running statistics in views made once and kept: two batch norms in a loop on the
    same two views, after a write through one of them and an in-place write of the whole
    buffer, both of which the views see."""

    def __init__(self):
        super().__init__()
        self.register_buffer("stats", torch.stack([torch.zeros(4), torch.ones(4), torch.zeros(4)]))

    def forward(self, x):
        mean, var = self.stats[0], self.stats[1]
        var.fill_(2.0)
        self.stats.add_(0.5)
        y = x
        for _ in range(2):
            y = F.batch_norm(y, mean, var, training=True, momentum=0.25)
        return y * 2 + self.stats.sum()


class ReadsWhatItWrites(nn.Module):
    """Ops writing memory that another of their arguments reads: a buffer's last row
    written from its first column (which ends in that row), and an activation's column
    written from its first row (which crosses it). The kernel reads some elements after
    writing them, so the results depend on its order."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.arange(16.0).reshape(4, 4))

    def forward(self, x):
        torch.add(self.b[0], self.b[:, 0], out=self.b[3])
        y = x.clone()
        torch.add(y[0], y[2], out=y[:, 1])
        return y * 3 + self.b.sum()


class ComplexViewWrites(nn.Module):
    """Buffers written through views of another dtype: a complex buffer through `.real`,
    a row's `.imag` and a column of `view_as_real`, and a real buffer through
    `view_as_complex`."""

    def __init__(self):
        super().__init__()
        self.register_buffer("z", torch.ones(3, 4, dtype=torch.complex64))
        self.register_buffer("f", torch.arange(16.0).reshape(4, 4) / 4)

    def forward(self, x):
        self.z.real.mul_(x)
        self.z[1].imag.copy_(x[0])
        torch.view_as_real(self.z)[2, :, 1].add_(x[2])
        torch.view_as_complex(self.f.view(4, 2, 2))[1:3].mul_(torch.complex(x[0, :2], x[1, :2]))
        return torch.view_as_real(self.z * 2).sum(-1), self.f * x.sum()


class ParamViewWrites(nn.Module):
    """Parameters written through views during the forward (a bias entry set by hand, a
    weight column scaled, a slice of a scale vector copied from an activation): the
    first linear reads them before the writes, the second after."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        y = self.lin(x) * self.scale
        with torch.no_grad():
            self.lin.bias[0] = 1.5
            self.lin.weight[:, 1].mul_(x[0])
            self.scale.narrow(0, 1, 2).copy_(y[0, :2])
        return self.lin(y) * self.scale, y


class ParamIsBuffer(nn.Module):
    """A buffer registered as a parameter's detached alias (one memory): the forward reads
    the parameter, writes a column through the buffer, and reads the parameter again."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("b", self.lin.weight.detach())

    def forward(self, x):
        y = self.lin(x)
        self.b[:, 2].add_(x[0])
        return self.lin(y) + self.b.sum()


class TransposedMatmul(nn.Module):
    """A product with a transposed view: BLAS reads it transposed, and a dense copy of it
    rounds differently (a trace file must keep its strides)."""

    def forward(self, x):
        y = x * 1.3
        return torch.addmm(y, y, y.t())


class AbsorbingOperands(nn.Module):
    """Integer operands that absorb the other: `i * 0`, `i & 0` and `i | -1` hold the same
    whatever i holds; and clamps that moved every element to their bound."""

    def forward(self, x):
        i = (x * 10).long()
        saturated = torch.clamp(i.abs() + 1, max=-100) + torch.clamp_min(-i.abs() - 5, 100)
        return i * 0 + (i & 0) + (i | -1) + saturated, torch.zeros(x.shape, dtype=torch.long) * i


class MaskIndex(nn.Module):
    """Boolean-mask indexing: aten::index takes a Tensor?[] of indices."""

    def forward(self, x):
        y = x.clone()
        y[y < -5] = 0.0
        return x[x > 0] * 2, y


class EmptyLists(nn.Module):
    """Empty list arguments: a trace file cannot say what their elements would be."""

    def forward(self, x):
        empty: List[int] = []
        return x.sum(dim=empty) + x.new_zeros(empty)


class BitwiseGuards(nn.Module):
    """& and | on bools are logical: an all-false operand decides an & alone."""

    def forward(self, x):
        return ((x > 0) & (x > 10)).float() + ((x > 0) | (x < 10)).float()


class ResizeAs(nn.Module):
    """resize_as_ reads only its template's sizes."""

    def forward(self, x):
        y = torch.arange(6.0)
        y.resize_as_(x)
        return y * 1.5 + x


class RegeometryAfterView(nn.Module):
    """A tensor with a view is moved to another storage (`set_`), shrunk (`resize_`) or
    given new strides (`as_strided_`), then the bytes it held are written through the
    view: it no longer holds them, so the write does not reach it, alive or (`e`, whose
    last use came first) dead."""

    def forward(self, x):
        a = x * 2.0
        va = a[0]
        a.set_(x + 1.0)
        va.mul_(3.0)
        c = x.reshape(-1) * 1.0
        vc = c[3:]
        c.resize_(2)
        vc.add_(1.0)
        d = x.reshape(-1) + 2.0
        vd = d[4:]
        d.as_strided_([2], [1], 0)
        vd.sub_(1.0)
        e = x.reshape(-1) - 1.0
        ve = e[4:]
        e.resize_(3)
        s = e.sum()
        ve.mul_(2.0)
        return a * 1.0, va, c * 1.0, vc, d * 1.0, vd, s, ve


class ResizeLarger(nn.Module):
    """A view grown past its elements (`resize_`, `resize_as_`; PyTorch's functionalization
    test `test_resize_larger`): the new elements are uninitialized until written."""

    def forward(self, x):
        y = x + 1.0
        z = y[:]
        z.resize_(25)
        z[8:].fill_(1.0)
        y2 = z.view(5, 5)
        y2.add_(1.0)
        w = x * 2.0
        w.resize_as_(y2)
        w[1:].zero_()
        return y2.sum() + x, w * 1.0, y * 1.0


class AsStridedOffsets(nn.Module):
    """as_strided at an absolute offset on a view whose bytes the model writes later, and
    reaching bytes outside its input (README "Validation": unproved, never failed)."""

    def forward(self, x):
        y = x * 2.0
        v = y[1:]
        w = v.as_strided([2], [2], 2)
        u = y[0:2].as_strided([2], [1], 3)
        r = u * 1.0
        y.add_(1.0)
        return w * 1.0, r, y * 1.0


class ExpandedBufferView(nn.Module):
    """An expanded view of a buffer (its elements share memory) read before and after the
    buffer is written in place: the write changes every row of the view."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.tensor([1.0, -2.0, 3.0]))

    def forward(self, x):
        e = self.b.expand(2, 3)
        r = e * x
        self.b.add_(x[0])
        return r + e, e * 1.0


class InplaceViewOps(nn.Module):
    """In-place view ops (`t_`, `unsqueeze_`, `squeeze_`, `transpose_`, `swapdims_`,
    `as_strided_`) change a tensor's geometry and no byte: on a slice of buffer `b`
    between writes through it, on buffer `c` itself (its shape is its state), and on a
    plain tensor with a view read after they ran. (`as_strided_` gets a view at offset 0:
    README "Validation" says why.)"""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.arange(6.0).reshape(2, 3) / 4)
        self.register_buffer("c", torch.arange(6.0).reshape(2, 3) - 2)

    def forward(self, x):
        v = self.b[:, 1:]
        w = self.b[1]
        v.t_()
        v.add_(x[:, :2].t() * torch.tensor([[1.0, 2.0]]))
        v.unsqueeze_(0)
        v.mul_(3.0)
        v.squeeze_(0)
        v.transpose_(0, 1)
        v.sub_(x[:, 1:])
        v.swapdims_(0, 1)
        v.div_(2.0)
        u = self.b.view(-1)
        u.as_strided_([2], [2], 1)
        u.mul_(-1.0)
        self.c.t_()
        self.c.add_(x.t())
        y = x * 2.0
        z = y[0]
        y.t_()
        y.mul_(torch.tensor([1.0, -1.0]))
        return self.b * 1.0, w * 1.0, self.c * 1.0, y * 1.0, z * 1.0


class PackedStats(nn.Module):
    """Both running statistics in one buffer, read (eval mode) or written (training mode)
    through column views;
    and a sum over a strided slice of a buffer, whose order of addition follows the
    strides."""

    def __init__(self):
        super().__init__()
        self.register_buffer("stats", torch.stack([torch.linspace(-1, 1, 4),
                                                   torch.linspace(0.5, 2, 4)], 1))
        self.register_buffer("table", torch.linspace(-3, 3, 300 * 77).reshape(300, 77))

    def forward(self, x):
        y = F.batch_norm(x, self.stats[:, 0], self.stats[:, 1], training=self.training,
                         momentum=0.1)
        return y, self.table[:, ::2].sum(0)


class UpdateStats(nn.Module):
    """batch_norm_update_stats writes both running statistics on every call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))

    def forward(self, x):
        mean, var = torch.batch_norm_update_stats(x, self.rm, self.rv, 0.1)
        return mean + var


class FakeQuant(nn.Module):
    """Quantization-aware training's fused observer and fake quantizer: one op that reads
    two flag buffers and writes four more (running min and max, scale, zero point)."""

    def __init__(self):
        super().__init__()
        self.fq = torch.ao.quantization.FusedMovingAvgObsFakeQuantize()

    def forward(self, x):
        return self.fq(x) * 2


class FakeQuantAtRest(nn.Module):
    """A weight's fake quantizer after one earlier forward: its observer already holds the
    weight's min and max (observer on or off gives the same output), and no value is
    clamped (the zero point changes nothing)."""

    def __init__(self):
        super().__init__()
        self.fq = torch.ao.quantization.FusedMovingAvgObsFakeQuantize()
        self.w = nn.Parameter(torch.linspace(-1, 1, 6).reshape(2, 3))
        with torch.no_grad():
            self.fq(self.w)

    def forward(self, x):
        zero_point = torch.tensor([0, 1, 2], dtype=torch.int32)
        per_channel = torch.fake_quantize_per_channel_affine(
            x, torch.tensor([0.1, 0.2, 0.05]), zero_point, 1, -128, 127)
        return self.fq(self.w) * x + per_channel


class GruDropout(nn.Module):
    """A two-layer GRU with dropout between its layers: in training mode aten::gru draws
    from the generator although its schema does not say so. Its outputs are random: the
    test checks the verdict, not eager's values."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 4, num_layers=2, dropout=0.5)

    def forward(self, x):
        return self.gru(x)[0]


class DtypeViews(nn.Module):
    """Views with another dtype than their base: one storage read as two dtypes."""

    def forward(self, x):
        real = torch.view_as_real(torch.complex(x, x))
        return real * 1, torch.view_as_complex(x * 2)


class FormerAfterReassign(nn.Module):
    """The registered tensor, used and written after the slot was given another one."""

    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.arange(2.0))

    def forward(self, x):
        old = self.buf
        self.buf = x * 2
        old.add_(x)
        return old * 3


class MoveBuffers(nn.Module):
    """One buffer's tensor moved into another's slot, then the first reassigned."""

    def __init__(self):
        super().__init__()
        self.register_buffer("a", torch.full((2,), 1.0))
        self.register_buffer("b", torch.full((2,), 2.0))

    def forward(self, x):
        self.a = self.b
        self.b = x * 3
        return x * self.a


class SwapBuffers(nn.Module):
    """Two buffers swapped through a local."""

    def __init__(self):
        super().__init__()
        self.register_buffer("a", torch.full((2,), 1.0))
        self.register_buffer("b", torch.full((2,), 2.0))

    def forward(self, x):
        t = self.a
        self.a = self.b
        self.b = t
        return x * self.a + self.b


class ChunkHeads(nn.Module):
    """An op with several outputs (chunk), each read by its own head."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        a, b = self.fc(x).chunk(2, dim=1)
        return a * 2.0, b + 1.0


class PositiveSelect(nn.Module):
    """Returns the positive values: an edit upstream changes the output's shape."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        return y[y > 0]


class DivideByZero(nn.Module):
    """A middle layer divides by zero: NaN and infinities flow on from there."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = h / (h - h)
        return self.fc2(h)


class ThresholdGuard(nn.Module):
    """Guards that never fire on these inputs: a sum checked against 1e9, |x| > 100."""

    def forward(self, x):
        if bool(x.sum() > 1e9):
            x = x * 0.0
        return torch.where(x.abs() > 100.0, x, torch.zeros_like(x)) + x

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


# ---------------------------------------------------------------------------------------
# Issue 20: source positions and branches.

class Branchy(nn.Module):
    """An if/else on the input: which branch ran is an attribute of the ops inside it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = x * 2.0
        if bool(x.sum() > 0):
            y = torch.relu(self.fc(h))
        else:
            y = torch.tanh(h)
        return y + 1.0


def _shift_if_large(x):
    if bool(x.mean() > 0.5):
        return x - 1.0
    return x


class NestedBranches(nn.Module):
    """ifs inside a loop, inside an else, and inside a helper function the else calls."""

    def forward(self, x):
        for i in range(2):
            if i == 0:
                x = x * 2.0
            else:
                if bool(x.sum() > 0):
                    x = _shift_if_large(x)
                else:
                    x = -x
        return x


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
        "data_copy": (DataCopy, [torch.tensor([1.0, -2.0, 3.0])], False),
        "shared_storage": (SharedStorage, [torch.tensor([10.0, 20.0])], False),
        "transposed_write": (TransposedWrite, [torch.tensor([[1.0, 2.0], [3.0, 4.0]])], False),
        "double_reassign": (DoubleReassign, [torch.tensor([1.0, 2.0])], False),
        "reassigned_statistics": (ReassignedStatistics, [rand(3, 2)], True),
        "reassign_then_write": (ReassignThenWrite, [torch.tensor([1.0, -2.0])], False),
        "plain_attribute": (PlainAttribute, [rand(2, 3)], False),
        "return_param": (ReturnParam, [rand(1, 2)], False),
        "set_storage": (SetStorage, [torch.tensor([1.0, 2.0, 3.0])], False),
        "bn_momentum0_train": (BnMomentumZero, [rand(4, 3)], True),
        "bn_cumulative_train": (BnCumulative, [rand(4, 3)], True),
        "nan_buffer": (NanBuffer, [torch.tensor([2.0, 3.0, 4.0])], False),
        "dead_branch": (DeadBranch, [rand(2, 3)], False),
        "view_write": (ViewWrite, [rand(2, 3)], False),
        "view_write_partial": (ViewWritePartial, [rand(3, 3)], False),
        "view_before_write": (ViewBeforeWrite, [rand(2, 3)], False),
        "input_view_write": (InputViewWrite, [rand(2, 3)], False),
        "view_of_view_write": (ViewOfViewWrite, [rand(2, 6)], False),
        "masked_nan": (MaskedNan, [rand(2, 4)], False),
        "topk_any": (TopkAny, [rand(3, 4)], False),
        "log_nan": (LogNan, [torch.tensor([1.0, -1.0, 2.0, -3.0])], False),
        "positive_count": (PositiveCount, [torch.tensor([1.0, -2.0, 3.0, -4.0])], False),
        "threshold_guard": (ThresholdGuard, [rand(2, 3)], False),
        "chunk_heads": (ChunkHeads, [rand(2, 4)], False),
        "out_arguments": (OutArguments, [rand(2, 3)], False),
        "out_pair": (OutPair, [rand(3, 4)], False),
        "scatter_cover": (ScatterCover, [rand(2, 3)], False),
        "guards_not_fired": (GuardsNotFired, [rand(2, 3)], False),
        "index_writes": (IndexWrites, [rand(2, 3)], False),
        "shape_only_reads": (ShapeOnlyReads, [rand(2, 3)], False),
        "fake_quant_at_rest": (FakeQuantAtRest, [rand(2, 3)], True),
        "gru_dropout": (GruDropout, [rand(5, 2, 3)], True),
        "conj_view": (ConjView, [rand(3)], False),
        "mask_index": (MaskIndex, [rand(3)], False),
        "lstsq_gelsy": (LstsqGelsy, [rand(6, 4)], False),
        "quantized_net": (quantized_net, [rand(2, 2, 6, 6)], False),
        "complex_scalar": (ComplexScalar, [rand(3)], False),
        "equal_choices": (EqualChoices, [rand(3, 4)], False),
        "equal_writes": (EqualWrites, [rand(3, 4)], False),
        "strided_reads": (StridedReads, [rand(64, 128)], False),
        "ignored_arguments": (IgnoredArguments, [rand(4, 3)], False),
        "empty_index_writes": (EmptyIndexWrites, [rand(3, 4)], False),
        "twin_buffers": (TwinBuffers, [rand(3, 4)], False),
        "stats_views": (StatsViews, [rand(6, 4)], True),
        "stats_views_kept": (StatsViewsKept, [rand(6, 4)], True),
        "reads_what_it_writes": (ReadsWhatItWrites, [rand(4, 4)], False),
        "complex_view_writes": (ComplexViewWrites, [rand(3, 4)], False),
        "param_view_writes": (ParamViewWrites, [rand(3, 4)], False),
        "transposed_matmul": (TransposedMatmul, [rand(4, 4)], False),
        "param_is_buffer": (ParamIsBuffer, [rand(3, 4)], False),
        "absorbing_operands": (AbsorbingOperands, [rand(3, 4)], False),
        "unalignable_ctc": (UnalignableCtc, [rand(3, 1, 4)], False),
        "nan_absorbs": (NanAbsorbs, [torch.rand(2, 3, generator=torch.Generator().manual_seed(4))], False),
        "bitwise_guards": (BitwiseGuards, [rand(4)], False),
        "empty_lists": (EmptyLists, [rand(2, 3)], False),
        "resize_as": (ResizeAs, [rand(2, 3)], False),
        "regeometry_after_view": (RegeometryAfterView, [rand(2, 3)], False),
        "inplace_view_ops": (InplaceViewOps, [rand(2, 3)], False),
        "expanded_buffer_view": (ExpandedBufferView, [rand(2, 3)], False),
        "as_strided_offsets": (AsStridedOffsets, [rand(6)], False),
        "resize_larger": (ResizeLarger, [rand(8)], False),
        "packed_stats_eval": (PackedStats, [rand(5, 4)], False),
        "packed_stats_train": (PackedStats, [rand(5, 4)], True),
        "update_stats": (UpdateStats, [rand(6, 3)], True),
        "fake_quant": (FakeQuant, [rand(2, 3)], True),
        "dtype_views": (DtypeViews, [rand(3, 2)], False),
        "former_after_reassign": (FormerAfterReassign, [rand(2)], False),
        "move_buffers": (MoveBuffers, [rand(2)], False),
        "swap_buffers": (SwapBuffers, [rand(2)], False),
        "divide_by_zero": (DivideByZero, [rand(2, 3)], False),
        "positive_select": (PositiveSelect, [rand(2, 3)], False),
        "checks_input": (ChecksInput, [rand(2, 3)], False),
        "forks": (Forks, [rand(2, 3)], False),
        "forks_in_helper": (ForksInHelper, [rand(2, 3)], False),
        "sparse_output": (SparseOutput, [rand(2, 3)], False),
        "nested_150": (nested(150), [rand(1, 2)], False),
        "branchy": (Branchy, [torch.ones(2, 3)], False),
        "nested_branches": (NestedBranches, [torch.ones(2, 3)], False),
        # Issue 52: gradients (tools/gen_testdata_grads.py, with their oracles).
        **gen_testdata_grads.models(rand),
    }


# Statements whose position the capture must report, found by Python's `inspect` (the
# oracle): name -> {key: (function, text the line contains)}. The expected file holds
# source_line__KEY (1-based line in the function's file) and source_text__KEY (the line
# without indentation, as UTF-8 bytes).
def source_markers():
    return {
        "branchy": {
            "mul": (Branchy.forward, "h = x * 2.0"),
            "if": (Branchy.forward, "if bool(x.sum() > 0):"),
            "relu": (Branchy.forward, "y = torch.relu(self.fc(h))"),
            "tanh": (Branchy.forward, "y = torch.tanh(h)"),
            "add": (Branchy.forward, "return y + 1.0"),
            "linear": (nn.Linear.forward, "F.linear("),
        },
        "nested_branches": {
            "mul": (NestedBranches.forward, "x = x * 2.0"),
            "loop_if": (NestedBranches.forward, "if i == 0:"),
            "sum_if": (NestedBranches.forward, "if bool(x.sum() > 0):"),
            "call": (NestedBranches.forward, "x = _shift_if_large(x)"),
            "helper_if": (_shift_if_large, "if bool(x.mean() > 0.5):"),
            "sub": (_shift_if_large, "return x - 1.0"),
        },
    }


# Interventions with eager PyTorch's answer: name -> [(kind, target, value)], where kind is
#   "input":  input number `target` replaced by `value`;
#   "buffer": the buffer at address `target` starts the forward holding `value`;
#   "module": the submodule at address `target` returns `value` (a forward hook).
# The expected file holds, for edit k: edit_K_value, edit_K_output_I, edit_K_buffer__ADDRESS.
def edits():
    return {
        "data_copy": [("input", 0, torch.tensor([5.0, -6.0, 7.0]))],
        "shared_storage": [("input", 0, torch.tensor([-1.0, 3.0]))],
        "transposed_write": [("input", 0, torch.tensor([[0.5, -1.0], [2.0, 8.0]]))],
        "double_reassign": [("input", 0, torch.tensor([-3.0, 0.25]))],
        "plain_attribute": [("input", 0, torch.ones(2, 3))],
        "return_param": [("input", 0, torch.full((1, 2), 2.0))],
        "set_storage": [("input", 0, torch.tensor([-1.0, 0.5, 4.0]))],
        "bn_momentum0_train": [("input", 0, torch.arange(12.0).reshape(4, 3)),
                               ("buffer", "bn.running_mean", torch.tensor([1.0, -2.0, 3.0]))],
        "bn_cumulative_train": [("input", 0, torch.arange(12.0).reshape(4, 3)),
                                ("buffer", "bn.num_batches_tracked", torch.tensor(4))],
        "nan_buffer": [("input", 0, torch.tensor([-1.0, 0.5, 2.0]))],
        "dead_branch": [("input", 0, torch.ones(2, 3))],
        "view_write": [("input", 0, torch.ones(2, 3)), ("module", "lin", torch.full((2, 3), 3.0))],
        "view_write_partial": [("input", 0, torch.ones(3, 3)),
                               ("module", "lin", torch.arange(9.0).reshape(3, 3))],
        "view_before_write": [("module", "lin", torch.arange(6.0).reshape(2, 3))],
        "input_view_write": [("input", 0, torch.full((2, 3), -2.0))],
        "view_of_view_write": [("module", "lin", torch.arange(12.0).reshape(2, 6))],
        "masked_nan": [("input", 0, torch.ones(2, 4))],
        "counter_cell": [("buffer", "b", torch.full((4,), 5.0))],
        "bn2d_train": [("input", 0, torch.arange(24.0).reshape(3, 2, 2, 2))],
        "slice_copy": [("input", 0, torch.full((2,), 5.0))],
        "chunk_heads": [("input", 0, torch.ones(2, 4))],
        "out_pair": [("input", 0, torch.arange(12.0).reshape(3, 4).flip(1))],
        "fake_quant": [("input", 0, torch.full((2, 3), 0.5)),
                       ("buffer", "fq.scale", torch.tensor([0.25]))],
        "packed_stats_train": [("input", 0, torch.arange(20.0).reshape(5, 4))],
        "mask_index": [("input", 0, torch.tensor([2.0, -7.0, 1.0]))],
        "stats_views": [("input", 0, torch.arange(24.0).reshape(6, 4) / 7)],
        "complex_view_writes": [("input", 0, torch.arange(12.0).reshape(3, 4) / 6),
                                ("buffer", "f", torch.full((4, 4), 0.5))],
        "param_view_writes": [("input", 0, torch.arange(12.0).reshape(3, 4) / 4 - 1)],
        "param_is_buffer": [("input", 0, torch.arange(12.0).reshape(3, 4) / 5),
                            ("buffer_in_place", "b", torch.arange(16.0).reshape(4, 4) / 8)],
        "stats_views_kept": [("input", 0, torch.arange(24.0).reshape(6, 4) / 5),
                             ("buffer", "stats", torch.arange(12.0).reshape(3, 4))],
        "inplace_view_ops": [("input", 0, torch.arange(6.0).reshape(2, 3) / 3 - 1),
                             ("buffer", "b", torch.full((2, 3), 0.5))],
        "expanded_buffer_view": [("input", 0, torch.arange(6.0).reshape(2, 3) / 2),
                                 ("buffer", "b", torch.tensor([0.5, 0.25, -1.0]))],
        "twin_buffers": [("buffer_in_place", "a", torch.full((4,), 0.5)),
                         ("buffer_in_place", "c", torch.arange(4.0))],
    }


def edited_forward(model, inputs, kind, target, value):
    model = copy.deepcopy(model)
    inputs = [x.clone() for x in inputs]
    if kind == "input":
        inputs[target] = value.clone()
    elif kind == "buffer":
        owner, _, name = target.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        setattr(module, name, value.clone())
    elif kind == "buffer_in_place":  # the memory every name of the buffer shares
        owner, _, name = target.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        getattr(module, name).copy_(value)
    elif kind == "module":
        model.get_submodule(target).register_forward_hook(lambda m, i, o: value.clone())
    with torch.no_grad():
        out = model(*inputs)
    return out, model


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


def every_buffer(model):
    """(address, tensor) of every registered buffer, a tensor registered under two names
    under both (named_buffers lists it once)."""
    for prefix, module in model.named_modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                yield (prefix + "." + name if prefix else name), buf


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
    for address, buf in every_buffer(model):
        values[buffer_key("initial", address)] = buf
    values = {k: v.clone() for k, v in values.items()}
    for i, x in enumerate(inputs):
        values[f"input_{i}"] = x
    eager = copy.deepcopy(model)
    with torch.no_grad():
        out = eager(*[x.clone() for x in inputs])
    for i, y in enumerate(flatten_outputs(out)):
        values[f"output_{i}"] = y
    for address, buf in every_buffer(eager):
        values[buffer_key("buffer", address)] = buf
    values.update(gen_testdata_grads.gradient_values(name, copy.deepcopy(model), inputs))
    for k, (kind, target, value) in enumerate(edits().get(name, [])):
        out, edited = edited_forward(model, inputs, kind, target, value)
        values[f"edit_{k}_value"] = value
        for i, y in enumerate(flatten_outputs(out)):
            values[f"edit_{k}_output_{i}"] = y
        for address, buf in every_buffer(edited):
            values[buffer_key(f"edit_{k}_buffer", address)] = buf
    for key, (function, marker) in source_markers().get(name, {}).items():
        lines, first = inspect.getsourcelines(function)
        matches = [i for i, line in enumerate(lines) if marker in line]
        assert len(matches) == 1, (name, key, matches)
        values["source_line__" + key] = torch.tensor(first + matches[0])
        values["source_text__" + key] = torch.tensor(list(lines[matches[0]].strip().encode()),
                                                     dtype=torch.uint8)
    torch.jit.script(Expected(values)).save(os.path.join(OUT, name + ".expected.pt"))


def main():
    # Scripting writes a class's constants in set order, which string hashing randomizes
    # per process: a fixed hash seed makes every run write the same bytes (the hashes in
    # testdata/MANIFEST), so a re-run over unchanged models changes nothing but
    # lstsq_gelsy's expected outputs (LstsqGelsy says why they vary).
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
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
    # testdata/MANIFEST: a full run vouches for every file and for the generator itself; a
    # partial one only for what it wrote (tools/testdata_manifest.py).
    written = ["demo_input.pt"] + [f"{name}{suffix}" for name in sorted(only)
                                   for suffix in (".pt", ".expected.pt")]
    testdata_manifest.write_manifest(written if only else [])


if __name__ == "__main__":
    main()
