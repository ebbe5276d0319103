"""@optjit.step_function: a step written with torch's own foreach calls on lists of tensors, compiled by optjit.

The function runs once on symbolic lists (each element a _SymTensor, which takes torch's calls through
__torch_function__) and symbolic hyperparameters (_SymScalar, with Python's arithmetic), which records it as a
program of list ops; optjit compiles that program (compile_step) to as few kernels as the data allows and runs it in
place on the caller's tensors. The undecorated function (`fn.eager`) still runs eagerly on torch tensors.

    @optjit.step_function
    def lion(params, grads, exp_avgs, *, lr, beta1, beta2, weight_decay):
        update = torch._foreach_lerp(exp_avgs, grads, 1 - beta1)
        torch._foreach_sign_(update)
        torch._foreach_mul_(params, 1 - lr * weight_decay)
        torch._foreach_add_(params, update, alpha=-lr)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta2)

    lion(params, grads, exp_avgs, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.1)   # compiled, in place

Positional arguments are tensor lists: the params first, their grads second, then state lists, one tensor per param
(a list of 0-d tensors beside params that are not all 0-d is per-tensor scalar state, such as a step count). Keyword
arguments are hyperparameters (numbers): new values never recompile. An op outside the vocabulary raises optjit.Error
naming it.

A value over all the lists, such as clip_grad_norm_'s total norm, is written as torch writes it: per-tensor scalars
(torch._foreach_norm), torch.stack of them, then a norm, sum or max of the stack (and torch.clamp on the result).
optjit combines it over every tensor when the pass computing the per-tensor values has ended, so a clipped SGD is
two kernels: the norms, then the update.

    @optjit.step_function
    def clipped_sgd(params, grads, *, lr, max_norm):
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        torch._foreach_add_(params, torch._foreach_mul(grads, coef), alpha=-lr)"""

import functools
import inspect

import torch

from ._compiled import _cuda_streams, _increment_versions, _sharded
from ._optjit import Error, StepInstruction, TorchStepFunction


class _Program:
    """The recorded instructions. A value is recorded once: the same op on the same operands gives the same id, so
    a value written per element of a list (`[1 - beta1 ** s for s in steps]`) is one value of the whole list."""

    def __init__(self, length):
        self.instructions = []
        self._ids = {}
        self.length = length  # tensors per list: ops take whole lists

    def emit(self, op, *inputs, name="", number=0.0):
        key = (op, tuple(inputs), name, float(number))
        if key in self._ids and not op.startswith("store"):
            return self._ids[key]
        self.instructions.append(StepInstruction(op, [i for i in inputs], name, float(number)))
        self._ids[key] = len(self.instructions) - 1
        return self._ids[key]


def _operand(program, x):
    """The recorded value of an operand: a symbolic list or scalar, or a Python number (a constant)."""
    if isinstance(x, (_SymTensor, _SymScalar)):
        return x.id
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise Error(f"a step function's operand is {x!r}: optjit records tensor lists, hyperparameters and numbers")
    return program.emit("constant", number=x)


def _entry_of(*values):
    """The list entry that values computed together belong to: None for values of every entry alike (hyperparameters,
    constants, a value over the lists), else the position of the tensor whose value it is (element k of a list, and
    Python arithmetic on it). Values of two different entries cannot be combined: a compiled step computes each
    entry from its own tensor's values."""
    entries = {v.entry for v in values if isinstance(v, (_SymScalar, _SymTensor)) and v.entry is not None}
    if len(entries) > 1:
        raise Error(
            "a step function combines the values of different tensors of a list (such as sum() over a list, or "
            "lists zipped out of order): optjit records each tensor's step from its own values; reduce over the "
            "lists with torch.stack(...).sum(), .max() or a norm"
        )
    return entries.pop() if entries else None


class _SymScalar:
    """A hyperparameter, a constant, or Python arithmetic on them: one value per list entry. A 2-norm of each tensor
    (torch._foreach_norm) remembers its sum of squares (`squares`), from which the 2-norm over the lists is taken.
    `entry` is the list position it belongs to (_entry_of)."""

    def __init__(self, program, vid, squares=None, entry=None):
        self.program, self.id, self.squares, self.entry = program, vid, squares, entry

    def _binary(self, op, other, reverse=False):
        a, b = self.id, _operand(self.program, other)
        entry = _entry_of(self, other)
        return _SymScalar(self.program, self.program.emit(op, *((b, a) if reverse else (a, b))), entry=entry)

    def __add__(self, o):
        return self._binary("add", o)

    def __radd__(self, o):
        return self._binary("add", o, True)

    def __sub__(self, o):
        return self._binary("sub", o)

    def __rsub__(self, o):
        return self._binary("sub", o, True)

    def __mul__(self, o):
        return self._binary("mul", o)

    def __rmul__(self, o):
        return self._binary("mul", o, True)

    def __truediv__(self, o):
        return self._binary("div", o)

    def __rtruediv__(self, o):
        return self._binary("div", o, True)

    def __pow__(self, o):
        return self._binary("pow", o)

    def __rpow__(self, o):
        return self._binary("pow", o, True)

    def __neg__(self):
        return _SymScalar(self.program, self.program.emit("neg", self.id), entry=self.entry)

    def __gt__(self, o):
        return self._binary("gt", o)

    def __lt__(self, o):
        return self._binary("lt", o)

    def __ge__(self, o):  # a >= b: a > b or a == b (0 for NaN, as Python's)
        gt, eq = self._binary("gt", o), self._binary("eq", o)
        return _SymScalar(self.program, self.program.emit("add", gt.id, eq.id), entry=gt.entry)

    def __le__(self, o):
        lt, eq = self._binary("lt", o), self._binary("eq", o)
        return _SymScalar(self.program, self.program.emit("add", lt.id, eq.id), entry=lt.entry)

    # == and != are values too: Python's own would compare identities and silently fix a branch.
    def __eq__(self, o):
        return self._binary("eq", o)

    def __ne__(self, o):
        eq = self._binary("eq", o)
        return _SymScalar(self.program, self.program.emit("sub", _operand(self.program, 1), eq.id), entry=eq.entry)

    __hash__ = object.__hash__

    def __abs__(self):
        return _SymScalar(self.program, self.program.emit("abs", self.id), entry=self.entry)

    def __bool__(self):
        raise Error("a step function branches on a hyperparameter's value: optjit records one program for every value")

    def __float__(self):
        raise Error(
            "a step function turns a hyperparameter or per-tensor scalar into a Python number (float(), int(), "
            "math.*): optjit records one program for every value; write it with Python operators (** 0.5 for a "
            "square root) or torch calls"
        )

    __int__ = __index__ = __complex__ = __float__

    def __getattr__(self, name):
        _refuse_attribute("a per-tensor scalar or hyperparameter", name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


for _name, _symbol in (("floordiv", "//"), ("mod", "%"), ("divmod", "divmod()")):
    setattr(_SymScalar, f"__{_name}__", lambda self, *a, _s=_symbol: _refuse_scalar_operator(_s))
    setattr(_SymScalar, f"__r{_name}__", lambda self, *a, _s=_symbol: _refuse_scalar_operator(_s))
for _name in ("round", "trunc", "floor", "ceil"):
    setattr(_SymScalar, f"__{_name}__", lambda self, *a, _s=_name: _refuse_scalar_operator(f"{_s}()"))


def _refuse_scalar_operator(symbol):
    raise Error(
        f"{symbol} on a hyperparameter or per-tensor scalar is outside optjit's step-function vocabulary (+, -, *, "
        "/, **, comparisons, abs)"
    )


class _SymStack:
    """torch.stack of a list of per-tensor scalars (such as _foreach_norm's): reducing it (sum, max, a norm) combines
    the value over every tensor of the lists, which gives one value, the same for every tensor (a _SymScalar)."""

    def __init__(self, program, vid, squares=None):
        self.program, self.id, self.squares = program, vid, squares

    def sum(self):
        return _SymScalar(self.program, self.program.emit("list_sum", self.id))

    def max(self):
        return _SymScalar(self.program, self.program.emit("list_max", self.id))

    amax = max

    def norm(self, p=2):
        return _norm(self, p)

    def __getattr__(self, name):
        _refuse_attribute("a torch.stack of per-tensor scalars", name)

    def __getitem__(self, index):
        raise Error(
            "indexing a torch.stack of per-tensor scalars picks one tensor's value, which optjit does not record: "
            "reduce it with .sum(), .max() or a norm"
        )

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _norm(x, order):
    """The norm of order 2 or inf of a stack (over the lists) or of one scalar (its absolute value)."""
    if order == "fro":
        order = 2
    if order not in (2, 2.0, float("inf")):
        raise Error(f"a norm of order {order!r}: optjit records the 2-norm and the inf-norm")
    p = x.program
    if isinstance(x, _SymScalar):
        return _SymScalar(p, p.emit("abs", x.id), entry=x.entry)
    if order == float("inf"):
        return _SymScalar(p, p.emit("list_max", p.emit("abs", x.id)))
    # The 2-norm of per-tensor 2-norms is the square root of every tensor's sum of squares, summed: taken from those
    # sums, it is combined in the pass that computes them (two kernels with the update, not three).
    squares = x.squares if x.squares is not None else p.emit("mul", x.id, x.id)
    return _SymScalar(p, p.emit("sqrt", p.emit("list_sum", squares)))


def _scalar_op(name, args, kwargs):
    """The calls on per-tensor scalars and their stacks that a step function may make beside the foreach ops: what
    clip_grad_norm_'s foreach form needs (stack, a norm, sum, max, clamp)."""
    x = args[0] if args else None
    if name == "stack":
        scalars = list(x) if isinstance(x, (list, tuple)) else []
        ids = {s.id for s in scalars if isinstance(s, _SymScalar)}
        if not scalars or len(ids) != 1 or not all(isinstance(s, _SymScalar) for s in scalars):
            raise Error("torch.stack: optjit stacks one per-tensor scalar of each tensor (such as _foreach_norm's)")
        _check_whole(scalars[0].program, scalars, "torch.stack")
        _check_in_order(scalars, "torch.stack")
        return _SymStack(scalars[0].program, ids.pop(), scalars[0].squares)
    if not isinstance(x, (_SymScalar, _SymStack)):
        raise Error(f"torch.{name}: optjit records it on per-tensor scalars and their stacks only")
    extra = {k: v for k, v in kwargs.items() if v is not None and k not in ("ord", "p", "min", "max", "keepdim")}
    if len(args) > 2 or extra or kwargs.get("keepdim"):
        raise Error(f"torch.{name}: arguments optjit does not record ({', '.join(extra) or 'dim'})")
    p = x.program
    if name in ("linalg_vector_norm", "norm"):
        return _norm(x, kwargs.get("ord", kwargs.get("p", args[1] if len(args) > 1 else 2)))
    if name in ("sum", "max", "amax") and len(args) == 1:
        return x if isinstance(x, _SymScalar) else (x.sum() if name == "sum" else x.max())
    if name in ("clamp", "clamp_min", "clamp_max") and isinstance(x, _SymScalar):
        low = kwargs.get("min", args[1] if len(args) > 1 and name != "clamp_max" else None)
        high = kwargs.get("max", args[1] if len(args) > 1 and name == "clamp_max" else None)
        value = x.id
        if low is not None:
            value = p.emit("maximum", value, _operand(p, low))
        if high is not None:
            value = p.emit("minimum", value, _operand(p, high))
        return _SymScalar(p, value, entry=_entry_of(x, low, high))
    raise Error(f"torch.{name} is outside optjit's step-function vocabulary")


class _AttributeOutsideVocabulary(Error, AttributeError):
    """An optjit.Error that is also an AttributeError, so that hasattr() on a symbolic value stays False."""


def _refuse_attribute(what, name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise _AttributeOutsideVocabulary(
        f".{name} of {what} is outside optjit's step-function vocabulary: write the step with torch._foreach_* ops "
        "on whole lists"
    )


def _refuse_operator(symbol):
    def refuse(self, *args):
        raise Error(
            f"the operator {symbol} on an element of a list is outside optjit's step-function vocabulary: write the "
            "step with torch._foreach_* ops on whole lists"
        )

    return refuse


class _SymTensor:
    """One element of a symbolic list; every element of a list holds the list's current value (in-place foreach
    ops repoint them all). Tensor methods and operators are not recorded: they are errors naming themselves."""

    def __init__(self, program, vid, entry):
        self.program, self.id, self.entry = program, vid, entry

    def __getattr__(self, name):
        _refuse_attribute("an element of a tensor list", name)

    __lt__ = __le__ = __gt__ = __ge__ = _refuse_operator("a comparison")
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _refuse_operator("// or %")
    __abs__ = _refuse_operator("abs()")

    __add__ = __radd__ = __iadd__ = _refuse_operator("+")
    __sub__ = __rsub__ = __isub__ = _refuse_operator("-")
    __mul__ = __rmul__ = __imul__ = _refuse_operator("*")
    __truediv__ = __rtruediv__ = __itruediv__ = _refuse_operator("/")
    __pow__ = __rpow__ = _refuse_operator("**")
    __matmul__ = __rmatmul__ = _refuse_operator("@")
    __neg__ = _refuse_operator("unary -")
    __getitem__ = __setitem__ = _refuse_operator("[]")
    __bool__ = __float__ = _refuse_operator("bool() or float()")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _list_id(program, value, what):
    """The recorded value of a list argument (all its elements share it, each at its own position), of a scalar
    list, or of a scalar that is the same for every tensor."""
    if isinstance(value, (list, tuple)):
        _check_whole(program, value, what)
        ids = {_operand(program, v) if not isinstance(v, (int, float)) else None for v in value}
        if len(ids) != 1 or None in ids:
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) and len(set(value)) == 1:
                return program.emit("constant", number=value[0])
            raise Error(f"{what}: optjit records whole lists, and this list mixes values")
        _check_in_order(value, what)
        return ids.pop()
    if isinstance(value, (_SymScalar, _SymTensor)) and value.entry is not None:
        raise Error(
            f"{what}: one tensor's value (element {value.entry} of a list, or arithmetic on it) is used for every "
            "tensor: optjit records each tensor's step from its own values; pass the whole list, or reduce it over "
            "the lists with torch.stack(...).sum(), .max() or a norm"
        )
    return _operand(program, value)


def _check_in_order(value, what):
    """Element k of a list argument must be the list's element k (not a reordered or repeated one)."""
    entries = [v.entry for v in value if isinstance(v, (_SymScalar, _SymTensor))]
    if entries and entries != list(range(len(value))) and any(e is not None for e in entries):
        raise Error(
            f"{what}: optjit records whole lists in their own order, and this one is reordered or repeats a tensor "
            f"(its elements are tensors {entries} of their list)"
        )


def _check_whole(program, value, what):
    if len(value) != program.length:
        raise Error(
            f"{what}: optjit records whole lists, and this one has {len(value)} of the {program.length} tensors (a "
            "slice, or tensors picked out of a list)"
        )


def _result(program, vid, like):
    """The symbolic list an op on `like` gives: per-tensor scalars stay scalars (a step count plus one)."""
    if isinstance(like[0], _SymScalar):
        return [_SymScalar(program, vid, entry=k) for k in range(len(like))]
    return [_SymTensor(program, vid, k) for k in range(len(like))]


def _assign(target, vid):
    for element in target:
        element.id = vid
        if isinstance(element, _SymScalar):
            element.squares = None  # no longer the 2-norm whose sum of squares it kept


# torch._foreach_* ops by name (without the trailing _ of the in-place form): each records its value from the
# recorded value of the first list and the call's other arguments, in torch's order of evaluation (add_scaled,
# addcmul, addcdiv and lerp are the C++ vocabulary's foreach_add, foreach_addcmul, foreach_addcdiv, foreach_lerp).
def _binary_op(op):
    def record(p, self, other, alpha=None):
        if alpha is None:
            return p.emit(op, self, _list_id(p, other, op))
        if op not in ("add", "sub"):
            raise TypeError(f"{op} takes no alpha")
        scale = _list_id(p, alpha, f"{op} alpha")
        return p.emit("add_scaled", self, _list_id(p, other, op), scale if op == "add" else p.emit("neg", scale))

    return record


def _pow(p, self, exponent):
    """torch's pow with a number exponent: 0.5, -0.5 and -1 are sqrt, rsqrt and reciprocal, and 2, 3 and -2 are
    products (so sqrt(-0.0) is -0.0 and sqrt(-inf) NaN, as torch gives, where pow would give 0 and inf)."""
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        one = p.emit("constant", number=1.0)
        if exponent == 0.5:
            return p.emit("sqrt", self)
        if exponent == -0.5:
            return p.emit("div", one, p.emit("sqrt", self))
        if exponent == -1:
            return p.emit("div", one, self)
        if exponent == 2:
            return p.emit("mul", self, self)
        if exponent == 3:
            return p.emit("mul", p.emit("mul", self, self), self)
        if exponent == -2:
            return p.emit("div", one, p.emit("mul", self, self))
    return p.emit("pow", self, _list_id(p, exponent, "pow"))


def _lerp(p, self, end, weight):
    return p.emit("lerp", self, _list_id(p, end, "lerp"), _list_id(p, weight, "lerp weight"))


def _addc(op):
    def record(p, self, t1, t2, value=1):
        return p.emit(op, self, _list_id(p, t1, op), _list_id(p, t2, op), _list_id(p, value, op))

    return record


def _unary(op):
    return lambda p, self: p.emit(op, self)


def _reciprocal(p, self):
    return p.emit("div", p.emit("constant", number=1.0), self)


def _clamp(op):
    return lambda p, self, scalar: p.emit(op, self, _list_id(p, scalar, op))


_OPS = {
    "add": _binary_op("add"),
    "sub": _binary_op("sub"),
    "mul": _binary_op("mul"),
    "div": _binary_op("div"),
    "maximum": _binary_op("maximum"),
    "minimum": _binary_op("minimum"),
    "pow": _pow,
    "clamp_min": _clamp("maximum"),
    "clamp_max": _clamp("minimum"),
    "lerp": _lerp,
    "addcmul": _addc("addcmul"),
    "addcdiv": _addc("addcdiv"),
    "sqrt": _unary("sqrt"),
    "neg": _unary("neg"),
    "abs": _unary("abs"),
    "sign": _unary("sign"),
    "exp": _unary("exp"),
    "log": _unary("log"),
    "reciprocal": _reciprocal,
}


def _dispatch(func, args, kwargs):
    name = getattr(func, "__name__", str(func))
    if not name.startswith("_foreach_"):
        if any(isinstance(a, (_SymScalar, _SymStack)) for a in args) or (
            name == "stack" and args and isinstance(args[0], (list, tuple))
        ):
            return _scalar_op(name, args, kwargs)
        raise Error(f"{name} is outside optjit's step-function vocabulary (torch._foreach_* ops on whole lists)")
    op = name[len("_foreach_") :]
    inplace = op.endswith("_")
    op = op.rstrip("_")
    self_list = args[0]
    # A list of tensors, or of per-tensor scalars (scalar state such as a step count, or _foreach_norm's results).
    if not (isinstance(self_list, (list, tuple)) and self_list and isinstance(self_list[0], (_SymTensor, _SymScalar))):
        raise Error(f"torch.{name}: its first argument must be one of the step function's lists")
    program = self_list[0].program
    _check_whole(program, self_list, f"torch.{name}")
    self_id = _list_id(program, self_list, name)
    if op == "copy":
        vid = _list_id(program, args[1], name)
    elif op == "norm":
        order = kwargs.get("ord", args[1] if len(args) > 1 else 2)
        if order not in (2, 2.0, float("inf")):
            raise Error(f"torch.{name}(ord={order!r}): optjit records the 2-norm and the inf-norm")
        if isinstance(self_list[0], _SymScalar):  # each tensor's norm of its one value: its absolute value
            vid = program.emit("abs", self_id)
            squares = program.emit("mul", self_id, self_id) if order in (2, 2.0) else None
            return [_SymScalar(program, vid, squares, entry=k) for k in range(len(self_list))]
        if order in (2, 2.0):
            squares = program.emit("sum", program.emit("mul", self_id, self_id))
            vid = program.emit("sqrt", squares)
            return [_SymScalar(program, vid, squares, entry=k) for k in range(len(self_list))]
        vid = program.emit("max", program.emit("abs", self_id))
        return [_SymScalar(program, vid, entry=k) for k in range(len(self_list))]
    elif op in _OPS:
        try:
            vid = _OPS[op](program, self_id, *args[1:], **kwargs)
        except TypeError as e:
            raise Error(f"torch.{name}: arguments optjit does not record: {e}") from None
    else:
        raise Error(f"torch.{name} is outside optjit's step-function vocabulary")
    if inplace:
        _assign(self_list, vid)
        return self_list
    return _result(program, vid, self_list)


class StepFunction:
    """A step function compiled by optjit; call it with torch tensor lists and hyperparameters."""

    def __init__(self, fn, name=None):
        functools.update_wrapper(self, fn)
        self.eager = fn
        self._name = _graph_name(name or getattr(fn, "__name__", None) or type(fn).__name__)
        self._program = None  # (instructions, list names, scalar list names)
        self._cxx = None
        self._key = None

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
    def _scalar_lists(names, lists):
        """The state lists of per-tensor scalars: 0-d tensors beside params that are not all 0-d."""
        if all(t.dim() == 0 for t in lists[0]):
            return frozenset()
        return frozenset(names[k] for k in range(2, len(lists)) if all(t.dim() == 0 for t in lists[k]))

    def _record(self, names, scalar, lists, hypers):
        params0 = lists[0]
        program = _Program(len(params0))
        sym_lists = []
        for name in names:
            vid = program.emit("scalar_state" if name in scalar else "tensors", name=name)
            if name in scalar:
                sym_lists.append([_SymScalar(program, vid, entry=k) for k in range(len(params0))])
            else:
                sym_lists.append([_SymTensor(program, vid, k) for k in range(len(params0))])
        initial = [lst[0].id for lst in sym_lists]
        sym_hypers = {k: _SymScalar(program, program.emit("hyper", name=k)) for k in hypers}
        returned = self.eager(*sym_lists, **sym_hypers)
        if returned is not None:
            raise Error(
                f"step function {self._name} returns a value: a compiled step's results are its lists, updated in "
                "place, and it returns None (call fn.eager for the value, or keep it in a list)"
            )
        stored = False
        for name, lst, first in zip(names, sym_lists, initial):
            if len({element.id for element in lst}) != 1:
                raise Error(f"step function {self._name} updates part of list '{name}': optjit records whole lists")
            if lst[0].id != first:
                program.emit("store_scalar" if name in scalar else "store", lst[0].id, name=name)
                stored = True
        if not stored:
            raise Error(
                f"step function {self._name} changes none of its lists: a step writes its params or state with "
                "in-place foreach ops (torch._foreach_add_, ...)"
            )
        return program.instructions

    def __call__(self, *lists, **hypers):
        lists = [list(lst) for lst in lists]
        if not lists or any(len(lst) != len(lists[0]) for lst in lists):
            raise Error(f"step function {self._name}: give tensor lists of one tensor per param")
        if not lists[0]:
            raise Error(f"step function {self._name}: its lists are empty (torch's foreach ops need a tensor each)")
        for k, v in hypers.items():
            if isinstance(v, torch.Tensor):
                hypers[k] = v.item()
            elif isinstance(v, bool) or not isinstance(v, (int, float)):
                raise Error(f"step function {self._name}: hyperparameter {k} is {v!r}, not a number")
        def tensors(group):
            # Everything a view of the tensor depends on: a grad is not held between calls, so a new one at a freed
            # one's address is the same view only if its layout is the same too.
            return tuple(
                (id(t), t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device) for lst in group for t in lst
            )

        held = tensors(lists[:1] + lists[2:])
        if self._key is not None and held == self._key[1] and len(lists) == len(self._key[0][0]):
            names, scalar = self._key[0][0], self._key[0][1]  # the same tensors: the same slots and scalar lists
        else:
            names = self._list_names(len(lists))
            scalar = self._scalar_lists(names, lists)
        # What the recorded program depends on (the lists, their scalar ones and the hyperparameters' names), then
        # the tensors; the grads apart: new grad tensors every call (after each backward) only repoint the compiled
        # step's grads. Nothing is kept from a call that failed before its step ran.
        # (The lists' length too: Python code in the function may read it, len(params), and the recording keeps it.)
        key = ((tuple(names), scalar, tuple(sorted(hypers)), len(lists[0])), held, tensors(lists[1:2]))
        if self._cxx is None or key[:2] != self._key[:2]:
            program = self._program
            if program is None or key[0] != self._key[0]:
                instructions = self._record(names, scalar, lists, hypers)
                program = (instructions, names, sorted(scalar))
            instructions, names, scalar_names = program
            _check_sharded_reductions(self._name, instructions, lists)
            self._cxx = None
            self._streams = _cuda_streams([t for lst in lists for t in lst])
            with self._streams.lend():
                self._cxx = TorchStepFunction(
                    self._name,
                    instructions,
                    list(zip(names, lists)),
                    scalar_names,
                    {k: float(v) for k, v in hypers.items()},
                )
            self._program = program
            stored = {i.name for i in instructions if i.op.startswith("store")}
            self._written = [k for k, name in enumerate(names) if name in stored]
        elif key[2] != self._key[2]:
            self._cxx.set_grads(lists[1])
        self._key = key
        with self._streams.lend():
            self._cxx({k: float(v) for k, v in hypers.items()})
        # The lists it wrote changed in place, as torch's foreach ops would have counted (autograd's version).
        _increment_versions([t for k in self._written for t in lists[k]])

    @property
    def kernel_count(self):
        """Kernels the last call's step launches."""
        return None if self._cxx is None else self._cxx.kernel_count()

    def dump(self, stage="fused"):
        """The last call's step at one stage: "traced", "optimized", "fused", "llvm" or "ptx"."""
        if self._cxx is None:
            raise Error(f"step function {self._name} has not been called yet: nothing is compiled")
        return self._cxx.dump(stage)


def _graph_name(name):
    """A step function's name as the identifier its graph is named by ("<lambda>" becomes "lambda")."""
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name)).strip("_") or "step"
    return text if not text[0].isdigit() else f"step_{text}"


def _check_sharded_reductions(name, instructions, lists):
    """Norms and other reductions of DTensor shards (FSDP2) would reduce each process's local shard alone: refused."""
    reduces = any(i.op in ("sum", "max", "list_sum", "list_max") for i in instructions)
    if reduces and _sharded([t for lst in lists for t in lst]):
        raise Error(
            f"step function {name} reduces (a norm, a sum or a max) over DTensor shards (FSDP2): optjit would reduce "
            "each process's local shard alone, not the whole tensor; step it with torch, or unshard the tensors"
        )


def step_function(fn=None, *, name=None):
    """Decorates a step written with torch's foreach calls so that calling it runs optjit's compiled step."""
    if fn is None:
        return lambda f: StepFunction(f, name)
    return StepFunction(fn, name)
