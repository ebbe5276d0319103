"""Recording a step function: symbolic lists, elements and scalars that take torch's calls and record them, op by op,
into a C++ StepRecording (frontend/trace/step_recording.h), which optjit._step_function compiles.

This module is the torch side of the recording only: which torch call, tensor method or operator is which op of the
recording, with torch's argument conventions (alpha=, value=, keepdim=, in-place forms), and Python's rules for the
values a function holds (a branch on a value, float() of it, lists reordered or sliced, values of two tensors of a
list combined). The ops themselves, their lowerings (pow(x, 0.5) is a sqrt, a >= b is a > b or a == b, a 2-norm is
sqrt(sum(x * x))), what each value holds per tensor (one number per element, row, column, matrix or tensor) and the
messages for values that do not fit are the recording's, shared with the C++ front end.

A list argument is a Python list of symbolic elements (_SymTensor, or _SymScalar for per-tensor scalar state) that all
hold the list's current recorded value, each at its own position (`entry`). Two ways of writing a step record alike:

- torch._foreach_* calls on whole lists (torch's _multi_tensor_* optimizers);
- torch calls, tensor methods and Python operators on elements, one tensor at a time: a loop over zip(params,
  grads), or torch._higher_order_ops.foreach_map(fn, ...), which calls fn on each entry's elements. The op on entry
  k records the same value as on every other entry (the recording records a value once: the same op on the same
  operands is the same value), so when every entry has been through it, the list holds one value; in-place methods
  repoint the element they are called on, as they write the tensor in torch.

Values of two different entries never combine: a compiled step computes each tensor from its own values (_entry_of).
The function sees symbolic values, not torch tensors: a branch on isinstance(x, torch.Tensor), like one on a shape,
takes the path of what it sees.
"""

import functools
import operator

import torch

from ._optjit import Error, Holds


class _Recorded:
    """A symbolic value: its recorded value in `program` (a StepRecording), readable only while that recording is
    open. A value kept from an earlier recording (in a global, say) would name an unrelated value of the current one,
    and is refused by name (StepRecording.check_open)."""

    @property
    def id(self):
        if self.program.closed:
            self.program.check_open()
        return self._id

    @id.setter
    def id(self, vid):
        self._id = vid


def _operand(program, x, what=None):
    """The recorded value of an operand: a symbolic element or scalar, or a Python number (a constant)."""
    if isinstance(x, (_SymTensor, _SymScalar)):
        return x.id
    if isinstance(x, _SymStack):
        raise Error(
            f"{what + ': ' if what else ''}a torch.stack of per-tensor scalars is used where torch takes one value: "
            "reduce it (.sum(), .max(), a norm), or pass it where a foreach op takes one scalar per tensor"
        )
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise Error(
            f"{what + ': ' if what else ''}a step function's operand is {x!r}: optjit records tensor lists, "
            "hyperparameters and numbers"
        )
    return program.constant(x)


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


def _is_tensor(x):
    """Whether a symbolic value stands for a torch tensor in the eager run (an element, a 0-d state tensor, an op on
    one), rather than for a Python number (a hyperparameter and arithmetic on hyperparameters)."""
    return isinstance(x, _SymTensor) or (isinstance(x, _SymScalar) and x.tensor)


def _value(program, vid, operands, boolean=False):
    """The symbolic value an op on `operands` gives: an element when one of them is, a scalar otherwise; of their
    entry, and a tensor in the eager run when one of them is. `boolean`: a comparison's 0/1 (torch's bool)."""
    entry = _entry_of(*operands)
    if any(isinstance(x, _SymTensor) for x in operands):
        return _SymTensor(program, vid, entry, boolean)
    return _SymScalar(program, vid, entry, tensor=any(_is_tensor(x) for x in operands), boolean=boolean)


class _Elementwise(_Recorded):
    """Python's operators and torch's tensor methods on a symbolic element or per-tensor scalar, recorded with the
    same op table as the torch functions (_ELEMENT_OPS). In-place forms (`+=`, `.add_()`) repoint the value itself,
    as they write the tensor in torch; on a hyperparameter (a Python number in the eager run) `+=` rebinds."""

    def _op(self, name, *args, **kwargs):
        return _element_op(name, (self, *args), kwargs)

    def _reversed(self, name, other):
        return _element_op(name, (other, self), {})

    def _in_place(self, name, *args, **kwargs):
        result = _element_op(name, (self, *args), kwargs)
        if not _is_tensor(self):
            return result
        _set(self, result)
        return self

    def __getattr__(self, name):
        method = None if name.startswith("__") else self._method(name)
        if method is None:
            _refuse_attribute(self._WHAT, name)
        return method

    def __add__(self, o):
        return self._op("add", o)

    def __radd__(self, o):
        return self._reversed("add", o)

    def __sub__(self, o):
        return self._op("sub", o)

    def __rsub__(self, o):
        return self._reversed("sub", o)

    def __mul__(self, o):
        return self._op("mul", o)

    def __rmul__(self, o):
        return self._reversed("mul", o)

    def __truediv__(self, o):
        return self._op("div", o)

    def __rtruediv__(self, o):
        return self._reversed("div", o)

    def __pow__(self, o):
        return self._op("pow", o)

    def __rpow__(self, o):
        return self._reversed("pow", o)

    def __iadd__(self, o):
        return self._in_place("add", o)

    def __isub__(self, o):
        return self._in_place("sub", o)

    def __imul__(self, o):
        return self._in_place("mul", o)

    def __itruediv__(self, o):
        return self._in_place("div", o)

    def __ipow__(self, o):
        return self._in_place("pow", o)

    def __neg__(self):
        return self._op("neg")

    def __abs__(self):
        return self._op("abs")

    def __gt__(self, o):
        return self._op("gt", o)

    def __lt__(self, o):
        return self._op("lt", o)

    def __ge__(self, o):
        return self._op("ge", o)

    def __le__(self, o):
        return self._op("le", o)

    # == and != are values too: Python's own would compare identities and silently fix a branch.
    def __eq__(self, o):
        return self._op("eq", o)

    def __ne__(self, o):
        return self._op("ne", o)

    __hash__ = object.__hash__

    def _method(self, name):
        """A tensor method: `x.mul(y)` is torch.mul(x, y), `x.mul_(y)` writes x, `x.norm()` reduces x. Only tensors
        have them; None for a name outside the vocabulary."""
        if not _is_tensor(self):
            return None
        if name in _REDUCTIONS:
            return lambda *args, **kwargs: _scalar_op(name, (self, *args), kwargs)
        if name in _DTYPE_METHODS:
            return functools.partial(_DTYPE_METHODS[name], self)
        if isinstance(self, _SymTensor) and name in _MATRIX_METHODS:
            return functools.partial(_MATRIX_METHODS[name], self)
        if isinstance(self, _SymTensor) and name in ("size", "numel", "shape"):
            if name == "shape":
                return _SymShape(self)
            if name == "size":  # size() is the shape, size(dim) one size
                return lambda dim=None: _SymShape(self) if dim is None else _size(self.program, self, dim)
            return lambda: _size(self.program, self, None)
        in_place = name.endswith("_")
        base = name[:-1] if in_place else name
        if name == "where":  # x.where(condition, y) is torch.where(condition, x, y)
            return lambda condition, other: _element_op("where", (condition, self, other), {})
        if in_place:
            return functools.partial(self._in_place, base) if base in _IN_PLACE_METHODS else None
        if base not in _ELEMENT_OPS or base in _IN_PLACE_ONLY:
            return None
        return functools.partial(self._op, base)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _set(target, source):
    """`target` now holds `source`'s value (an in-place op's result), and belongs to its entry too. A tensor stays
    what it was (copy_ of a comparison writes 0 and 1 to a float tensor)."""
    entry = _entry_of(target, source)
    if isinstance(target, _SymTensor):
        target.id = target.program.written(source.id, target.id, target.holds)
    elif isinstance(source, _SymTensor):
        raise Error(
            "a step function writes a tensor's elements into a 0-d tensor (a per-tensor scalar) in place: its shape "
            "does not fit, as torch's in-place ops refuse"
        )
    else:
        target.id = source.id
    target.entry = entry


class _SymScalar(_Elementwise):
    """A hyperparameter, a constant, a per-tensor scalar (an element of a list of 0-d state tensors, a tensor's norm)
    or arithmetic on them: one value per list entry. `entry` is the list position it belongs to (_entry_of);
    `tensor`, whether it is a torch tensor in the eager run (_is_tensor)."""

    _WHAT = "a per-tensor scalar or hyperparameter"

    def __init__(self, program, vid, entry=None, tensor=False, boolean=False):
        self.program, self.id, self.entry, self.tensor, self.boolean = program, vid, entry, tensor, boolean

    def __bool__(self):
        raise Error(
            f"a step function branches on {self.program.describe(self.id)} (if, and, or, min(), max()): optjit "
            "records one program for every value; pass a value to branch on as a static argument (a bool, None or a "
            "string), or write the choice with torch.where"
        )

    def __float__(self):
        raise Error(
            "a step function turns a hyperparameter or per-tensor scalar into a Python number (float(), int(), "
            "math.*): optjit records one program for every value; write it with Python operators (** 0.5 for a "
            "square root) or torch calls"
        )

    __int__ = __index__ = __complex__ = __float__


_SCALAR_OPERATORS = (("floordiv", "//"), ("mod", "%"), ("divmod", "divmod()"), ("and", "&"), ("or", "|"), ("xor", "^"))
for _name, _symbol in _SCALAR_OPERATORS:
    setattr(_SymScalar, f"__{_name}__", lambda self, *a, _s=_symbol: _refuse_scalar_operator(_s))
    setattr(_SymScalar, f"__r{_name}__", lambda self, *a, _s=_symbol: _refuse_scalar_operator(_s))
for _name in ("round", "trunc", "floor", "ceil", "invert"):
    setattr(_SymScalar, f"__{_name}__", lambda self, *a, _s=_name: _refuse_scalar_operator(f"{_s}()"))


def _refuse_scalar_operator(symbol):
    raise Error(
        f"{symbol} on a hyperparameter or per-tensor scalar is outside optjit's step-function vocabulary (+, -, *, "
        "/, **, comparisons, abs)"
    )


class _SymTensor(_Elementwise):
    """One element of a symbolic list (or a value computed from elements of entry `entry`); every element of a list
    holds the list's current value (in-place foreach ops repoint them all, in-place methods the one they are called
    on). Tensor methods outside the vocabulary, and those that read the tensor's shape or layout, are errors naming
    themselves: the program is recorded once for every shape."""

    _WHAT = "an element of a tensor list"

    def __init__(self, program, vid, entry, boolean=False):
        self.program, self.id, self.entry, self.boolean = program, vid, entry, boolean
        # What the tensor holds by its shape (Holds): its list's, or its value's when an op made it.
        self.holds = program.holds(vid)

    def __matmul__(self, other):
        return _matmul(self, other)

    @property
    def T(self):
        """The transpose of a 2-D element: an operand of matrix products (torch.mm, @, torch.addmm), read
        transposed."""
        return _transpose(self)

    mT = T



def _refuse_operator(symbol):
    def refuse(self, *args):
        raise Error(
            f"the operator {symbol} on an element of a list is outside optjit's step-function vocabulary: write the "
            "step with torch ops on elements (+, -, *, /, **, comparisons) or torch._foreach_* ops on whole lists"
        )

    return refuse


for _names, _symbol in (
    (("__floordiv__", "__rfloordiv__", "__mod__", "__rmod__"), "// or %"),
    (("__rmatmul__",), "@"),
    (("__getitem__", "__setitem__"), "[]"),
    (("__bool__", "__float__", "__int__", "__index__", "__len__"), "bool(), float(), int() or len()"),
    (("__invert__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__"), "~, &, | or ^"),
):
    for _name in _names:
        setattr(_SymTensor, _name, _refuse_operator(_symbol))


class _SymStack(_Recorded):
    """torch.stack of a list of per-tensor scalars (such as _foreach_norm's): reducing it (sum, max, a norm) combines
    the value over every tensor of the lists, which gives one value, the same for every tensor (a _SymScalar)."""

    def __init__(self, program, vid):
        self.program, self.id = program, vid

    def _over_lists(self, name):
        return _SymScalar(self.program, self.program.reduce_stack(self.id, name), tensor=True)

    def sum(self):
        return self._over_lists("sum")

    def max(self):
        return self._over_lists("max")

    amax = max

    def mean(self):
        return self._over_lists("mean")

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


def _norm_order(order, what):
    """A norm's order as the recording takes it (a number; "fro" is 2); the recording refuses orders but 2 and inf."""
    if order == "fro":
        return 2.0
    if isinstance(order, bool) or not isinstance(order, (int, float)):
        raise Error(f"{what} of order {order!r}: optjit records the 2-norm and the inf-norm")
    return float(order)


def _norm(x, order):
    """The norm of order 2 or inf of a stack (over the lists) or of one scalar (its absolute value)."""
    order = _norm_order(order, "a norm")
    p = x.program
    if isinstance(x, _SymScalar):
        return _SymScalar(p, p.norm_of_scalar(x.id, order), entry=x.entry, tensor=True)
    return _SymScalar(p, p.reduce_stack(x.id, "norm", order), tensor=True)


# The positional parameters of the reductions, after the tensor (torch's order).
_REDUCTION_PARAMETERS = {
    "sum": ("dim", "keepdim"),
    "mean": ("dim", "keepdim"),
    "max": (),
    "amax": ("dim", "keepdim"),
    "norm": ("p", "dim", "keepdim"),
    "linalg_vector_norm": ("ord", "dim", "keepdim"),
}


def _tensor_reduction(p, x, name, args, kwargs):
    """A reduction of one element (x.sum(), x.max(), x.norm(), torch.linalg.vector_norm(x), x.mean()): over its
    whole tensor, a per-tensor scalar of x's entry; along dim -1 or -2 with keepdim=True, Adafactor's row and column
    sums, means and norms, an element value of one per row or column."""
    parameters = _REDUCTION_PARAMETERS[name]
    if len(args) > len(parameters):
        raise Error(f"{name} of an element with arguments optjit does not record: {args!r}")
    given = dict(zip(parameters, args), **kwargs)
    extra = {k for k, v in given.items() if k not in ("ord", "p", "dim", "keepdim") and v is not None}
    if extra:
        raise Error(f"{name} of an element with arguments optjit does not record ({', '.join(sorted(extra))})")
    order = _norm_order(given.get("ord", given.get("p", 2)), name) if name in ("norm", "linalg_vector_norm") else None
    dim = given.get("dim")
    if dim is None:
        return _SymScalar(p, p.reduce(x.id, name, order, None, "", False), entry=x.entry, tensor=True)
    axis = _axis(dim[0] if isinstance(dim, (tuple, list)) and len(dim) == 1 else dim)
    return _SymTensor(p, p.reduce(x.id, name, order, axis, repr(dim), bool(given.get("keepdim"))), x.entry)


def _axis(dim):
    """`dim` as the recording takes a dimension: -1 or -2, or None for any other (which it refuses, naming `dim`)."""
    try:
        axis = operator.index(dim)
    except TypeError:
        return None
    return axis if axis in (-1, -2) else None


def _size(p, x, dim):
    """x.size(dim) for dim -1 or -2, and x.numel() for dim None: a number per tensor (1 along a dimension x holds
    one value of, such as a row's sum along dim -1)."""
    if dim is None:
        return _SymScalar(p, p.size(x.id, None, ""), entry=x.entry)
    return _SymScalar(p, p.size(x.id, _axis(dim) or 0, repr(dim)), entry=x.entry)


def _matmul(a, b):
    """a @ b, torch.mm, torch.matmul: the matrix product of two elements of a 2-D param's entry (x @ x.T), run in the
    matrix library, or the outer product [..., m, 1] @ [..., 1, n] Adafactor takes of its row and column state."""
    program = next(x.program for x in (a, b) if isinstance(x, _Recorded))
    vid = program.matmul(*(x.id if isinstance(x, _SymTensor) else None for x in (a, b)))
    return _value(program, vid, [a, b])


def _addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """torch.addmm(input, mat1, mat2, beta=, alpha=): beta input + alpha (mat1 @ mat2), one library call."""
    if not all(isinstance(x, _SymTensor) for x in (input, mat1, mat2)):
        raise Error("torch.addmm: optjit records it on elements of the step function's lists (and products of them)")
    program = input.program
    scales = [_element_id(program, v, f"addmm {k}") for k, v in (("beta", beta), ("alpha", alpha))]
    vid = program.addmm(input.id, mat1.id, mat2.id, *scales)
    return _value(program, vid, [input, mat1, mat2, *(v for v in (beta, alpha) if isinstance(v, _Recorded))])


def _transpose(x, *dims):
    """x.T, x.mT, x.t(), x.transpose(-2, -1) of an element: a matrix product's operand, read transposed."""
    if dims and set(dims) not in ({-2, -1}, {0, 1}):
        raise Error(f"x.transpose{tuple(dims)!r}: optjit records the transpose of a matrix's two dimensions only")
    return _SymTensor(x.program, x.program.transpose(x.id), x.entry)


def _to_dtype(x, dtype=None, *args, **kwargs):
    """x.to(torch.bfloat16) and x.to(torch.float32): x rounded to bf16 (ops on it then compute as torch's bf16
    tensors do), or x in its list's dtype again (exactly torch's for lists of f32 tensors)."""
    dtype = kwargs.pop("dtype", dtype)
    kwargs.pop("copy", None)  # a recorded value is a value: a copy is the same
    kwargs.pop("non_blocking", None)
    if args or kwargs or dtype not in (torch.bfloat16, torch.float32):
        raise Error(
            f"x.to({dtype!r}{', ...' if args or kwargs else ''}): optjit records x.to(torch.bfloat16) and "
            "x.to(torch.float32) (x.bfloat16(), x.float()) on list elements"
        )
    program = x.program
    vid = program.to_bf16(x.id) if dtype == torch.bfloat16 else program.to_list_dtype(x.id)
    if isinstance(x, _SymTensor):
        return _SymTensor(program, vid, x.entry)
    return _SymScalar(program, vid, x.entry, tensor=True)


# Tensor methods of matrices (2-D elements) and dtypes.
_MATRIX_METHODS = {
    "matmul": _matmul,
    "mm": _matmul,
    "addmm": _addmm,
    "t": _transpose,
    "transpose": _transpose,
}
_DTYPE_METHODS = {
    "to": _to_dtype,
    "bfloat16": lambda x: _to_dtype(x, torch.bfloat16),
    "float": lambda x: _to_dtype(x, torch.float32),
}


class _SymShape:
    """x.shape: shape[-1] and shape[-2] are sizes; anything that depends on the rank is refused."""

    def __init__(self, x):
        self._x = x

    def __getitem__(self, dim):
        return _size(self._x.program, self._x, dim)

    def __len__(self):
        raise Error("len(x.shape), the rank of an element: optjit records one step for every rank")

    def __eq__(self, other):
        raise Error(
            "comparing the shapes of list elements: optjit records one step for every shape (compare sizes, "
            "x.size(-1), in the step's arithmetic instead)"
        )

    __ne__ = __eq__
    __hash__ = None

    def __iter__(self):
        raise Error("unpacking x.shape, the rank of an element: optjit records one step for every rank")


def _scalar_op(name, args, kwargs):
    """The calls on stacks of per-tensor scalars, and the reductions and clamps of scalars, that clip_grad_norm_'s
    foreach form makes (stack, a norm, sum, max, clamp); None for another call, which the element table records."""
    x = args[0] if args else None
    if name == "stack":
        scalars = list(x) if isinstance(x, (list, tuple)) else []
        ids = {s.id for s in scalars if isinstance(s, _SymScalar)}
        if not scalars or len(ids) != 1 or not all(isinstance(s, _SymScalar) for s in scalars):
            raise Error("torch.stack: optjit stacks one per-tensor scalar of each tensor (such as _foreach_norm's)")
        _check_whole(scalars[0].program, scalars, "torch.stack")
        _check_in_order(scalars, "torch.stack")
        return _SymStack(scalars[0].program, ids.pop())
    if name not in _REDUCTIONS:
        return None
    if isinstance(x, _SymTensor):
        return _tensor_reduction(x.program, x, name, args[1:], kwargs)
    if not isinstance(x, (_SymScalar, _SymStack)):
        raise Error(f"torch.{name}: optjit records it on list elements, per-tensor scalars and their stacks only")
    extra = {k: v for k, v in kwargs.items() if v is not None and k not in ("ord", "p", "keepdim")}
    if len(args) > 2 or extra or kwargs.get("keepdim"):
        raise Error(f"torch.{name}: arguments optjit does not record ({', '.join(extra) or 'dim'})")
    if name in ("linalg_vector_norm", "norm"):
        return _norm(x, kwargs.get("ord", kwargs.get("p", args[1] if len(args) > 1 else 2)))
    if len(args) == 1:  # of a scalar, its own value (a new tensor in torch: writing it leaves x alone)
        if isinstance(x, _SymScalar):
            return _SymScalar(x.program, x.id, x.entry, tensor=True, boolean=x.boolean)
        return x.mean() if name == "mean" else x.sum() if name == "sum" else x.max()
    raise Error(f"torch.{name} with a dim: optjit reduces whole tensors and stacks")


class _AttributeOutsideVocabulary(Error, AttributeError):
    """An optjit.Error that is also an AttributeError, so that hasattr() on a symbolic value stays False."""


def _refuse_attribute(what, name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise _AttributeOutsideVocabulary(
        f".{name} of {what} is outside optjit's step-function vocabulary: write the step with torch ops on elements "
        "or torch._foreach_* ops on whole lists (a step is recorded once for every shape and dtype)"
    )


def _list_id(program, value, what):
    """The recorded value of a list argument (all its elements share it, each at its own position), of a scalar
    list, or of a scalar that is the same for every tensor."""
    if isinstance(value, (list, tuple)):
        _check_whole(program, value, what)
        ids = {_operand(program, v, what) if not isinstance(v, (int, float)) else None for v in value}
        if len(ids) != 1 or None in ids:
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) and len(set(value)) == 1:
                return program.constant(value[0])
            raise Error(
                f"{what}: optjit records one program for every tensor of the lists, and this list holds a different "
                "value for some of them (numbers, or arithmetic on different values): pass per-tensor numbers as a "
                "list of 0-d tensors, one per param, beside the state lists"
            )
        _check_in_order(value, what)
        return ids.pop()
    if isinstance(value, _SymStack):
        if what in ("addcmul scalars", "addcdiv scalars"):  # one per tensor, as torch's foreach addcmul, addcdiv take
            return value.id
        raise Error(
            f"{what} with a torch.stack of per-tensor scalars: torch takes one as the scalars of _foreach_addcmul and "
            "_foreach_addcdiv only; pass the list of scalars"
        )
    if isinstance(value, (_SymScalar, _SymTensor)) and value.entry is not None:
        raise Error(
            f"{what}: one tensor's value (element {value.entry} of a list, or arithmetic on it) is used for every "
            "tensor: optjit records each tensor's step from its own values; pass the whole list, or reduce it over "
            "the lists with torch.stack(...).sum(), .max() or a norm"
        )
    return _operand(program, value, what)


def _element_id(program, value, what):
    """The recorded value of an operand of an op on elements: an element, a scalar or a number (never a list)."""
    if isinstance(value, (list, tuple)):
        raise Error(f"{what} on an element takes elements, scalars and numbers, not a list")
    return _operand(program, value, what)


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
        return [_SymScalar(program, vid, entry=k, tensor=True) for k in range(len(like))]
    return [_SymTensor(program, vid, k) for k in range(len(like))]


def _assign(target, vid):
    """The elements of list `target` hold `vid` (an in-place foreach op's result); a tensor list's, every element."""
    if isinstance(target[0], _SymTensor):
        vid = target[0].program.written(vid, target[0].id, target[0].holds)
    elif target[0].program.holds(vid) != Holds.tensor:
        raise Error(
            "a step function writes tensors' elements into a list of 0-d tensors (per-tensor scalars) in place: their "
            "shapes do not fit, as torch's in-place ops refuse"
        )
    for element in target:
        element.id = vid


# torch's ops by name (torch.add and Tensor.add, torch._foreach_add; the in-place forms without their trailing _):
# each records its value from the recorded value of `self` and the call's other arguments, which `resolve` turns into
# recorded values (whole lists for foreach ops, elements and scalars for ops on elements), by the recording's op of
# that name (StepRecording.op), with torch's argument conventions.
def _binary_op(op):
    def record(p, resolve, self, other, alpha=None):
        if alpha is None:
            return p.op(op, [self, resolve(other, op)])
        if op not in ("add", "sub"):
            raise TypeError(f"{op} takes no alpha")
        scale = resolve(alpha, f"{op} alpha")
        return p.op(f"{op}_scaled", [self, resolve(other, op), scale])

    return record


def _division(p, resolve, self, other, rounding_mode=None):
    if rounding_mode is not None:
        raise TypeError(f"rounding_mode={rounding_mode!r}")
    return p.op("div", [self, resolve(other, "div")])


def _pow(p, resolve, self, exponent):
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        return p.pow_number(self, exponent)
    return p.op("pow", [self, resolve(exponent, "pow")])


def _lerp(p, resolve, self, end, weight):
    return p.op("lerp", [self, resolve(end, "lerp"), resolve(weight, "lerp weight")])


def _addc(op):
    def record(p, resolve, self, t1, t2, value=1, scalars=None):
        value = value if scalars is None else scalars  # torch's keyword for a list or tensor of scalars
        return p.op(op, [self, resolve(t1, op), resolve(t2, op), resolve(value, f"{op} scalars")])

    return record


def _unary(op):
    return lambda p, resolve, self: p.op(op, [self])


def _binary(op):
    return lambda p, resolve, self, other: p.op(op, [self, resolve(other, op)])


def _clamp_bound(op):
    return lambda p, resolve, self, scalar: p.op(op, [self, resolve(scalar, op)])  # torch's foreach keyword: scalar


def _clamp(p, resolve, self, min=None, max=None):
    if min is None and max is None:
        raise TypeError("clamp needs min or max")
    value = self
    if min is not None:
        value = p.clamp(value, resolve(min, "clamp min"), None)
    if max is not None:
        value = p.clamp(value, None, resolve(max, "clamp max"))
    return value


def _copy(p, resolve, self, source, non_blocking=False):
    return resolve(source, "copy_")


def _fill(p, resolve, self, value):
    if isinstance(value, _SymTensor):
        raise TypeError("fill_ takes a number or a 0-d tensor, not a tensor's elements")
    return resolve(value, "fill_")


def _zero(p, resolve, self):
    return p.constant(0.0)


def _where(p, resolve, condition, if_true, if_false):
    return p.op("where", [condition, resolve(if_true, "where"), resolve(if_false, "where")])


_COMMON_OPS = {
    "add": _binary_op("add"),
    "sub": _binary_op("sub"),
    "mul": _binary_op("mul"),
    "div": _division,
    "maximum": _binary_op("maximum"),
    "minimum": _binary_op("minimum"),
    "pow": _pow,
    "clamp_min": _clamp_bound("maximum"),
    "clamp_max": _clamp_bound("minimum"),
    "lerp": _lerp,
    "addcmul": _addc("addcmul"),
    "addcdiv": _addc("addcdiv"),
    "sqrt": _unary("sqrt"),
    "rsqrt": _unary("rsqrt"),
    "neg": _unary("neg"),
    "abs": _unary("abs"),
    "sign": _unary("sign"),
    "exp": _unary("exp"),
    "log": _unary("log"),
    "reciprocal": _unary("reciprocal"),
    "copy": _copy,
    "zero": _zero,
}
# torch._foreach_* ops (in-place or not); _foreach_norm and _foreach_max are reductions (_foreach_reduction).
_FOREACH_OPS = dict(_COMMON_OPS)
# Ops on elements and scalars: torch functions, tensor methods and operators.
_ELEMENT_OPS = dict(
    _COMMON_OPS,
    subtract=_COMMON_OPS["sub"],
    multiply=_COMMON_OPS["mul"],
    true_divide=_division,
    divide=_division,
    negative=_COMMON_OPS["neg"],
    square=_unary("square"),
    clamp=_clamp,
    clip=_clamp,
    where=_where,
    gt=_binary("gt"),
    greater=_binary("gt"),
    lt=_binary("lt"),
    less=_binary("lt"),
    ge=_binary("ge"),
    greater_equal=_binary("ge"),
    le=_binary("le"),
    less_equal=_binary("le"),
    eq=_binary("eq"),
    ne=_binary("ne"),
    fill=_fill,
)
# Ops that exist only in place (torch has x.copy_(src), x.zero_() and x.fill_(v), no copy(), zero() or fill()).
_IN_PLACE_ONLY = {"copy", "zero", "fill"}
# The in-place tensor methods torch has among the ops (x.add_(), ...; no maximum_ or where_).
_IN_PLACE_METHODS = {
    "add", "sub", "mul", "div", "pow", "clamp", "clamp_min", "clamp_max", "clip", "lerp", "addcmul", "addcdiv", "sqrt",
    "rsqrt", "neg", "abs", "sign", "exp", "log", "reciprocal", "square", "copy", "zero", "fill", "true_divide",
    "divide", "multiply", "subtract", "negative",
}  # fmt: skip
_COMPARISONS = {"gt", "greater", "lt", "less", "ge", "greater_equal", "le", "less_equal", "eq", "ne"}
# Reductions of a whole tensor (an element's, or a 0-d tensor's own value): per-tensor scalars (_scalar_op).
_REDUCTIONS = ("linalg_vector_norm", "norm", "sum", "max", "amax", "mean")


def _element_op(name, args, kwargs):
    """torch's op `name` on elements and scalars (a torch function, a tensor method, an operator): its symbolic
    result, an element of its operands' entry."""
    x = next((a for a in args if isinstance(a, (_SymTensor, _SymScalar))), None)
    record = _ELEMENT_OPS.get(name)
    if record is None or x is None:
        raise Error(f"torch.{name} is outside optjit's step-function vocabulary")
    program = x.program
    operands = [a for a in (*args, *kwargs.values()) if isinstance(a, (_SymTensor, _SymScalar))]
    booleans = [a.boolean for a in operands]
    _check_booleans(name, args, booleans)
    both_boolean = len(booleans) == 2 and all(booleans) and len(args) == 2 and not kwargs
    if name in ("add", "mul") and both_boolean:  # torch's bool + bool is a logical or, bool * bool an and
        name = "maximum" if name == "add" else "mul"
        record = _ELEMENT_OPS[name]
    resolve = functools.partial(_element_id, program)
    try:
        vid = record(program, resolve, resolve(args[0], name), *args[1:], **kwargs)
    except TypeError as e:
        raise Error(f"torch.{name}: arguments optjit does not record: {e}") from None
    return _value(program, vid, operands, boolean=name in _COMPARISONS or (name in ("maximum", "mul") and both_boolean))


def _check_booleans(name, args, booleans):
    """torch's rules for bool tensors (comparisons) that a 0/1 value would not keep: no negation or subtraction, and
    where() takes a bool condition."""
    if name in ("neg", "negative") and any(booleans):
        raise Error(f"torch.{name} of a comparison (a bool tensor): torch does not negate bool tensors")
    if name in ("sub", "subtract") and any(booleans):
        raise Error(f"torch.{name} with a comparison (a bool tensor): torch does not subtract bool tensors")
    if name == "where":
        condition = args[0] if args else None
        if not (_is_tensor(condition) and condition.boolean):
            raise Error(
                f"torch.where's condition is {'a number' if not _is_tensor(condition) else 'not a comparison'}: torch "
                "takes a bool tensor (a comparison of tensors)"
            )


def _foreach_op(name, args, kwargs):
    op = name[len("_foreach_") :]
    inplace = op.endswith("_")
    op = op.rstrip("_")
    self_list = args[0]
    if op == "pow" and not isinstance(self_list, (list, tuple)) and len(args) == 2:
        return _foreach_scalar_pow(name, self_list, args[1])
    # A list of tensors, or of per-tensor scalars (scalar state such as a step count, or _foreach_norm's results).
    if not (isinstance(self_list, (list, tuple)) and self_list and isinstance(self_list[0], (_SymTensor, _SymScalar))):
        raise Error(f"torch.{name}: its first argument must be one of the step function's lists")
    program = self_list[0].program
    _check_whole(program, self_list, f"torch.{name}")
    self_id = _list_id(program, self_list, name)
    if op in ("norm", "max") and not inplace:
        return _foreach_reduction(program, name, op, self_list, args[1:], kwargs)
    if op not in _FOREACH_OPS:
        raise Error(f"torch.{name} is outside optjit's step-function vocabulary")
    try:
        vid = _FOREACH_OPS[op](program, functools.partial(_list_id, program), self_id, *args[1:], **kwargs)
    except TypeError as e:
        raise Error(f"torch.{name}: arguments optjit does not record: {e}") from None
    if inplace:
        _assign(self_list, vid)
        return self_list
    return _result(program, vid, self_list)


def _foreach_scalar_pow(name, base, exponents):
    """torch._foreach_pow(number, list): the number to the power of each element."""
    if not (isinstance(exponents, (list, tuple)) and exponents and isinstance(exponents[0], (_SymTensor, _SymScalar))):
        raise Error(f"torch.{name}: one of its arguments must be one of the step function's lists")
    program = exponents[0].program
    vid = program.op("pow", [_list_id(program, base, name), _list_id(program, exponents, name)])
    return _result(program, vid, exponents)


def _foreach_reduction(program, name, op, self_list, args, kwargs):
    """torch._foreach_norm (2 or inf) and torch._foreach_max: each tensor's norm or largest element, as
    torch.linalg.vector_norm(x, ord) and x.max() of its element give it (_scalar_op), a per-tensor scalar of each."""
    extra = {k: v for k, v in kwargs.items() if k != "ord" and v is not None}
    if op == "max" and (args or kwargs):
        raise Error(f"torch.{name}: arguments optjit does not record")
    if extra or len(args) > 1:
        raise Error(f"torch.{name}: arguments optjit does not record ({', '.join(extra) or 'dtype'})")
    order = kwargs.get("ord", args[0] if args else 2)
    if op == "norm" and order not in (2, 2.0, float("inf")):
        raise Error(f"torch.{name}(ord={order!r}): optjit records the 2-norm and the inf-norm")
    if op == "norm":
        of_first = _scalar_op("linalg_vector_norm", (self_list[0], order), {})
    else:
        of_first = _scalar_op("max", (self_list[0],), {})
    return [_SymScalar(program, of_first.id, entry=k, tensor=True) for k in range(len(self_list))]


def _dispatch(func, args, kwargs):
    """torch's call of `func` (through __torch_function__) on symbolic values, recorded."""
    name = getattr(func, "__name__", str(func))
    if "input" in kwargs:  # torch.add(input=p, other=g)
        kwargs = dict(kwargs)
        args = (kwargs.pop("input"), *args)
    if name.startswith("_foreach_"):
        return _foreach_op(name, args, kwargs)
    if name == "foreach_map":  # torch._higher_order_ops.foreach_map(op, *lists): op on each entry's elements
        subgraph, *operands = args
        return subgraph(*operands, **kwargs)
    if name in ("matmul", "mm") and len(args) == 2:
        return _matmul(*args)
    if name == "addmm":
        return _addmm(*args, **kwargs)
    if name in ("max", "min") and len(args) == 2 and isinstance(args[1], (_SymTensor, _SymScalar)) and not kwargs:
        return _element_op("maximum" if name == "max" else "minimum", args, {})  # torch.max(a, b): elementwise
    symbolic = [a for a in args if isinstance(a, (_SymTensor, _SymScalar, _SymStack))]
    if name == "stack" and args and isinstance(args[0], (list, tuple)):
        return _scalar_op(name, args, kwargs)
    if not symbolic:
        raise Error(
            f"{name} is outside optjit's step-function vocabulary (torch ops on list elements, torch._foreach_* ops "
            "on whole lists)"
        )
    if isinstance(args[0], _SymStack) or name in _REDUCTIONS:
        result = _scalar_op(name, args, kwargs)
        if result is not None:
            return result
    if any(isinstance(a, _SymStack) for a in args):
        raise Error(f"torch.{name} on a torch.stack of per-tensor scalars is outside optjit's step-function vocabulary")
    if name.endswith("_") and isinstance(args[0], _Elementwise):  # torch.Tensor.add_(x, y), say
        method = args[0]._method(name)
        if method is None:
            raise Error(f"torch.Tensor.{name} is outside optjit's step-function vocabulary")
        return method(*args[1:], **kwargs)
    return _element_op(name, args, kwargs)
