"""torchlens_cpp: TorchLens's buffer API on eager PyTorch models, through torchlens' C++ engine.

    import torch, torchlens_cpp as tl

    trace = tl.trace(model, x)                  # runs model(x) under capture
    trace.buffers["h"].versions                 # every observed version of buffer h
    trace["bn.running_mean:2"].out              # the value after BatchNorm's first update
    report = trace.validate()                   # replays every op and checks it
    edited = trace.do({"h:1": torch.ones(2)})   # a new trace with the edit's cone re-run

    with tl.capture(model) as cap:              # the scoped guard (this thread only)
        out = model(x)
    trace = cap.finish(out)

The ops of the forward are recorded in C++ by the same dispatcher plugin, recorder, buffer
journal, validation and replay as the C++ API's (torchlens_dispatch/python/README.md); no
Python code runs per op. Python code runs once per capture (reading the model, installing
module scopes) and once per module call (the module's scope).
"""

import dataclasses
import threading

import torch  # loads LibTorch's libraries, which _C links against, first

from torchlens_cpp import _C
from torchlens_cpp._C import (  # noqa: F401  (re-exported)
    Buffer,
    BufferThreadGapError,
    BufferThreadGapWarning,
    Error,
    Module,
    Op,
    Param,
    ReplayGapWarning,
    Trace,
    UnjournaledBufferWriteError,
    ValidationReport,
    load,
)

__all__ = [
    "Buffer", "BufferThreadGapError", "BufferThreadGapWarning", "Error", "Module", "Op", "Param",
    "ReplayGapWarning", "Trace", "UnjournaledBufferWriteError", "ValidationReport", "capture",
    "load", "trace",
]

class _Active(threading.local):
    capture = None  # the capture running on this thread (a patched __setattr__ reports to it)


_active = _Active()
# NOTE [Patched module classes]
# `self.h = t` on a module stores the tensor in `self._buffers` without dispatching
# anything. While a capture runs, the classes of the model's modules that own buffers (no
# other module's assignment can change one of the model's buffers) get a `__setattr__`
# and a `register_buffer` that call the class's own and then tell the capture on this
# thread what the buffer slot holds now; the capture turns a new tensor into a kReassign
# version (and ignores the report when the slot holds the tensor it already knows, so a
# class and its patched base reporting one assignment make one version). The patches are
# counted per class, so that captures on two threads share them, and removed when the last
# capture ends, also when the forward raised. Instances outside the model, and other
# threads, run the patched method too, but no capture listens to them.
_patch_lock = threading.Lock()
_patched = {}  # class -> [captures, {method name: the class's own attribute or _ABSENT}]
_ABSENT = object()


def _reporting(original):
    def __setattr__(self, name, value):
        original(self, name, value)
        if _active.capture is not None:
            _C._buffer_assigned(self, name, value)

    return __setattr__


def _reporting_register(original):
    def register_buffer(self, name, tensor, *args, **kwargs):
        original(self, name, tensor, *args, **kwargs)
        if _active.capture is not None:
            _C._buffer_assigned(self, name, tensor)

    return register_buffer


_PATCHES = {"__setattr__": _reporting, "register_buffer": _reporting_register}


def _patch(classes):
    with _patch_lock:
        for cls in classes:
            entry = _patched.get(cls)
            if entry is not None:
                entry[0] += 1
                continue
            own = {}
            for name, make in _PATCHES.items():
                own[name] = cls.__dict__.get(name, _ABSENT)
                setattr(cls, name, make(getattr(cls, name)))
            _patched[cls] = [1, own]


def _unpatch(classes):
    with _patch_lock:
        for cls in classes:
            entry = _patched.get(cls)
            if entry is None:
                continue
            entry[0] -= 1
            if entry[0] > 0:
                continue
            del _patched[cls]
            for name, own in entry[1].items():
                if own is _ABSENT:
                    delattr(cls, name)
                else:
                    setattr(cls, name, own)


def _tensors(value, out):
    """Appends the tensors in `value` depth-first: tuple/list order, dict insertion order,
    dataclass field order (as the C++ side numbers inputs and outputs)."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _tensors(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, out)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _tensors(getattr(value, field.name), out)
    return out


class capture:
    """The scoped guard: while the `with` block runs, everything this thread dispatches is
    captured against `model`'s modules, parameters and buffers.

        with tl.capture(model) as cap:
            out = model(x)
        trace = cap.finish(out)

    `finish(outputs)` marks the outputs (a tensor, or a tuple/list/dict of them) and returns
    the Trace; call it once, on the same thread, inside or after the block. With
    `save_grads=True`, a backward() from the outputs then fills `Op.grad`,
    `trace.backward_ops` and `trace.param_grads`. If the block
    raises, the exception propagates unchanged, the model's classes and modules are
    restored, and `cap.trace` is the partial trace (`trace.partial` is True, its
    `partial_reason` names the error); `finish()` then returns it too.
    """

    def __init__(self, model, save=True, *, allow_unjournaled_writes=False, save_grads=False):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        self._model = model
        self._save = bool(save)
        self._allow_unjournaled_writes = bool(allow_unjournaled_writes)
        self._save_grads = bool(save_grads)
        self._native = None
        self._classes = ()
        self.trace = None

    def __enter__(self):
        if self._native is not None or self.trace is not None:
            raise Error("this capture was already used; create a new tl.capture to capture again")
        if _active.capture is not None:
            raise Error("this thread is already capturing (captures do not nest); finish the "
                        "outer capture first, or capture on another thread")
        self._native = _C._Capture(self._model, torch.jit.ScriptModule, self._save,
                                   self._allow_unjournaled_writes, self._save_grads)
        self._classes = self._native.buffer_classes()
        if self._classes:
            _patch(self._classes)
        _active.capture = self
        return self

    def _mark_inputs(self, args, kwargs):
        self._native.mark_inputs(_tensors(kwargs, _tensors(args, [])))

    def _stop(self):
        if _active.capture is self:
            _active.capture = None
            try:
                self._native.stop()
            finally:
                if self._classes:
                    _unpatch(self._classes)
                self._classes = ()

    def __exit__(self, kind, value, traceback):
        if self._native is None:
            return False
        if kind is None:
            self._stop()
            return False
        # The forward raised: keep what ran as a partial trace, restore everything, and let
        # the exception propagate unchanged.
        try:
            self._stop()
            self.trace = self._native.finish_after_error(
                f"the forward raised {kind.__name__}: {value}; the trace ends at {{label}}")
        except Exception:  # the model's exception matters more than a partial trace
            self.trace = None
        self._native = None
        return False

    def finish(self, outputs=None):
        """Marks `outputs` as the model outputs, ends the capture and returns the Trace."""
        if self._native is None:
            if self.trace is not None and self.trace.partial:
                return self.trace
            raise Error("finish() needs a capture that started (use `with tl.capture(model) as "
                        "cap:`) and was not finished yet")
        try:
            self._stop()
            self.trace = self._native.finish(_tensors(outputs, []))
        finally:
            self._native = None
        self.trace.output = outputs
        return self.trace


def trace(model, args, kwargs=None, *, save=True, allow_unjournaled_writes=False,
          save_grads=False):
    """Runs `model(*args, **kwargs)` under capture and returns its Trace.

    `args` is a tensor or a tuple/list of positional arguments. The model runs in its
    current train/eval and grad mode; the capture draws no random numbers of its own. The
    forward's own exception propagates unchanged; `trace.output` is its return value.
    With `save_grads=True`, `trace.output.sum().backward()` (any backward from the output)
    fills each `Op.grad`, `trace.backward_ops` and `trace.param_grads`; each backward that
    reaches the trace replaces the previous one's gradients.
    """
    if not isinstance(args, (tuple, list)):
        args = (args,)
    kwargs = {} if kwargs is None else kwargs
    cap = capture(model, save, allow_unjournaled_writes=allow_unjournaled_writes,
                  save_grads=save_grads)
    with cap:
        cap._mark_inputs(args, kwargs)
        output = model(*args, **kwargs)
    return cap.finish(output)
