"""What optjit reads from a torch.optim optimizer: whether it can compile it, its options as optjit's keywords, and
how torch lays out the state it creates (which dtype and device each entry gets). No optimizer math lives here: the
update itself is optjit's compiled C++ step."""

import functools
import inspect
import math
import numbers

import torch

from . import _quantized_shards
from ._optjit import OPTION_NONE, Error
from ._shards import _local

# torch.optim classes optjit compiles, by the class that defines their step.
SUPPORTED = {
    cls.__name__: cls
    for cls in (
        torch.optim.Adam,
        torch.optim.AdamW,
        torch.optim.SGD,
        torch.optim.NAdam,
        torch.optim.RAdam,
        torch.optim.Adamax,
        torch.optim.Adagrad,
        torch.optim.Adadelta,
        torch.optim.RMSprop,
        torch.optim.Rprop,
        torch.optim.ASGD,
        torch.optim.Adafactor,
        *([torch.optim.Muon] if hasattr(torch.optim, "Muon") else []),  # torch >= 2.9
    )
}

# torchao's low-bit Adam and AdamW (torchao.optim, 0.18), compiled as optjit's C++ optimizers of the same names
# (frontend/optim/lowbit_adam.h); found by name and module, so that torchao is never imported here.
TORCHAO_CLASSES = ("Adam8bit", "AdamW8bit", "Adam4bit", "AdamW4bit", "AdamFp8", "AdamWFp8")
# Their constructor options that torchao keeps on the optimizer, not in its param groups.
TORCHAO_OPTIMIZER_OPTIONS = {"block_size", "bf16_stochastic_round"}


def is_torchao(cls):
    return cls.__name__ in TORCHAO_CLASSES and cls.__module__.startswith("torchao.optim")


# Muon's adjust_lr_fn, by name, as optjit's option holds it (None: torch's default, "original").
_ADJUST_LR_FN = {"original": 0.0, "match_rms_adamw": 1.0, "spectral_unclamped": 2.0}

# Group keys that choose how torch runs a step rather than what it computes; optjit reads them itself.
_IMPLEMENTATION_KEYS = {"params", "foreach", "fused", "capturable", "differentiable"}
# Keys of a group that name things rather than set the algorithm: torch >= 2.6 keeps the names of params given as
# named_parameters() in "param_names" (and saves them in state_dict).
_NAMING_KEYS = {"param_names"}
# Keys LR schedulers add to param groups.
_SCHEDULER_KEYS = {"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"}
# optjit's own group options, which torch's groups carry and its step ignores.
_OPTJIT_OPTIONS = {"master_weights", "stochastic_rounding", "state_dtype", "state_block_size"}
# state_dtype's values, by name, as optjit's option holds them (StateDtype's order).
_STATE_DTYPES = {"plain": 0.0, "int8": 1.0, "int4": 2.0, "fp8": 3.0}
# ... and those of one class: Muon's f32_iterations (its normalization and Newton-Schulz iterations in f32).
_OPTJIT_CLASS_OPTIONS = {"Muon": {"f32_iterations"}}


@functools.lru_cache(maxsize=None)
def options_of(cls):
    """The group keys that are options of `cls`'s step: its constructor's keywords, and optjit's own. Any other key
    of a group (a name, timm's lr_scale, SWALR's swa_lr, the keys LR schedulers add) is the user's: torch's step
    ignores it, and so does optjit."""
    keys = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    keys |= _OPTJIT_OPTIONS | _OPTJIT_CLASS_OPTIONS.get(cls.__name__, set())
    return frozenset(keys - _IMPLEMENTATION_KEYS - _SCHEDULER_KEYS - _NAMING_KEYS)


# What torch's step runs of the optimizer's own methods: a subclass that overrides one changes the step (state made
# another way, say), which optjit, running torch's own algorithm, would not follow.
_STEP_METHODS = ("step", "_init_group")


def optimizer_class(opt):
    """torch's class whose step `opt` runs; an Error for anything optjit cannot compile."""
    if not isinstance(opt, torch.optim.Optimizer):
        raise Error(f"optjit.compile takes a torch.optim.Optimizer, not {type(opt).__name__}")
    mro = type(opt).__mro__
    torch_class = next((cls for cls in mro if SUPPORTED.get(cls.__name__) is cls or is_torchao(cls)), None)
    if torch_class is None:
        raise Error(
            f"optjit cannot compile {type(opt).__name__}: it compiles torch.optim's {', '.join(SUPPORTED)}, and "
            f"torchao.optim's {', '.join(TORCHAO_CLASSES)}"
        )
    methods = _STEP_METHODS + (("_new_buffer", "_subclass_zeros") if is_torchao(torch_class) else ())
    for method in methods:
        own = inspect.unwrap(getattr(torch_class, method, None))
        for cls in mro[: mro.index(torch_class)]:
            # torch.optim wraps each class's step in its hook runner (in that class's dict): look through wrappers.
            if method in vars(cls) and inspect.unwrap(vars(cls)[method]) is not own:
                raise Error(
                    f"{type(opt).__name__} overrides {method}() (in {cls.__qualname__}): optjit compiles the step of "
                    f"torch.optim's own {torch_class.__name__}, not a step it cannot see"
                )
    return torch_class


def check_group_flags(opt):
    """Errors for the flags of a group that torch's step itself refuses or optjit cannot follow; O(groups), run at
    every step since a group's flags may change (or come with load_state_dict) between steps."""
    for g, group in enumerate(opt.param_groups):
        if group.get("differentiable", False):
            raise Error(f"param group {g}: differentiable=True is not supported (optjit steps are not differentiable)")
        if group.get("capturable", False):
            _check_capturable(g, group)


def quantizes_state(group):
    """Whether a param group keeps block-quantized state (optjit's group option state_dtype)."""
    return group.get("state_dtype") not in (None, "plain")


def check_supported(opt, cls):
    """Errors for options and params optjit does not compile, naming them."""
    check_group_flags(opt)
    fused_devices = None
    for g, group in enumerate(opt.param_groups):
        if group.get("fused", False):
            for p in group["params"]:
                if torch.is_complex(p):  # torch's fused kernels refuse complex params; so does its fused=True step
                    raise Error(
                        "`fused=True` requires all the params to be floating point Tensors of supported devices: "
                        f"{_fused_devices()} but {p.dtype} and {p.device.type}"
                    )
            if fused_devices is None:
                fused_devices = set(_fused_devices())
            for p in group["params"]:
                if p.device.type not in fused_devices:
                    raise Error(
                        f"param group {g}: fused=True on {p.device}, where torch has no fused {cls.__name__} kernel"
                    )


def _check_capturable(g, group):
    """torch's capturable steps (CUDA-graph safe) run on the devices it names only, and refuse CPU params."""
    from torch.optim.optimizer import _get_capturable_supported_devices

    devices = _get_capturable_supported_devices()
    for p in group["params"]:
        if p.device.type not in devices:
            raise Error(
                f"param group {g}: capturable=True on {p.device}: If capturable=True, params and state_steps must be "
                f"on supported devices: {devices}."
            )


def _fused_devices():
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return _get_fused_kernels_supported_devices()


def _keyword(value, what):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise Error(f"{what} is a tensor of {value.numel()} elements: a tensor option holds one element")
        return [float(value.item())]
    if isinstance(value, bool):
        return [1.0 if value else 0.0]
    if isinstance(value, numbers.Real) or _is_numpy_scalar(value):  # numpy's scalars (np.float32, np.bool_) too
        return [float(value)]
    if isinstance(value, (tuple, list)):  # a pair; None inside is torch's default (Adafactor's eps1)
        return [v for element in value for v in _keyword_or_none(element, what)]
    raise Error(f"{what} is {value!r}: optjit takes numbers, flags, pairs and 1-element tensors")


def _is_numpy_scalar(value):
    return type(value).__module__ == "numpy" and hasattr(value, "__float__") and getattr(value, "ndim", 1) == 0


def _keyword_or_none(value, what):
    return [OPTION_NONE] if value is None else _keyword(value, what)


def keywords(cls, options, where):
    """A torch options dict (defaults or one group) as optjit's keyword options."""
    result = {}
    options_of_cls = options_of(cls)
    for key, value in options.items():
        if key not in options_of_cls or value is None:
            continue
        if cls is torch.optim.AdamW and key == "decoupled_weight_decay":
            continue  # AdamW always decouples; torch keeps the key for loading old checkpoints
        if key == "adjust_lr_fn" and isinstance(value, str):
            if value not in _ADJUST_LR_FN:
                raise torch_error(ValueError, f"Adjust learning rate function {value} is not supported")
            result[key] = [_ADJUST_LR_FN[value]]
            continue
        if key == "state_dtype":
            if value not in _STATE_DTYPES:
                raise Error(f"{where} option 'state_dtype' is {value!r}: it takes 'plain', 'int8', 'int4' or 'fp8'")
            result[key] = [_STATE_DTYPES[value]]
            continue
        result[key] = _keyword(value, f"{where} option '{key}'")
    return result


def scalar_state_dtype(group):
    """The dtype torch creates a group's scalar state in (step, eta, mu, mu_product): f32 for a fused group, else the
    default dtype's (torch.optim.optimizer._get_scalar_dtype(is_fused))."""
    if group.get("fused", False):
        return torch.float32
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def none_option_values(cls, param_groups):
    """What a None option of each group stands for in this step, where optjit's own rule would differ from torch's
    (None when no group needs it). Adafactor's eps1 default is finfo(dtype).eps of the first param it steps in the
    group, which optjit takes too; torch's foreach step (foreach=True: Adafactor takes its single-tensor step for
    None, on a GPU too) steps the group's (device, dtype) groups in the order torch's grouping gives instead, which
    only torch can tell. Groups that do not ask for foreach cost nothing here."""
    if cls.__name__ != "Adafactor":
        return None
    values = [{} for _ in param_groups]
    needed = False
    for group, value in zip(param_groups, values):
        if not group.get("foreach") or group["eps"][0] is not None:
            continue
        params = [p for p in group["params"] if p.grad is not None]
        if len({p.dtype for p in params}) < 2:
            continue  # one dtype: every rule agrees
        grouped = torch.optim.Optimizer._group_tensors_by_device_and_dtype([params, [p.grad for p in params]])
        _, dtype = next(iter(grouped))
        value["eps1"] = torch.finfo(dtype if dtype is not None else params[0].dtype).eps
        needed = True
    return values if needed else None


def scalar_state_device(cls, group, param):
    """Where torch's step puts a param's scalar state (step, mu_product, eta, mu): on the param's device for
    capturable and fused steps, and always for ASGD; on the CPU otherwise (and always for Adafactor), where torch
    updates it on the host. optjit follows it: scalar state on the CPU beside a CUDA param is updated on the host."""
    if cls is torch.optim.ASGD:
        return param.device
    if cls.__name__ == "Adafactor":
        return torch.device("cpu")
    on_device = group.get("fused") if cls is torch.optim.Adagrad else group.get("capturable") or group.get("fused")
    return param.device if on_device else torch.device("cpu")


# State torch makes from the grad rather than the param (so in the grad's layout when the two differ):
# SGD's momentum_buffer is clone(grad), Rprop's step_size full_like(grad, lr).
_GRAD_LAYOUT_STATE = {torch.optim.SGD: {"momentum_buffer"}, torch.optim.Rprop: {"step_size"}}
if hasattr(torch.optim, "Muon"):
    _GRAD_LAYOUT_STATE[torch.optim.Muon] = {"momentum_buffer"}  # zeros_like(grad)


def torchao_options(opt, options):
    """optjit's keyword options of a torchao optimizer's group (or defaults): the group's, and the optimizer's own
    block_size. Its bf16_stochastic_round draws its bits from inductor's generator inside torchao's compiled step, which
    no other step can reproduce: refused, naming optjit's own stochastic rounding."""
    if getattr(opt, "bf16_stochastic_round", False):
        raise Error(
            f"{type(opt).__name__}(bf16_stochastic_round=True): torchao draws its random bits inside its compiled step, "
            "which optjit cannot reproduce; use optjit's own stochastic rounding (the param group option "
            "stochastic_rounding=True, counter-based bits on every device) instead"
        )
    return dict(options, block_size=[float(opt.block_size)])


def torchao_new_state(opt, param, entries):
    """torchao's state for a param on its first step, made by torchao itself (its _new_buffer: quantized state, or
    plain state in the param's dtype for a small param), so that torchao's own step and checkpoints see it as theirs."""
    state = {}
    for key, kind, _initial, _copies, _layout in entries:
        if key == "step":
            state[key] = torch.tensor(0.0)  # torchao's: an f32 CPU tensor
        elif kind == "tensor":
            state[key] = opt._new_buffer(param, key == "exp_avg")  # exp_avg signed, the second moments unsigned
        else:
            raise Error(f"{type(opt).__name__} has no state entry '{key}' of kind {kind} in torchao")
    return state


def quantized_state(param, key, layout):
    """A block-quantized state entry of `param` made as `layout` (TorchStep.new_state's) says: its codes under `key`
    and its f32 scales under "<key>.scale"; DTensors for a DTensor param (_quantized_shards)."""
    codes_dtype, shape, code_byte, scale, block, bits = layout
    local = _local(param)
    codes = torch.full(shape, code_byte, dtype=torch.uint8, device=local.device)
    if codes_dtype == "float8_e4m3fn":
        codes = codes.view(torch.float8_e4m3fn)
    scales = torch.full((local.numel() // block,), scale, dtype=torch.float32, device=local.device)
    if _quantized_shards.is_dtensor(param):
        return _quantized_shards.as_dtensors(param, key, codes, scales, block, bits)
    return {key: codes, key + ".scale": scales}


def grad_layout_state(cls):
    return _GRAD_LAYOUT_STATE.get(cls, set())


def new_state(param, entries, scalar_dtype, scalar_device, grad_layout=()):
    """Torch's state for a param on its first step, from optjit's entries (key, kind, starting value, copies the
    param): tensor entries like the param (its dtype, device and memory format), scalar entries 0-d in the scalar
    dtype on `scalar_device` (scalar_state_device), entries named in `grad_layout` like the grad, rows and columns (Adafactor's row_var [..., m, 1] and
    col_var [..., 1, n]) as the grad's new_zeros. A DTensor param gets DTensor state, as torch's zeros_like
    gives. A complex param's entries start at complex(v, v), as torch's optimizers see them through view_as_real
    (Adagrad's sum, Rprop's step_size). Master weights (`master_param`) start as an f32 copy of the param, in its
    layout. A block-quantized entry (the group option state_dtype) is its codes (uint8, or float8_e4m3fn for FP8)
    under its key and its f32 scales under "<key>.scale", made as the entry's layout says."""
    state = {}
    for key, kind, initial, copies_param, layout in entries:
        if layout is not None:
            state.update(quantized_state(param, key, layout))
        elif copies_param:
            state[key] = param.detach().to(torch.float32, memory_format=torch.preserve_format, copy=True)
        elif kind == "scalar":
            state[key] = torch.tensor(float(initial), dtype=scalar_dtype, device=scalar_device)
        elif kind in ("rows", "cols"):
            shape = list(param.shape)
            shape[-1 if kind == "rows" else -2] = 1
            state[key] = param.grad.new_full(shape, float(initial))
        else:
            value = complex(initial, initial) if param.is_complex() else initial
            like = param.grad if key in grad_layout and param.grad is not None else param
            state[key] = torch.full_like(like, value, dtype=param.dtype, memory_format=torch.preserve_format)
    return state


# Errors optjit raises where torch's own step raises: an optjit.Error that is also torch's exception type (a
# KeyError for a group that lost an option, say), so that code catching either sees it.
_AS_TORCH_ERROR = {}


def torch_error(kind, message):
    """An optjit.Error that is also a `kind` (KeyError, ValueError, TypeError, ZeroDivisionError): what torch's step
    raises there, refused before anything changes."""
    if kind not in _AS_TORCH_ERROR:
        _AS_TORCH_ERROR[kind] = type(kind.__name__, (Error, kind), {"__module__": "optjit"})
    return _AS_TORCH_ERROR[kind](message)


# Options torch's step reads with group[key] that it does not need to find (it reads them with .get(), or never).
_OPTIONAL_KEYS = {torch.optim.SGD: {"differentiable"}, torch.optim.Adagrad: {"initial_accumulator_value"}}
# Options torch's step unpacks into two values (`beta1, beta2 = group["betas"]`).
_PAIR_KEYS = {"betas", "etas", "step_sizes"}
# (option, element, value) that makes torch's single-tensor step divide a Python float by zero: Adam's and Adamax's
# bias correction 1 - beta1 ** step, RAdam's rho_inf = 2 / (1 - beta2) - 1.
_ZERO_DIVISORS = {
    torch.optim.Adam: (("betas", 0, 1.0),),
    torch.optim.AdamW: (("betas", 0, 1.0),),
    torch.optim.Adamax: (("betas", 0, 1.0),),
    torch.optim.RAdam: (("betas", 1, 1.0),),
}


@functools.lru_cache(maxsize=None)
def _required_keys(cls):
    keys = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    if is_torchao(cls):
        keys -= TORCHAO_OPTIMIZER_OPTIONS
    return tuple(sorted(keys - _OPTIONAL_KEYS.get(cls, set())))


def check_step_options(cls, opt):
    """Refuses, before anything changes, a group torch's step would raise on: a missing option (KeyError), a pair
    option that is not two values (ValueError, TypeError, as Python's unpacking says), or an option that makes torch
    divide by zero (ZeroDivisionError). O(groups)."""
    required = _required_keys(cls)
    for g, group in enumerate(opt.param_groups):
        missing = [key for key in required if key not in group]
        if missing:
            raise torch_error(KeyError, f"param group {g} has no option '{missing[0]}', which torch's step reads")
        if cls is torch.optim.Adafactor:
            pairs = ("eps",)
        else:
            pairs = [key for key in _PAIR_KEYS if key in group]
        for key in pairs:
            value = group[key]
            try:
                _, _ = value
            except (TypeError, ValueError) as e:
                raise torch_error(type(e), f"param group {g} option '{key}' is {value!r}: {e}") from None
        if cls.__name__ == "Muon":
            coefficients = group["ns_coefficients"]
            if not isinstance(coefficients, (tuple, list)) or len(coefficients) != 3:
                raise torch_error(ValueError, "Coefficients must be a tuple of exactly 3 values")
            if group["ns_steps"] >= 100:
                raise torch_error(ValueError, "Number of steps must be less than 100 for computational efficiency")
            if group.get("adjust_lr_fn") in (None, "original", "spectral_unclamped"):
                for p in group["params"]:
                    if p.grad is not None and p.dim() == 2 and p.shape[1] == 0:
                        raise torch_error(
                            ZeroDivisionError,
                            f"param group {g} has a param of shape {list(p.shape)}: torch's adjust_lr_fn "
                            f"{group.get('adjust_lr_fn')!r} divides its rows by its columns (float division by zero)",
                        )
        for key, element, bad in _ZERO_DIVISORS.get(cls, ()):
            value = group[key][element]
            if not isinstance(value, torch.Tensor) and value == bad:
                raise torch_error(
                    ZeroDivisionError,
                    f"param group {g} option '{key}' has {value!r} at index {element}: torch's step divides by "
                    "zero (float division by zero)",
                )


def check_lr_range(opt, dtype_limits):
    """Refuses a finite float lr beyond the range of its group's params' dtype, where torch's conversion of the
    scalar for the params' ops refuses it (SGD's `param.add_(grad, alpha=-lr)`). `dtype_limits[g]`: the largest
    finite value of group g's narrowest param dtype (dtype_limits())."""
    for g, group in enumerate(opt.param_groups):
        lr = group.get("lr")
        limit = dtype_limits[g] if g < len(dtype_limits) else None
        if limit is not None and isinstance(lr, numbers.Real) and math.isfinite(lr) and abs(lr) > limit:
            raise Error(
                f"param group {g} option 'lr' is {lr!r}: value cannot be converted to the params' dtype without "
                f"overflow (its largest finite value is {limit!r})"
            )


def dtype_limits(opt):
    """The largest finite value of each group's narrowest floating param dtype (None for a group without params)."""
    limits = []
    for group in opt.param_groups:
        finite = [torch.finfo(p.dtype).max for p in group["params"] if p.is_floating_point() or p.is_complex()]
        limits.append(min(finite) if finite else None)
    return limits
