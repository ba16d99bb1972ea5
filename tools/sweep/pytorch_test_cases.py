#!/usr/bin/python3
"""Runs the torchlens CLI on cases built from PyTorch's own test suites.

usage: pytorch_test_cases.py --cli PATH/TO/torchlens --out DIR [--sources S,S...]
           [--ops NAME,NAME...] [--samples N] [--limit N] [--round_trip_every K] [--timeout S]
           [--shard I/N]

PyTorch's tests describe thousands of operator and module calls, with inputs chosen to
reach their corner cases. Each call becomes a TorchScript model and an input file, and the
CLI validates its capture, so torchlens meets the calls PyTorch thinks worth testing, not
only those we thought of. --sources (default: all, in this order):

  opinfo         op_db ops (common_methods_invocations) called as functions, first 3
                 OpInfo samples (--samples)
  inplace        their in-place variants (x.add_(y)) on the input itself and on a clone
                 of it made inside the model, first 2 samples (at most --samples)
  noncontiguous  the function and any in-place variant on a non-contiguous copy of the
                 first sample
  modules        module_db (common_modules) in eval and train mode, first 4 samples
                 (--samples), scripted when the forward takes only tensors, and traced
  nn             common_nn module and criterion tests, scripted (traced when that fails),
                 in eval mode, and in train mode too when the module has buffers

--ops keeps only the named ops and modules, as case names spell them: op_db names
(add, div.floor_rounding, nn.functional.conv2d), module_db names (nn.LSTM), common_nn test
names (BatchNorm2d_momentum). Each named entry must yield a case, or the run fails. Ops
and modules go in name order, each seeded, so a subset builds the same cases as a full run.

Calls torchlens cannot be expected to reproduce are skipped, with the reason in
DIR/skips.jsonl: ops named like random ones (rand, dropout, bernoulli, ...), ops without
CPU float32, calls whose two eager runs differ, calls returning no tensor, calls
torch.jit.trace or torch.jit.script cannot export, and exported models that, saved and
loaded, do not return eager PyTorch's outputs bit for bit.

Each case runs `CLI --model M --input I --validate --json J --mode eval|train`, one at a
time, with a timeout. Every K-th case (--round_trip_every, 5; 0: none) also writes its
trace (--save T) and validates it read back (--trace T --validate). A run is passed on
exit 0 with the JSON's validation passed, failed on exit 1 (or 0 with it not passed),
refused on exit 2 (`torchlens: error: ...`), crashed otherwise (a signal, the timeout).
Results: DIR/results.jsonl, one line per case; DIR/cases/NAME/{model,inputs}.pt to rerun a
case by hand. Prints a line per case that did not pass, then `N cases: P passed, F failed,
C crashed, E refused`; exits 0 only when N > 0 and every case passed.
"""

import argparse
import copy
import io
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from typing import Any, List, NamedTuple

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

SOURCES = ("opinfo", "inplace", "noncontiguous", "modules", "nn")
# Ops whose name says they draw random numbers: a replay could not match them.
RANDOM_OP = re.compile(r"rand|normal|bernoulli|dropout|multinomial|uniform|poisson|"
                       r"exponential|geometric|cauchy|random|empty")
# torch.testing._internal.common_utils imports `expecttest`, a pip package Debian does not
# ship; the sample generators never use it. Written at runtime so that nothing on the
# import path of other tools can pick it up.
EXPECTTEST_STUB = """import unittest
ACCEPT = False
class TestCase(unittest.TestCase):
    longMessage = True
    def assertExpectedInline(self, *args, **kwargs):
        pass
"""


class Case(NamedTuple):
    """A model the CLI should capture and validate: verified equal to eager PyTorch."""
    name: str
    op: str  # the op or module name --ops selects by
    model: torch.jit.ScriptModule
    inputs: List[torch.Tensor]
    mode: str  # "eval" or "train"


class Skip(NamedTuple):
    """A call that cannot be a case, and why."""
    name: str
    op: str
    why: str


def import_test_suites():
    """Imports PyTorch's test tables with the expecttest stub and without our argv."""
    stub_dir = tempfile.mkdtemp(prefix="expecttest_stub_")
    with open(os.path.join(stub_dir, "expecttest.py"), "w") as f:
        f.write(EXPECTTEST_STUB)
    sys.path.insert(0, stub_dir)
    argv, sys.argv = sys.argv, sys.argv[:1]  # common_utils parses sys.argv when imported
    try:
        from torch.testing._internal import common_methods_invocations, common_modules, common_nn
    finally:
        sys.argv = argv
        sys.path.remove(stub_dir)
        shutil.rmtree(stub_dir)
    return common_methods_invocations.op_db, common_modules.module_db, common_nn


def bit_equal(a: Any, b: Any) -> bool:
    """Same dtype, shape and bits (NaN equals NaN; -0.0 does not equal 0.0)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return type(a) is type(b) and a == b
    if a.layout != torch.strided or b.layout != torch.strided:
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = (t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1) for t in (a, b))
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype == torch.bool or a.numel() == 0:
        return torch.equal(a, b)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def copies(inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """Copies keeping strides and aliasing (a tensor passed twice, views of one storage)."""
    return copy.deepcopy(inputs)


def outputs_equal(x: Any, y: Any) -> bool:
    x, y = tree_flatten(x)[0], tree_flatten(y)[0]
    return len(x) == len(y) and all(bit_equal(a, b) for a, b in zip(x, y))


class Call(torch.nn.Module):
    """Calls fn with a flattened argument tree whose tensors are the forward's arguments.

    Non-tensor arguments (dims, flags, None) are baked in, so tracing records one call.
    """

    def __init__(self, fn, leaves, spec, clone_first=False):
        super().__init__()
        self.fn, self.spec, self.clone_first = fn, spec, clone_first
        self.positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        self.leaves = [None if isinstance(x, torch.Tensor) else x for x in leaves]

    def forward(self, *tensors):
        leaves = list(self.leaves)
        for i, t in zip(self.positions, tensors):
            leaves[i] = t
        if self.clone_first:  # the in-place op writes a copy made inside the model
            leaves[self.positions[0]] = tensors[0].clone()
        args, kwargs = tree_unflatten(leaves, self.spec)
        return self.fn(*args, **kwargs)


def make_case(name, op, fresh, inputs, mode, how):
    """Exports fresh() (a new module each call) by `how` if it reproduces eager PyTorch.

    Eager runs twice on copies of the inputs (equal results or the call is random); the
    exported model is saved and loaded, as the CLI will, and must match bit for bit.
    Buffers are reset after torch.jit.trace, whose run updates them in train mode.
    """
    training, stage = mode == "train", "eager call"
    try:
        with torch.no_grad():
            ref, again = (fresh().train(training)(*copies(inputs)) for _ in range(2))
            if not any(isinstance(t, torch.Tensor) for t in tree_flatten(ref)[0]):
                return Skip(name, op, "no tensor output")
            if not outputs_equal(ref, again):
                return Skip(name, op, "eager runs differ")
            stage, subject = f"torch.jit.{how}", fresh().train(training)
            buffers = {key: b.clone() for key, b in subject.named_buffers()}
            if how == "script":
                model = torch.jit.script(subject)
            else:
                model = torch.jit.trace(subject, tuple(copies(inputs)), check_trace=False,
                                        strict=False)
            for key, b in model.named_buffers():
                if key in buffers:
                    b.copy_(buffers[key])
            stage, saved_model, saved_inputs = "exported model", io.BytesIO(), io.BytesIO()
            torch.jit.save(model, saved_model)
            torch.save(list(inputs), saved_inputs)
            saved_model.seek(0)
            saved_inputs.seek(0)
            loaded = torch.jit.load(saved_model).train(training)
            if not outputs_equal(loaded(*torch.load(saved_inputs)), ref):
                return Skip(name, op, "exported model differs from eager")
    except Exception as e:  # pylint: disable=broad-except
        return Skip(name, op, f"{stage} fails: {str(e)[:200]}")
    return Case(name, op, model, list(inputs), mode)


def op_case(name, op, fn, sample, clone_first=False):
    """A case calling fn on an OpInfo sample; clone_first: on a copy of its first tensor."""
    leaves, spec = tree_flatten(((sample.input,) + tuple(sample.args), dict(sample.kwargs)))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if not tensors:
        return Skip(name, op, "no tensor input")
    if clone_first and not isinstance(leaves[0], torch.Tensor):
        return Skip(name, op, "in-place target is not a tensor")
    if any(t.layout != torch.strided for t in tensors):
        return Skip(name, op, "non-strided input")
    return make_case(name, op, lambda: Call(fn, leaves, spec, clone_first), tensors, "eval",
                     "trace")


def op_cases(op_db, source, samples, keeps):
    """Yields the cases of one op_db source, ops in name order, each op's samples seeded."""
    for info in sorted(op_db, key=lambda o: (o.name, o.variant_test_name)):
        op = info.name + ("." + info.variant_test_name if info.variant_test_name else "")
        if not keeps(op):
            continue
        if source == "inplace" and info.inplace_variant is None:
            continue
        if RANDOM_OP.search(info.name):
            yield Skip(op, op, "random by name")
            continue
        count = {"opinfo": samples, "inplace": min(samples, 2), "noncontiguous": 1}[source]
        try:
            if torch.float32 not in info.supported_dtypes("cpu"):
                yield Skip(op, op, "no CPU float32")
                continue
            torch.manual_seed(0)
            chosen = list(itertools.islice(
                info.sample_inputs("cpu", torch.float32, requires_grad=False), count))
            if source == "noncontiguous":
                chosen = [s.noncontiguous() for s in chosen]
        except Exception as e:  # pylint: disable=broad-except
            yield Skip(op, op, f"samples fail: {str(e)[:200]}")
            continue
        fn, inplace = info.op, info.inplace_variant
        variants = {"opinfo": [("fn", fn, False)],
                    "inplace": [("ip", inplace, False), ("ipc", inplace, True)],
                    "noncontiguous": [("fn", fn, False), ("ip", inplace, False)]}[source]
        prefix = "nc" if source == "noncontiguous" else "op"
        for k, sample in enumerate(chosen):
            for suffix, call, clone_first in variants:
                if call is not None:
                    name = safe(f"{prefix}_{op}_{k}_{suffix}")
                    yield op_case(name, op, call, sample, clone_first)


def module_db_cases(module_db, samples, keeps):
    """module_db: per module, mode and sample, a scripted (tensor-only forward) and traced case."""
    for info in sorted(module_db, key=lambda m: m.name):
        if not keeps(info.name):
            continue
        if "Lazy" in info.name:  # materialize on first call: not a fixed graph
            yield Skip(info.name, info.name, "lazy module")
            continue
        for mode in ("eval", "train"):
            torch.manual_seed(0)
            try:
                entries = list(info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                                       requires_grad=False,
                                                       training=mode == "train"))[:samples]
            except Exception as e:  # pylint: disable=broad-except
                yield Skip(info.name, info.name, f"samples fail: {str(e)[:200]}")
                continue
            for k, entry in enumerate(entries):
                if entry.forward_input is None:
                    continue
                base = safe(f"mod_{info.name}_{mode}_{k}")
                ctor = entry.constructor_input
                try:
                    torch.manual_seed(k)
                    module = info.module_cls(*ctor.args, **ctor.kwargs)
                except Exception as e:  # pylint: disable=broad-except
                    yield Skip(base, info.name, f"constructor fails: {str(e)[:200]}")
                    continue
                args, kwargs = entry.forward_input.args, entry.forward_input.kwargs
                leaves, spec = tree_flatten((tuple(args), dict(kwargs)))
                tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
                if not tensors:
                    continue
                if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
                    yield make_case(base + "_script", info.name,
                                    lambda m=module: copy.deepcopy(m), tensors, mode, "script")
                yield make_case(base + "_trace", info.name,
                                lambda m=module, l=leaves, s=spec: Call(copy.deepcopy(m), l, s),
                                tensors, mode, "trace")


def nn_cases(common_nn, keeps):
    """common_nn's module and criterion tests (tensor inputs only), double made float."""
    tests = [(t, False) for t in common_nn.module_tests + common_nn.new_module_tests]
    tests += [(t, True) for t in common_nn.criterion_tests]
    for test, criterion in sorted(tests, key=lambda t: nn_test_name(t[0])):
        op = nn_test_name(test)
        if not keeps(op):
            continue
        if "Lazy" in op:
            yield Skip(op, op, "lazy module")
            continue
        try:
            ctor = test.get("constructor") or getattr(torch.nn, test["module_name"])
            torch.manual_seed(0)
            inputs = test["input_fn"]() if "input_fn" in test else torch.randn(test["input_size"])
            inputs = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
            if criterion:
                if "target_fn" not in test and "target_size" not in test:
                    yield Skip(op, op, "criterion without a target")
                    continue
                inputs.append(test["target_fn"]() if "target_fn" in test
                              else torch.randn(test["target_size"]))
            torch.manual_seed(1)
            module = ctor(*test.get("constructor_args", ())).float()
        except Exception as e:  # pylint: disable=broad-except
            yield Skip(op, op, f"setup fails: {str(e)[:200]}")
            continue
        if not all(isinstance(t, torch.Tensor) for t in inputs):
            yield Skip(op, op, "non-tensor inputs")
            continue
        inputs = [t.float() if t.is_floating_point() else t for t in inputs]
        # Train mode only matters to modules with state (BatchNorm's running stats).
        modes = ("eval", "train") if list(module.buffers()) else ("eval",)
        for mode in modes:
            for how in ("script", "trace"):  # trace only what cannot be scripted
                case = make_case(safe(f"nn_{op}_{mode}_{how}"), op,
                                 lambda m=module: copy.deepcopy(m), inputs, mode, how)
                yield case
                if isinstance(case, Case) or not case.why.startswith(("torch.jit", "exported")):
                    break


def nn_test_name(test):
    return test.get("fullname") or "_".join(filter(None, [test.get("module_name", "?"),
                                                           test.get("desc")]))


def safe(name):
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)


def run_cli(cmd, json_path, timeout):
    """Runs the CLI once; returns status (passed/failed/refused/crashed), rc and detail."""
    if os.path.exists(json_path):
        os.remove(json_path)  # from an earlier run into the same DIR
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"status": "crashed", "rc": None, "seconds": timeout,
                "detail": f"timed out after {timeout} s"}
    rc, stderr = proc.returncode, proc.stderr.strip().splitlines()
    result = {"rc": rc, "seconds": round(time.monotonic() - start, 2),
              "detail": stderr[-1] if stderr else ""}
    if rc < 0:
        result.update(status="crashed", detail=f"killed by {signal.strsignal(-rc)}")
    elif rc == 2:
        result["status"] = "refused"
    elif rc in (0, 1):
        try:
            with open(json_path) as f:
                validation = json.load(f)["validation"]
        except (OSError, ValueError, KeyError) as e:
            return dict(result, status="failed", detail=f"no validation in the JSON: {e}")
        failures = validation.get("failures") or []
        result.update(status="passed" if rc == 0 and validation.get("passed") is True
                      else "failed", failures=failures[:5],
                      unproved=len(validation.get("unproved") or []))
        if result["status"] == "failed":
            result["detail"] = failures[0] if failures else f"exit {rc}, passed is not true"
    else:
        result["status"] = "crashed"
    return result


def run_case(case, case_dir, cli, round_trip, timeout):
    """Validates the case; on a pass with round_trip, validates its saved trace too."""
    json_path, trace_path = (os.path.join(case_dir, n) for n in ("out.json", "trace.pt"))
    cmd = [cli, "--model", os.path.join(case_dir, "model.pt"), "--input",
           os.path.join(case_dir, "inputs.pt"), "--validate", "--json", json_path,
           "--mode", case.mode]
    result = run_cli(cmd + (["--save", trace_path] if round_trip else []), json_path, timeout)
    if round_trip and result["status"] == "passed":
        json_path = os.path.join(case_dir, "round_trip.json")
        trip = run_cli([cli, "--trace", trace_path, "--validate", "--json", json_path],
                       json_path, timeout)
        result["round_trip"] = trip
        if trip["status"] != "passed":
            result.update(status=trip["status"], detail="round trip: " + trip["detail"])
    if result["status"] == "passed" and os.path.exists(trace_path):
        os.remove(trace_path)  # kept when the round trip did not pass, to rerun it
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cli", required=True, help="the torchlens binary")
    parser.add_argument("--out", required=True, help="directory for cases and results")
    parser.add_argument("--sources", default=",".join(SOURCES), help=",".join(SOURCES))
    parser.add_argument("--ops", default="", help="only these ops and modules")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples per op (default 3) or module_db module (default 4)")
    parser.add_argument("--limit", type=int, default=None, help="stop after N cases")
    parser.add_argument("--round_trip_every", type=int, default=5,
                        help="round-trip every K-th case through --save and --trace (0: none)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per CLI run")
    parser.add_argument("--shard", default="0/1",
                        help="I/N: only the ops and modules whose name hashes to shard I of N "
                             "(Bazel's TEST_SHARD_INDEX/TEST_TOTAL_SHARDS)")
    args = parser.parse_args()
    try:
        shard, shards = (int(part) for part in args.shard.split("/"))
        assert 0 <= shard < shards
    except (ValueError, AssertionError):
        parser.error(f"--shard {args.shard}: expected I/N with 0 <= I < N")
    sources = args.sources.split(",")
    if set(sources) - set(SOURCES):
        parser.error(f"unknown sources {set(sources) - set(SOURCES)}; known: {SOURCES}")
    wanted = set(filter(None, args.ops.split(",")))

    def keeps(name):
        # A stable hash, so that every shard of a run agrees on who owns each name.
        return (not wanted or name in wanted) and zlib.crc32(name.encode()) % shards == shard

    cli = os.path.abspath(args.cli)

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    op_db, module_db, common_nn = import_test_suites()
    op_samples = 3 if args.samples is None else args.samples
    generators = {
        "opinfo": lambda: op_cases(op_db, "opinfo", op_samples, keeps),
        "inplace": lambda: op_cases(op_db, "inplace", op_samples, keeps),
        "noncontiguous": lambda: op_cases(op_db, "noncontiguous", 1, keeps),
        "modules": lambda: module_db_cases(
            module_db, 4 if args.samples is None else args.samples, keeps),
        "nn": lambda: nn_cases(common_nn, keeps),
    }
    os.makedirs(args.out, exist_ok=True)
    counts = dict.fromkeys(("passed", "failed", "crashed", "refused"), 0)
    ran, skipped, limited = set(), 0, False
    with open(os.path.join(args.out, "results.jsonl"), "w") as results, \
            open(os.path.join(args.out, "skips.jsonl"), "w") as skips:
        for item in itertools.chain.from_iterable(generators[s]() for s in sources):
            if isinstance(item, Skip):
                skips.write(json.dumps(item._asdict()) + "\n")
                skipped += 1
                continue
            if args.limit is not None and sum(counts.values()) >= args.limit:
                limited = True
                break
            case_dir = os.path.join(args.out, "cases", item.name)
            os.makedirs(case_dir, exist_ok=True)
            item.model.save(os.path.join(case_dir, "model.pt"))
            torch.save(item.inputs, os.path.join(case_dir, "inputs.pt"))
            every = args.round_trip_every
            round_trip = every > 0 and (sum(counts.values()) + 1) % every == 0
            result = run_case(item, case_dir, cli, round_trip, args.timeout)
            counts[result["status"]] += 1
            ran.add(item.op)
            results.write(json.dumps(dict(case=item.name, mode=item.mode, **result)) + "\n")
            results.flush()
            if result["status"] != "passed":
                print(f"{item.name}: {result['status']}: {result['detail']}", flush=True)
    print(f"{skipped} calls or exports skipped, why in {os.path.join(args.out, 'skips.jsonl')}")
    missing = sorted(name for name in wanted - ran if keeps(name)) if not limited else []
    for op in missing:
        print(f"{op}: no case (not in the sources, or every call skipped)")
    total = sum(counts.values())
    print(f"{total} cases: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['crashed']} crashed, {counts['refused']} refused")
    return 0 if total and counts["passed"] == total and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
