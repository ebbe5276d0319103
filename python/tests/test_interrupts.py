"""An exception arriving between any two lines of optjit's Python code (a KeyboardInterrupt, a timer's exception)
never breaks stepping for good: the call it interrupts raises it, and the next calls step as torch does. Checked at
every line the first, compiling call and a warm call run, with a trace function that raises at the n-th line."""

import os
import sys

import pytest
import torch

import optjit
from conftest import clone_params, make_params

PACKAGE = os.path.dirname(optjit.__file__)
SHAPES = [(6, 4), (5,)]


class Interrupt(Exception):
    pass


def interrupting_at(line):
    """A trace function that raises Interrupt at the `line`-th line event of optjit's own Python code."""
    seen = [0]

    def trace(frame, event, arg):
        if not frame.f_code.co_filename.startswith(PACKAGE):
            return None
        if event == "line":
            seen[0] += 1
            if seen[0] == line:
                raise Interrupt(f"at line event {line}: {frame.f_code.co_name}:{frame.f_lineno}")
        return trace

    return trace


def grads(params, step):
    generator = torch.Generator().manual_seed(step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator)


def run(line, warm):
    """Steps an Adam with max_grad_norm twice more after one call interrupted at `line`; returns whether that call was
    interrupted, and checks the params and state against torch after the steps that ran."""
    params = make_params(torch.float32, shapes=SHAPES)
    twin = clone_params(params)
    opt, reference = torch.optim.Adam(params, lr=0.05), torch.optim.Adam(twin, lr=0.05)
    step = optjit.compile(opt)
    calls = 0
    if warm:
        grads(params, calls)
        step()
        calls += 1
    grads(params, calls)
    sys.settrace(interrupting_at(line))
    try:
        step()
        interrupted = False
    except Interrupt:
        interrupted = True
    finally:
        sys.settrace(None)
    calls += 1
    # The interrupted call ran its update or did not: the torch state's step count says which.
    ran = calls if not interrupted else calls - 1 + int(any(opt.state[p].get("step", 0) == calls for p in params))
    for _ in range(2):
        grads(params, calls)
        step()  # never "already being stepped", never an internal error
        calls += 1
        ran += 1
    for s in range(calls):
        if s == calls - 3 and ran == calls - 1:
            continue  # the interrupted call changed nothing
        grads(twin, s)
        reference.step()
    for p, q in zip(params, twin):
        torch.testing.assert_close(p.detach(), q.detach(), msg=lambda m: f"interrupted at line {line}: {m}")
        for key, value in reference.state[q].items():
            torch.testing.assert_close(opt.state[p][key], value, msg=lambda m: f"line {line}, {key}: {m}")
    optjit.compile(opt)()  # another compiled step of the same optimizer takes the lock too
    return interrupted


@pytest.mark.parametrize("warm", [False, True], ids=["compiling call", "warm call"])
def test_an_interrupt_at_any_line_of_a_step_leaves_stepping_working(warm):
    line = 1
    while run(line, warm):
        line += 1
    assert line > 20  # the trace saw the call's lines
