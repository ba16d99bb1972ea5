#!/usr/bin/python3
"""The Python front-end's bench rows: eager capture against the plain eager forward.

usage: tools/bazelw run //tools:python -- tools/bench_python.py [--repeats N] [--rounds R] [--backward]

Rows (issue targets in parentheses), at 1 thread, in eval mode under torch.no_grad(), and
again with autograd on:
  resnet18 nosave   tl.trace(model, x, save=False) / model(x)   (<= 1.05x)
  resnet18 full     tl.trace(model, x) / model(x)               (<= 1.10x)
  mlp50    per op   (tl.trace(model, x) - model(x)) / ops, in microseconds (<= 1.0 us)
and, with --backward, forward and backward (of the output's sum) in training mode:
  resnet18 grads    tl.trace(model, x, save_grads=True) + backward / model(x) + backward (<= 1.10x)
  mlp50    grads    the same                                                          (<= 1.5x)
each run starting with every parameter's .grad set to None.
torchvision ResNet-18 at 1x3x224x224, a 50-layer Linear(16)+ReLU MLP at 1x16. Each round
times the plain forward and each capture alternately, `repeats` times each, and takes
medians; the table gives each row's median over rounds and its spread. Results go in
tools/BENCH_RESULTS.md.
"""
import argparse
import statistics
import sys
import time

import torch
import torchvision

import torchlens_cpp as tl


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(model, x, repeats, grad):
    """Medians of plain, full and nosave, timed alternately."""
    context = torch.enable_grad if grad else torch.no_grad
    with context():
        calls = {
            "plain": lambda: model(x),
            "full": lambda: tl.trace(model, x),
            "nosave": lambda: tl.trace(model, x, save=False),
        }
        for fn in calls.values():  # warm up caches, allocator and plans
            fn()
            fn()
        times = {name: [] for name in calls}
        for _ in range(repeats):
            for name, fn in calls.items():
                times[name].append(timed(fn))
        ops = sum(1 for op in tl.trace(model, x).ops if op.func_name)
    return {name: statistics.median(t) for name, t in times.items()}, ops


def measure_backward(model, x, repeats):
    """Medians of the plain forward and backward and the captured one with gradients."""
    params = list(model.parameters())

    def plain():
        model(x).sum().backward()

    def grads():
        tl.trace(model, x, save_grads=True).output.sum().backward()

    calls = {"plain": plain, "grads": grads}
    times = {name: [] for name in calls}
    for rep in range(repeats + 2):
        for name, fn in calls.items():
            for p in params:
                p.grad = None
            elapsed = timed(fn)
            if rep >= 2:  # warm-up
                times[name].append(elapsed)
    return {name: statistics.median(t) for name, t in times.items()}


def main_backward(args, cases):
    print("| model | plain fwd+bwd | save_grads fwd+bwd |")
    print("|---|---|---|")
    for name, model, x, repeats in cases:
        model.train()
        rounds = [measure_backward(model, x, repeats) for _ in range(args.rounds)]
        ratios = " / ".join(f"{r['grads'] / r['plain']:.3f}x" for r in rounds)
        plain = statistics.median(r["plain"] for r in rounds)
        print(f"| {name} | {plain * 1e3:.3f} ms | {ratios} |")
        sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backward", action="store_true",
                        help="the gradient rows (forward and backward) instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(*[layer for _ in range(50)
                                for layer in (torch.nn.Linear(16, 16), torch.nn.ReLU())]).eval()
    resnet = torchvision.models.resnet18().eval()
    cases = [("resnet18", resnet, torch.randn(1, 3, 224, 224), max(args.repeats // 3, 5)),
             ("mlp50", mlp, torch.randn(1, 16), args.repeats * 10)]
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds")
    if args.backward:
        main_backward(args, cases)
        return
    print("| model | autograd | plain | nosave | full | added per op (full) | ops |")
    print("|---|---|---|---|---|---|---|")
    for name, model, x, repeats in cases:
        for grad in (False, True):
            rounds = [measure(model, x, repeats, grad) for _ in range(args.rounds)]
            ops = rounds[0][1]
            plain = [r[0]["plain"] for r in rounds]
            nosave = [r[0]["nosave"] / r[0]["plain"] for r in rounds]
            full = [r[0]["full"] / r[0]["plain"] for r in rounds]
            per_op = [(r[0]["full"] - r[0]["plain"]) / ops * 1e6 for r in rounds]

            def spread(values, fmt):
                return " / ".join(fmt.format(v) for v in values)

            print(f"| {name} | {'on' if grad else 'off'} "
                  f"| {statistics.median(plain) * 1e3:.3f} ms "
                  f"| {spread(nosave, '{:.3f}x')} | {spread(full, '{:.3f}x')} "
                  f"| {spread(per_op, '{:.2f} us')} | {ops} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
