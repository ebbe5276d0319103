"""@optjit.step_function: a step written with torch's own calls on lists of tensors, compiled by optjit.

The function runs once on symbolic lists (each element a _SymTensor, which takes torch's calls through
__torch_function__, tensor methods and operators) and symbolic hyperparameters (_SymScalar, with Python's
arithmetic), which records it into a StepRecording, a program of list ops (optjit._step_recording, on the C++
front end's recording); optjit compiles that program
(compile_step) to as few kernels as the data allows and runs it in place on the caller's tensors. The undecorated
function (`fn.eager`) still runs eagerly on torch tensors.

    @optjit.step_function
    def lion(params, grads, exp_avgs, *, lr, beta1, beta2, weight_decay):
        update = torch._foreach_lerp(exp_avgs, grads, 1 - beta1)
        torch._foreach_sign_(update)
        torch._foreach_mul_(params, 1 - lr * weight_decay)
        torch._foreach_add_(params, update, alpha=-lr)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta2)

    lion(params, grads, exp_avgs, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.1)   # compiled, in place

The same step may be written one tensor at a time, with torch ops, tensor methods and operators on the lists'
elements: in a loop over zip(params, grads, ...), or with torch._higher_order_ops.foreach_map, which calls a function
on each entry's tensors (every entry must go through the same ops, as they do in such a loop):

    @optjit.step_function
    def lion(params, grads, exp_avgs, *, lr, beta1, beta2, weight_decay):
        for p, g, m in zip(params, grads, exp_avgs):
            p.mul_(1 - lr * weight_decay).add_(torch.sign(torch.lerp(m, g, 1 - beta1)), alpha=-lr)
            m.lerp_(g, 1 - beta2)

Positional arguments are tensor lists: the params first, their grads second, then state lists, one tensor per param
(a list of 0-d tensors beside params that are not all 0-d is per-tensor scalar state, such as a step count). Keyword
arguments are hyperparameters (numbers, or tuples or lists of them such as betas=(0.9, 0.999)): new values never
recompile. Bools, None and strings are static arguments the function may branch on (maximize=True): another value
records and compiles the step again (one variant is kept: alternating values compile each time). An op outside the
vocabulary raises optjit.Error naming it.

A value over all the lists, such as clip_grad_norm_'s total norm, is written as torch writes it: per-tensor scalars
(torch._foreach_norm), torch.stack of them, then a norm, sum or max of the stack (and torch.clamp on the result).
optjit combines it over every tensor when the pass computing the per-tensor values has ended, so a clipped SGD is
two kernels: the norms, then the update.

    @optjit.step_function
    def clipped_sgd(params, grads, *, lr, max_norm):
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        torch._foreach_add_(params, torch._foreach_mul(grads, coef), alpha=-lr)

Matrix products of 2-D elements record as torch writes them (x @ x.T, torch.mm, torch.addmm, x.bfloat16() for
torch's bf16 arithmetic) and run in the matrix library between the kernels: torch.optim.Muon's step written so is
the built-in Muon's plan (docs/python.md).

Over FSDP2's DTensors each process steps its local shards, and a norm, sum or max is the whole tensor's: each
process's partials are all-reduced over the mesh when the kernel computing them has ended, as torch reduces the
Partial DTensors of an eager run. A size (numel(), size(), a mean) or rows and columns state spans the shards too and
is refused."""

import collections
import dis
import functools
import inspect
import numbers
import time
import types
import warnings
import weakref

import torch

from ._compiled import _cuda_streams, _increment_versions, _live_steps
from ._shards import _local, _shard_reducer
from ._optjit import Error, Holds, StepRecording, TorchStepFunction
from ._step_recording import _SymScalar, _SymTensor


class StepFunction:
    """A step function compiled by optjit; call it with torch tensor lists and hyperparameters."""

    def __init__(self, fn, name=None):
        functools.update_wrapper(self, fn)
        self.eager = fn
        self._name = _graph_name(name or getattr(fn, "__name__", None) or type(fn).__name__)
        # Compiled variants by what they were recorded and built for (the lists' slots and kinds, the arguments'
        # names and static values, the tensors), most recently used last: a function called for several param
        # groups (an Optimizer subclass's step, HF Trainer's two groups) keeps one per group, as torch.compile keeps
        # one graph per guard set, instead of rebuilding at every call.
        self._variants = collections.OrderedDict()
        self._programs = collections.OrderedDict()  # recorded programs by what they were recorded for
        self._built_keys = set()  # every variant key ever built: building one again is a rebuild
        self._cxx = None  # the last call's variant
        self._metrics = dict(calls=0, records=0, compiles=0, rebuilds=0, cache_hits=0, compile_ms=0.0)
        self._warned_rebuilds = False
        self._bound = weakref.WeakKeyDictionary()  # as a method: each instance's step function (__get__)
        self._names_read = None  # the globals and attributes the function's code reads (_outside_values)
        _live_steps.add(self)

    def _release(self):
        """Drops the compiled variants (at interpreter exit: optjit._compiled._release_at_exit)."""
        self._variants.clear()
        self._programs.clear()
        self._cxx = None

    def _list_names(self, count):
        """The slot of each list: "param", "grad", then each state list's parameter name (another name where it
        would be "param" or "grad")."""
        params = inspect.signature(self.eager).parameters
        positional = [n for n, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if count < 2 or count > len(positional):
            raise Error(
                f"step function {self._name} takes {len(positional)} tensor lists (params, grads, then state); "
                f"called with {count}"
            )
        names = ["param", "grad"]
        for name in positional[2:count]:
            while name in names or name in positional[:2]:
                name = f"state_{name}"
            names.append(name)
        return names

    @staticmethod
    def _list_kinds(names, lists):
        """The state lists that do not hold one tensor like each param, by name: "scalar" for per-tensor scalars
        (0-d tensors beside params that are not all 0-d), "rows" for one value per row ([..., m, 1] beside params
        [..., m, n]) and "cols" for one per column ([..., 1, n]), as Adafactor's factored state."""
        params, kinds = lists[0], {}

        def axis_list(state, dim):  # every tensor one per row (dim -1) or column (dim -2) of its param, not all alike
            fits = [
                p.dim() >= 2 and tuple(t.shape) == tuple(1 if d == p.dim() + dim else n for d, n in enumerate(p.shape))
                for p, t in zip(params, state)
            ]
            return all(fits) and any(p.shape[dim] != 1 for p in params)

        for k in range(2, len(lists)):
            if all(t.dim() == 0 for t in lists[k]) and not all(p.dim() == 0 for p in params):
                kinds[names[k]] = "scalar"
            elif axis_list(lists[k], -1):
                kinds[names[k]] = "rows"
            elif axis_list(lists[k], -2):
                kinds[names[k]] = "cols"
        return kinds

    def _record(self, names, kinds, lists, hypers, statics, sequences):
        params0 = lists[0]
        program = StepRecording(self._name, len(params0), min(p.dim() for p in params0))
        try:
            program.open()
            return self._record_into(program, names, kinds, lists, hypers, statics, sequences)
        finally:
            program.close()  # values kept past this recording are refused by name when used

    def _record_into(self, program, names, kinds, lists, hypers, statics, sequences):
        params0 = lists[0]
        sym_lists = []
        for name in names:
            vid = program.list(name, _HOLDS[kinds.get(name, "el")])
            if kinds.get(name) == "scalar":
                sym_lists.append([_SymScalar(program, vid, entry=k, tensor=True) for k in range(len(params0))])
            else:
                sym_lists.append([_SymTensor(program, vid, k) for k in range(len(params0))])
        initial = [lst[0].id for lst in sym_lists]
        # The elements as they were given: an op writes them in place. (Putting another value in a list's entry,
        # params[k] = ..., writes nothing, as in torch.)
        elements = [list(lst) for lst in sym_lists]
        sym_hypers = dict(statics)
        for k, v in hypers.items():
            sym_hypers[k] = _SymScalar(program, program.hyper(k))
        for k, (size, is_list) in sequences.items():  # one hyperparameter per element, in a tuple (or list)
            values = [sym_hypers.pop(_element_name(k, i)) for i in range(size)]
            sym_hypers[k] = values if is_list else tuple(values)
        try:
            returned = self.eager(*sym_lists, **sym_hypers)
        except Error:
            raise
        except Exception as e:
            # What the function does with its symbolic values that torch or Python refuse (torch.tensor(lr): torch
            # cannot tell the dtype of a value it does not see) is named as the step function's, as optjit.Error.
            raise Error(
                f"step function {self._name} raised {type(e).__name__} while optjit recorded it: {e}. A step "
                "function is recorded with symbolic tensors and hyperparameters: it may call torch ops, tensor "
                "methods and Python operators on them, not make tensors of them (torch.tensor(lr)) or read their values"
            ) from e
        if returned is not None:
            raise Error(
                f"step function {self._name} returns a value: a compiled step's results are its lists, updated in "
                "place, and it returns None (call fn.eager for the value, or keep it in a list)"
            )
        stored = False
        for name, lst, first in zip(names, elements, initial):
            if len({element.id for element in lst}) != 1:
                raise Error(
                    f"step function {self._name} updates part of list '{name}': optjit records whole lists, and every "
                    "entry must go through the same ops (an op on some entries only, or a choice by position such as "
                    "`-lr if i == 0 else lr`, gives entries programs of their own)"
                )
            if lst[0].id != first:
                program.store(name, lst[0].id)
                stored = True
        if not stored:
            raise Error(
                f"step function {self._name} changes none of its lists: a step writes its params or state in place "
                "(torch._foreach_add_, p.add_(...), ...)"
            )
        return program

    def __get__(self, obj, objtype=None):
        """As a method: the instance is the function's first argument. Each instance gets a step function of its own,
        recorded with it (the numbers, bools and strings the function reads of the instance, self.beta, are guarded
        as globals are); kept while the instance lives, or made anew at each access for an instance that takes no
        weak reference (which then records at every call)."""
        if obj is None:
            return self
        try:
            bound = self._bound.get(obj)
        except TypeError:  # no weak reference to it
            bound = None
        if bound is None:
            bound = StepFunction(functools.partial(self.eager, obj), name=self._name)
            functools.update_wrapper(bound, self.eager)  # the method's name and docs (eager stays the partial)
            try:
                self._bound[obj] = bound
            except TypeError:
                pass
        return bound

    def __call__(self, *lists, **hypers):
        for k, lst in enumerate(lists):
            if not isinstance(lst, (list, tuple)):
                raise Error(
                    f"step function {self._name}: positional argument {k} is {type(lst).__name__}: positional "
                    "arguments are tensor lists (params, grads, then state); pass hyperparameters by keyword (lr=0.1)"
                )
            for j, t in enumerate(lst):
                if not isinstance(t, torch.Tensor):
                    raise Error(
                        f"step function {self._name}: entry {j} of positional argument {k} is {t!r}, not a tensor "
                        "(a param without a grad: leave it out of every list)"
                    )
                if t.is_complex():
                    raise Error(
                        f"step function {self._name}: entry {j} of positional argument {k} is a complex tensor: "
                        "step functions compute on real numbers; pass torch.view_as_real views, as torch.optim's "
                        "foreach steps step complex params"
                    )
        lists = [list(lst) for lst in lists]
        if not lists or any(len(lst) != len(lists[0]) for lst in lists):
            raise Error(f"step function {self._name}: give tensor lists of one tensor per param")
        if not lists[0]:
            raise Error(f"step function {self._name}: its lists are empty (torch's foreach ops need a tensor each)")
        hypers, statics, sequences = self._keywords(hypers)

        def tensors(group):
            # Everything a view of the tensor depends on: a grad is not held between calls, so a new one at a freed
            # one's address is the same view only if its layout is the same too. (A DTensor's view is of its local
            # tensor: its own address is 0, and a new grad DTensor may take a freed one's id.) torch's lazy negation
            # bit too: such a tensor holds -value in its memory, and is stepped through a staged copy.
            return tuple(
                (id(t), m.data_ptr(), tuple(m.shape), m.stride(), m.dtype, m.device, m.is_neg())
                for lst in group
                for t, m in ((t, _local(t)) for t in lst)
            )

        # Grads with the negation bit (`.conj().imag` of a complex tensor) are read through resolved copies.
        lists[1] = [g.resolve_neg() if _local(g).is_neg() else g for g in lists[1]]

        held = tensors(lists[:1] + lists[2:])
        known = next((k for k in reversed(self._variants) if k[1] == held and len(lists) == len(k[0][0])), None)
        if known is not None:
            names, kinds = known[0][0], dict(known[0][1])  # the same tensors: the same slots and kinds
        else:
            names = self._list_names(len(lists))
            kinds = self._list_kinds(names, lists)
        # What the recorded program depends on (the lists, their kinds and the hyperparameters' names), then
        # the tensors; the grads apart: new grad tensors every call (after each backward) only repoint the compiled
        # step's grads. Nothing is kept from a call that failed before its step ran.
        # (The lists' length too: Python code in the function may read it, len(params), and the recording keeps it.)
        # (The params' lowest rank too: size(-2) of a 1-D param is refused when recorded.)
        ranks = min(t.dim() for t in lists[0])
        # (The static arguments' values too: the function may branch on them; and the numbers, bools and strings it
        # reads from its module and its closure, which the recording fixes.)
        recorded_for = (
            tuple(names),
            tuple(sorted(kinds.items())),
            tuple(sorted(hypers)),
            len(lists[0]),
            ranks,
            tuple(sorted((k, type(v).__name__, v) for k, v in statics.items())),
            tuple(sorted(sequences.items())),
            self._outside_values(),
        )
        key = (recorded_for, held, tensors(lists[1:2]))
        self._metrics["calls"] += 1
        variant = self._variants.get(key[:2])
        if variant is None:
            variant = self._build(key, names, kinds, lists, hypers, statics, sequences)
        else:
            self._variants.move_to_end(key[:2])
            self._metrics["cache_hits"] += 1
            if key[2] != variant.grads:
                variant.cxx.set_grads(lists[1])
                variant.grads = key[2]
        self._cxx = variant.cxx
        if variant.staged:
            with torch.no_grad():
                for k, j, copy in variant.staged:  # the values now: they may have changed since the last call
                    copy.copy_(lists[k][j])
        with variant.streams.lend():
            variant.cxx({k: float(v) for k, v in hypers.items()})
        if variant.staged:
            with torch.no_grad():
                for k, j, copy in variant.staged:
                    if k in variant.written:
                        lists[k][j].copy_(copy)  # through torch, which writes -value into a negated view's memory
        # The lists it wrote changed in place, as torch's foreach ops would have counted (autograd's version).
        _increment_versions([t for k in variant.written for t in lists[k]])

    def _build(self, key, names, kinds, lists, hypers, statics, sequences):
        """Records (unless a program recorded for the same lists and arguments is kept) and compiles the variant for
        `key`, keeps it (the least recently used one goes past _VARIANTS), and returns it."""
        start = time.perf_counter()
        program = self._programs.get(key[0])
        if program is None:
            program = (self._record(names, kinds, lists, hypers, statics, sequences), names, kinds)
            self._metrics["records"] += 1
        recording, names, kinds = program
        streams = _cuda_streams([t for lst in lists for t in lst])
        # Params and state with the negation bit are stepped in copies holding their values, written back after
        # each call (grads were resolved already).
        staged = [(k, j, t.resolve_neg()) for k, lst in enumerate(lists) for j, t in enumerate(lst) if t.is_neg()]
        bound = [list(lst) for lst in lists]
        for k, j, copy in staged:
            bound[k][j] = copy
        with streams.lend():
            cxx = TorchStepFunction(
                recording,
                list(zip(names, bound)),
                {k: float(v) for k, v in hypers.items()},
                _shard_reducer(lists[0], f"step function {self._name}'s reductions", recording.reduces()),
            )
        stored = set(recording.stored_slots())
        written = [k for k, name in enumerate(names) if name in stored]
        variant = _Variant(cxx, streams, written, key[2], staged)
        # Kept only once whole: a call that failed before its step ran leaves nothing behind.
        for cache, cache_key, value in ((self._programs, key[0], program), (self._variants, key[:2], variant)):
            cache[cache_key] = value
            cache.move_to_end(cache_key)
            while len(cache) > _VARIANTS:
                cache.popitem(last=False)
        self._metrics["compiles"] += 1
        self._metrics["compile_ms"] += 1000 * (time.perf_counter() - start)
        if key[:2] in self._built_keys:
            self._metrics["rebuilds"] += 1
            if not self._warned_rebuilds:
                self._warned_rebuilds = True
                warnings.warn(
                    f"step function {self._name} is compiled again for tensors and arguments it was compiled for "
                    f"before: its calls alternate between more than {_VARIANTS} variants (param groups, static "
                    "arguments, new tensors every call), and each one past that rebuilds; metrics() counts them",
                    stacklevel=3,
                )
        self._built_keys.add(key[:2])
        return variant

    def metrics(self):
        """What calling the function did: calls, records (programs recorded), compiles (variants built), rebuilds
        (variants built again after being dropped), cache_hits (calls that found their variant), variants (kept
        now), compile_ms (recording and building)."""
        return dict(self._metrics, variants=len(self._variants))

    def _outside_values(self):
        """The numbers, bools, strings and None the function reads from its module's globals, from its closure and,
        as a method, from its instance's attributes: a recording fixes them, so another value records again, as
        torch.compile guards on them. (Values read through other objects, or by functions it calls, are fixed when
        it records.)"""
        fn = self.eager
        instance = fn.args[0] if isinstance(fn, functools.partial) and fn.args else None
        fn = getattr(fn, "func", fn)
        code = getattr(fn, "__code__", None)
        if code is None:
            return ()
        if self._names_read is None:
            self._names_read = _names_read(code)
        globals_read, attributes = self._names_read
        values = []
        module = getattr(fn, "__globals__", {})
        for name in sorted(globals_read):
            if name in module and isinstance(module[name], _SIMPLE):
                values.append(("global", name, _comparable(module[name])))
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
            if isinstance(value, _SIMPLE):
                values.append(("closure", name, _comparable(value)))
        fields = getattr(instance, "__dict__", None)
        if isinstance(fields, dict):
            for name in sorted(attributes):
                if name in fields and isinstance(fields[name], _SIMPLE):
                    values.append(("attribute", name, _comparable(fields[name])))
        return tuple(values)

    def _keywords(self, given):
        """The keyword arguments as (hyperparameters, static arguments, sequences): a number, or a one-element
        tensor's value, is a hyperparameter, whose new values never recompile; a tuple or list of numbers
        (betas=(0.9, 0.999)) is one hyperparameter per element (`name_0`, `name_1`, ...), given to the function as a
        tuple or list of them; a bool (a bool tensor's too), None or a string is static: the function sees the value
        itself (it may branch on it), and another value records and compiles the step again, as torch.compile treats
        them. `sequences` maps each tuple or list argument to (its length, tuple or list)."""
        hypers, statics, sequences = {}, {}, {}

        def refuse(k, v, why=_KEYWORDS_TAKEN):
            raise Error(f"step function {self._name}: keyword argument {k} is {v!r}: {why}")

        def add(name, value, k, v):
            if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool:
                value = value.item()
            if _is_bool(value) or not isinstance(value, numbers.Real):  # numpy's numbers too
                refuse(k, v)
            if name in hypers:
                raise Error(
                    f"step function {self._name}: the hyperparameter {name} is given twice: as keyword argument {k} "
                    "and as a keyword argument or an element of a tuple of that name (name_0, name_1, ...): rename one"
                )
            try:
                hypers[name] = float(value)
            except OverflowError:
                refuse(k, v, "it is beyond a float's range")

        for k, v in given.items():
            if isinstance(v, torch.Tensor) and v.numel() == 1 and v.dtype == torch.bool:
                statics[k] = bool(v.item())
            elif _is_bool(v) or v is None or isinstance(v, str):
                statics[k] = bool(v) if _is_bool(v) else v
            elif isinstance(v, (tuple, list)):
                if not v:
                    refuse(k, v, "an empty sequence holds no hyperparameter; leave it out")
                sequences[k] = (len(v), type(v) is list)
                for i, element in enumerate(v):
                    add(_element_name(k, i), element, k, v)
            else:
                add(k, v, k, v)
        return hypers, statics, sequences

    @property
    def kernel_count(self):
        """Kernels the last call's step launches."""
        return None if self._cxx is None else self._cxx.kernel_count()

    @property
    def library_call_count(self):
        """Matrix products the last call's step runs in the matrix library between its kernels."""
        return None if self._cxx is None else self._cxx.library_call_count()

    def dump(self, stage="fused"):
        """The last call's step at one stage: "traced", "optimized", "fused", "llvm" or "ptx"."""
        if self._cxx is None:
            raise Error(f"step function {self._name} has not been called yet: nothing is compiled")
        return self._cxx.dump(stage)


# Variants kept per step function (torch.compile's recompile limit is 8 too).
_VARIANTS = 8


class _Variant:
    """One compiled variant of a step function: its C++ step, the CUDA streams it runs on, the lists it writes (by
    position), and the grads it was last pointed at (their identities and layouts)."""

    __slots__ = ("cxx", "streams", "written", "grads", "staged")

    def __init__(self, cxx, streams, written, grads, staged):
        self.cxx, self.streams, self.written, self.grads = cxx, streams, written, grads
        self.staged = staged  # (list, entry, copy) of each tensor with the negation bit, stepped in its copy


def _is_bool(value):
    """A bool, Python's or numpy's."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"))


def _names_read(code):
    """The names `code` loads as globals and as attributes, its nested code's (comprehensions, lambdas, inner
    functions) included."""
    globals_read, attributes = set(), set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            globals_read.add(instruction.argval)
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            attributes.add(instruction.argval)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            inner_globals, inner_attributes = _names_read(constant)
            globals_read |= inner_globals
            attributes |= inner_attributes
    return globals_read, attributes


# The values a recording guards on: numbers (numpy's too), bools, strings and None.
_SIMPLE = (numbers.Number, str, type(None))


def _comparable(value):
    """`value` for a key, with its type: a real number that is not an integer by its bits as a float (NaN equals NaN,
    -0.0 is not 0.0)."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return (type(value).__name__, float(value).hex())
    return (type(value).__name__, value)


_KEYWORDS_TAKEN = (
    "a step function takes numbers (or tuples of them) as hyperparameters, and bools, None and strings as static "
    "arguments"
)


def _element_name(name, index):
    """The hyperparameter that holds element `index` of the tuple (or list) keyword argument `name`."""
    return f"{name}_{index}"


def _graph_name(name):
    """A step function's name as the identifier its graph is named by ("<lambda>" becomes "lambda")."""
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name)).strip("_") or "step"
    return text if not text[0].isdigit() else f"step_{text}"


# What a list of each kind (StepFunction._list_kinds) holds per tensor in the recording.
_HOLDS = {"el": Holds.element, "scalar": Holds.tensor, "rows": Holds.rows, "cols": Holds.cols}


def step_function(fn=None, *, name=None):
    """Decorates a step written with torch's calls on tensor lists (foreach ops, or ops on each list's tensors) so that
    calling it runs optjit's compiled step."""
    if fn is None:
        return lambda f: StepFunction(f, name)
    return StepFunction(fn, name)
