"""optjit.compile(opt): a torch.optim optimizer's step as one compiled callable, in place on torch's tensors."""

import atexit
import contextlib
import copy
import functools
import gc
import inspect
import sys
import threading
import warnings
import weakref
from itertools import chain

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from . import _quantized_shards, _torch_optim
from ._optjit import CudaStreams, Error, TorchStep
from ._shards import _check_sharded_reductions, _grad_norm_reducer, _inf_check_reducer, _local, _sharded

_STAGES = ("traced", "optimized", "fused", "llvm", "ptx")


class CompiledStep:
    """A compiled opt.step(). Calling it is opt.step(closure=None): torch's step hooks, the closure, then one
    compiled update of every param with a grad, in place on the params and on opt.state (torch's own tensors).

    Hyperparameters are read from opt.param_groups at every call (a float or a tensor lr), so LR schedulers and
    edits never recompile; options that change the algorithm (amsgrad, momentum != 0, ...) recompile and say why
    (metrics()["recompile_reasons"], OPTJIT_LOG=recompiles). The state stays torch's: state_dict(),
    load_state_dict() and add_param_group() keep working before and after compiling.

    With max_grad_norm, every step first applies exactly torch.nn.utils.clip_grad_norm_(params with grads,
    max_grad_norm, norm_type, error_if_nonfinite) over all param groups, fused: the norm is one reduction pass over
    the grads, the update reads each grad times the clip coefficient, and the grads themselves are not written.
    total_norm is the norm of the last step, before clipping (what clip_grad_norm_ returns, in its dtype).

    Gradient scaling: the step reads GradScaler's opt.grad_scale and opt.found_inf as torch's fused optimizers do
    (optjit.patch(opt, fuse_unscale=True) sets _step_supports_amp_scaling). Called with grad_scaler= (GradScaler's
    older contract, which optjit.patch(opt, fuse_inf_check=True) asks for), it takes over GradScaler's inf check as
    well: the grads are checked for infs and NaNs in the step's first pass (with the clipping norm, when there is
    one), not in a pass of GradScaler's own, and the step is skipped when one is found. On a GPU, a found_inf there is
    read by the kernels (no copy back, no wait), as torch's fused kernels read it: a step with an inf writes every
    value back unchanged, and the state it made for params stepping for the first time stays (zeros, step 0), as
    torch's fused step leaves it; a tensor lr on the params' GPU is read there too."""

    def __init__(self, opt, max_grad_norm=None, norm_type=2.0, error_if_nonfinite=False):
        self._cls = _torch_optim.optimizer_class(opt)
        _torch_optim.check_supported(opt, self._cls)
        self._clipping = _clipping(max_grad_norm, norm_type, error_if_nonfinite)
        self._opt = opt  # held, as torch.compile(opt.step) holds it
        self._lock = _step_lock(opt)
        _keep_uncast_state(opt, self._lock)
        self._retired = []  # metrics of the compiled steps replaced by add_param_group
        self._total_norm = None  # of the last clipped step (NaN for one skipped for an inf or NaN); None before one
        self._total_norm_tensor = None  # total_norm as clip_grad_norm_ returns it, once asked for
        self._norm_device = None  # a GPU the next step's norm may stay on: it is given a tensor there to write it to
        self._norm_copy_set = False  # whether the C++ step holds such a tensor
        self._norm_params = []  # the params with grads in the last step
        self._cxx = None
        self._groups_seen = None
        self._sharded_muon = None  # Muon over FSDP2's shards: gathered, orthogonalized and scattered (ShardedMuon)
        _live_steps.add(self)

    def _release(self):
        """Drops the C++ step (at interpreter exit: see _release_at_exit)."""
        self._cxx = None
        self._groups_seen = None

    # torch.optim's step(closure) contract, and GradScaler's grad_scaler= one.
    def __call__(self, closure=None, grad_scaler=None, **kwargs):
        if kwargs:
            raise Error(
                f"the compiled step takes only closure= and grad_scaler=, not {', '.join(kwargs)} (a GradScaler "
                "hands over its scale as opt.grad_scale and opt.found_inf, or itself as grad_scaler=)"
            )
        if grad_scaler is not None and not hasattr(grad_scaler, "_per_optimizer_states"):
            raise Error(
                f"grad_scaler is {grad_scaler!r}: the compiled step takes a torch.amp.GradScaler there "
                "(GradScaler.step passes itself), or None"
            )
        if closure is not None and not callable(closure):
            raise Error(f"closure is {closure!r}: a step's closure is a callable that returns the loss, or None")
        with self._exclusive(stepping=True):
            return self._call_locked(self._optimizer(), closure, grad_scaler)

    @contextlib.contextmanager
    def _exclusive(self, stepping=False):
        """Holds the optimizer's lock: its C++ step is used by one caller at a time (the update runs without the
        GIL, so a second caller would race with it). Reading (metrics, dump, kernel_count) from the thread that is
        stepping, as a step hook does, is safe: the update is not running then."""
        lock = self._lock
        holder = lock.holder()
        if not stepping and holder is not None and holder.thread == threading.get_ident():
            yield
            return
        claim = _Claim()
        # Held while `claim` lives: an interrupt (a KeyboardInterrupt, a timer's exception) anywhere from here on
        # drops this frame's reference, and with it the claim, so the lock can never stay taken.
        reference = lock.claim(claim)
        try:
            if lock.holder() is not claim:
                raise Error(
                    "this optimizer is already being stepped, from another thread or from a hook or closure of its "
                    "own step: optjit steps an optimizer from one thread at a time (the update runs without the GIL)"
                )
            yield
        finally:
            lock.unclaim(reference)

    def _call_locked(self, opt, closure, grad_scaler=None):
        args, kwargs = (opt,), {} if closure is None else {"closure": closure}
        for pre_hook in chain(_global_optimizer_pre_hooks.values(), opt._optimizer_step_pre_hooks.values()):
            result = pre_hook(opt, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(f"a step pre hook must return None or (new_args, new_kwargs), got {result}")
                args, kwargs = result
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grad_scaler is None:
            # GradScaler's fused-optimizer contract: grads divided by opt.grad_scale in the kernel; a step with a
            # non-zero opt.found_inf changes nothing (on the CPU it creates no torch state either; on a GPU the
            # kernels decide, and first-time state stays, as with torch's fused step).
            self._update(opt, getattr(opt, "grad_scale", None), getattr(opt, "found_inf", None), False)
        else:
            self._update(opt, *_take_over_inf_check(opt, grad_scaler))
        opt._opt_called = True  # what torch's LR schedulers check to see that the optimizer stepped
        for post_hook in chain(opt._optimizer_step_post_hooks.values(), _global_optimizer_post_hooks.values()):
            post_hook(opt, args, kwargs)
        return loss

    @property
    def total_norm(self):
        """The total grad norm of the last step (before clipping), as clip_grad_norm_ returns it: a 0-d tensor of the
        grads' promoted (real) dtype on the first grad's device, a DTensor over the mesh when the grads are DTensors
        (its full_tensor() is the whole model's norm), and a CPU 0.0 when no param had a grad. None before a clipped
        step, or when the step does not clip."""
        norm = self._total_norm
        if self._clipping[0] is None or norm is None:
            return None
        if self._total_norm_tensor is None:
            self._total_norm_tensor = _norm_tensor(norm, self._norm_params)
        return self._total_norm_tensor

    @property
    def kernel_count(self):
        """Kernels one step launches with the grads present now."""
        return self._per_step_count("kernels")

    @property
    def library_call_count(self):
        """Matrix products one step runs in the matrix library between its kernels (Muon's iterations)."""
        return self._per_step_count("library_calls")

    def _per_step_count(self, key):
        """metrics()[key] of one step ("kernels" or "library_calls"), without the rest of metrics()."""
        with self._exclusive():
            opt = self._optimizer()
            if self._muon_over_shards(opt) is not None:
                return self._sharded_muon.metrics()[key]
            cxx = self._compiled(opt)
            return cxx.kernel_count() if key == "kernels" else cxx.library_call_count()

    def metrics(self):
        """What compiling and stepping did: compiles, recompiles (and why), rebinds, kernels and library calls (matrix
        products) per step, times."""
        with self._exclusive():
            opt = self._optimizer()
            if self._muon_over_shards(opt) is not None:
                return self._sharded_muon.metrics()
            cxx = self._compiled(opt)
            metrics = cxx.metrics()
            kernels = cxx.kernel_count()
            library_calls = cxx.library_call_count()
        for old in self._retired:
            counts = ("steps", "skipped_steps", "compiles", "recompiles", "rebinds", "kernels_generated", "cache_hits")
            for key in counts:
                metrics[key] += old[key]
            metrics["compile_ms"] += old["compile_ms"]
            metrics["dispatch_ms"] += old["dispatch_ms"]
        metrics["recompile_reasons"] = [r for old in self._retired for r in old["recompile_reasons"]] + metrics[
            "recompile_reasons"
        ]
        metrics["kernels"] = kernels
        metrics["library_calls"] = library_calls  # matrix products per step in the matrix library (Muon's)
        return metrics

    def dump(self, stage="fused", gpu_sm=0):
        """The step's code at one stage: "traced", "optimized", "fused", "llvm" or "ptx" (ptx needs no GPU)."""
        if stage not in _STAGES:
            raise Error(f"unknown stage {stage!r}: expected one of {', '.join(_STAGES)}")
        with self._exclusive():
            opt = self._optimizer()
            cxx = self._compiled(opt)
            try:
                self._sync(opt, cxx)
            except Error:
                pass  # a grad or option the next step will refuse: the code dumped is the step compiled last
            return cxx.dump(stage, gpu_sm)

    def _optimizer(self):
        return self._opt

    def _update(self, opt, grad_scale, found_inf, check_in_step):
        _torch_optim.check_group_flags(opt)
        _torch_optim.check_step_options(self._cls, opt)
        sharded_muon = self._muon_over_shards(opt)
        if sharded_muon is not None:
            if grad_scale is not None or found_inf is not None or check_in_step or self._clipping[0] is not None:
                raise Error(
                    "torch.optim.Muon over DTensor shards with gradient scaling or fused clipping: optjit steps it in "
                    "three parts around its collectives, without a grad pass; unscale and clip before the step "
                    "(GradScaler.unscale_, clip_grad_norm_)"
                )
            if any(_torch_optim.quantizes_state(group) for group in opt.param_groups):
                raise Error(
                    "torch.optim.Muon cannot keep its state block-quantized (state_dtype): its momentum buffer feeds "
                    "matrix products, which take plain tensors"
                )
            sharded_muon.step(opt)
            self._norm_params = [p for group in opt.param_groups for p in group["params"] if p.grad is not None]
            _increment_versions(self._norm_params)
            return
        # The C++ step checks, as it steps, that the groups still hold the params it was built over: a param replaced
        # in a group's list (False) builds it again, and the step runs on the new one.
        cxx = self._compiled(opt, check_binding=False)
        stepped, created = self._run(opt, cxx, grad_scale, found_inf, check_in_step)
        if stepped is False:
            cxx = self._compiled(opt)
            stepped, created = self._run(opt, cxx, grad_scale, found_inf, check_in_step)
        ran, self._total_norm, self._norm_params = stepped
        self._total_norm_tensor = None  # made when asked for, from the params that had grads in this step
        # A clipping step on a GPU: the next step gets a tensor there to write its norm to (the step returns it when
        # the norm stayed on the device, a float otherwise).
        if self._clipping[0] is not None and self._norm_params and self._norm_params[0].is_cuda:
            self._norm_device = self._norm_params[0].device
        else:
            self._norm_device = None
        for group in _rounding_groups(opt):
            group[_ROUNDING_STEPS_KEY] = cxx.stochastic_rounding_steps()
        if not ran:
            self._drop_state(opt, cxx, created)  # nor does a step its own inf check skipped
            return
        # Like torch's in-place ops, the step counts as a change of each param it wrote, so that autograd refuses a
        # backward through a graph that saved the param before it (GAN-style loops would otherwise get wrong grads).
        _increment_versions(self._norm_params)
        _remember_master_versions(opt, self._lock)

    def _muon_over_shards(self, opt):
        """The ShardedMuon stepping torch.optim.Muon over FSDP2's shards, made on the first such step; None for any
        other step."""
        if self._cls.__name__ != "Muon":
            return None
        if self._sharded_muon is None and _sharded([p for group in opt.param_groups for p in group["params"]]):
            from ._sharded_muon import ShardedMuon  # it steps through step functions, which import this module

            self._sharded_muon = ShardedMuon(opt)
        return self._sharded_muon

    def _run(self, opt, cxx, grad_scale, found_inf, check_in_step):
        """One step of `cxx`: (False, []) when the groups no longer hold its params (nothing changed), else ((whether
        the update ran, the total grad norm, the params with grads), the flat indices of the params whose state this
        step made)."""
        try:
            _torch_optim.check_lr_range(opt, self._dtype_limits)
        except Error:
            # By the params the groups hold now: one replaced since cxx was built (its step() says so, and the step is
            # built again) has limits of its own.
            _torch_optim.check_lr_range(opt, _torch_optim.dtype_limits(opt))
        _widen_cast_masters(opt)
        _reseed_changed_masters(opt, self._lock)
        rounding = _rounding_groups(opt)
        if rounding:
            steps = max(int(group.get(_ROUNDING_STEPS_KEY, 0)) for group in rounding)
            if cxx.stochastic_rounding_steps() != steps:  # a step rebuilt, another compile, a resume
                cxx.set_stochastic_rounding_steps(steps)
        created = []
        # A step whose norm stays on the device (a clipping step on a GPU) writes it into a new tensor there too,
        # what total_norm returns: no copy back, no wait. Given from the second clipping step on a GPU.
        if self._norm_device is not None:
            cxx.set_grad_norm_copy(torch.empty((), dtype=torch.float64, device=self._norm_device))
        elif self._norm_copy_set:
            cxx.set_grad_norm_copy(None)
        self._norm_copy_set = self._norm_device is not None
        with self._streams.lend():
            # One call in a steady state: GradScaler's tensors, torch's state, options and grads, then the update.
            # None: a param steps for the first time, and gets torch's state before the update runs.
            none_values = self._none_values(opt)
            stepped = cxx.step(grad_scale, found_inf, check_in_step, opt.state, opt.param_groups, none_values)
            if stepped is None:
                created = self._create_state(opt, cxx)
                try:
                    ran = cxx.update()
                except Error:
                    self._drop_state(opt, cxx, created)  # a refused step (error_if_nonfinite) leaves no state it made
                    raise
                # A step skipped for an inf or NaN in the grads (GradScaler's found_inf, or the step's own check) has
                # no finite norm: clip_grad_norm_ of those grads is NaN or inf, never the last step's.
                stepped = (ran, cxx.step_grad_norm() if ran else float("nan"), cxx.params_with_grads())
        return stepped, created

    def _drop_state(self, opt, cxx, created):
        for flat in created:
            opt.state.pop(self._params[flat], None)
            cxx.adopt(flat, {}, False)

    def _compiled(self, opt, check_binding=True):
        """The C++ step, built again when the param groups changed (add_param_group). `check_binding`: also when a
        param in a group's list was replaced (without it, the C++ step's own step() checks that)."""
        # A group's options are read at every step; one that gains or loses an option (optjit's master_weights,
        # say, which torch's groups do not carry) needs the C++ step built again to read it.
        groups = [
            (id(group["params"]), len(group["params"]), len(group.keys() & _torch_optim.options_of(self._cls)))
            for group in opt.param_groups
        ]
        if (
            self._cxx is not None
            and groups == self._groups_seen
            and (not check_binding or self._cxx.binds(opt.param_groups))
        ):
            return self._cxx
        reason = None
        if self._cxx is not None and self._groups_seen is not None:
            old = self._cxx.metrics()
            if groups == self._groups_seen:
                reason = "a param in the param groups was replaced by another tensor"
            elif [g[:2] for g in groups] == [g[:2] for g in self._groups_seen]:
                reason = "a param group gained or lost an option"
            else:
                reason = f"the param groups changed ({len(self._groups_seen)} -> {len(groups)} groups)"
            old["recompile_reasons"] = old["recompile_reasons"] + [reason]
            old["recompiles"] += 1
        _torch_optim.check_supported(opt, self._cls)
        defaults = _torch_optim.keywords(self._cls, opt.defaults, "default")
        group_options = [
            _torch_optim.keywords(self._cls, group, f"param group {g}") for g, group in enumerate(opt.param_groups)
        ]
        if _torch_optim.is_torchao(self._cls):
            defaults = _torch_optim.torchao_options(opt, defaults)
            group_options = [_torch_optim.torchao_options(opt, options) for options in group_options]
        # The C++ step's own scalar state (a rounding stream) takes the first group's dtype; torch's is made per group.
        scalar_dtype = _torch_optim.scalar_state_dtype(opt.param_groups[0] if opt.param_groups else {})
        # Built in locals and published at the end, the step last: an exception or an interrupt part way (a
        # KeyboardInterrupt in the first, compiling call) leaves the old step whole, or none, never half of one.
        cxx = TorchStep(self._cls.__name__, opt.param_groups, defaults, group_options, scalar_dtype)
        params = [p for group in opt.param_groups for p in group["params"]]
        cxx.set_grad_clipping(*self._clipping)
        if self._clipping[0] is not None:
            cxx.set_grad_norm_reducer(_grad_norm_reducer(params))
        cxx.set_inf_check_reducer(_inf_check_reducer(params))
        _check_sharded_reductions(self._cls, params)
        self._params = params
        self._group_of = [g for g, group in enumerate(opt.param_groups) for _ in group["params"]]
        self._streams = _cuda_streams(params)
        self._dtype_limits = _torch_optim.dtype_limits(opt)
        self._groups_seen = groups
        if reason is not None:
            self._retired.append(old)
        # Quantized state as the new step expects it (once per build: the load hooks keep codes uncast after it).
        _restore_cast_codes(opt)
        _quantize_constructor_state(opt, self._cls, cxx, params)
        self._cxx = cxx
        return cxx

    def _sync(self, opt, cxx):
        """Hands this step's torch objects to the C++ step: torch's state where it changed since it was adopted
        (loaded, edited, replaced, cleared, or made by torch's own step), then hyperparameters and grads, then the
        state torch would create now for params stepping for the first time (their flat indices are returned)."""
        cxx.sync_state(opt.state)
        cxx.sync(opt.param_groups, self._none_values(opt))
        return self._create_state(opt, cxx)

    def _none_values(self, opt):
        return _torch_optim.none_option_values(self._cls, opt.param_groups)

    def _create_state(self, opt, cxx):
        """Makes torch's state for the params stepping for the first time, as torch's step would (their flat indices
        are returned), and hands it to the C++ step."""
        created = []
        for flat in cxx.params_without_state():
            p = self._params[flat]
            have = opt.state[p]
            group = opt.param_groups[self._group_of[flat]]
            entries = [e for e in _new_state_entries(cxx, flat, p) if e[0] not in have]
            scalar_device = _torch_optim.scalar_state_device(self._cls, group, p)
            grad_layout = _torch_optim.grad_layout_state(self._cls)
            scalar_dtype = _torch_optim.scalar_state_dtype(group)
            if _torch_optim.is_torchao(self._cls):
                state = _torch_optim.torchao_new_state(opt, p, entries)
            else:
                state = _torch_optim.new_state(p, entries, scalar_dtype, scalar_device, grad_layout)
            completes = len(have) > 0  # master weights turned on for state made without them: only those are new
            have.update(state)
            cxx.adopt(flat, have, completes)
            if not completes:
                created.append(flat)
        return created


class _cuda_streams:
    """The CUDA devices `tensors` are on. lend() is a context manager lending optjit torch's current stream of each
    (read when it is entered: a `with torch.cuda.stream(s):` around the step is followed), so that the step queues
    its copies and launches in order with the model's work; nothing for CPU tensors. A step inside a CUDA graph
    capture is refused: optjit's own copies and waits cannot be captured."""

    def __init__(self, tensors):
        self._devices = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})

    def lend(self):
        if not self._devices:
            return contextlib.nullcontext()
        if torch.cuda.is_current_stream_capturing():
            raise Error(
                "optjit steps cannot be captured in a CUDA graph (torch.cuda.graph): a step waits for and copies its "
                "own values; call it outside the capture (optjit launches one kernel per group, so a graph saves little)"
            )
        return CudaStreams([(d, torch.cuda.current_stream(d).cuda_stream) for d in self._devices])


def _increment_versions(tensors):
    """autograd's version of each tensor, counted up as an in-place op would (torch.autograd.graph.increment_version
    takes a list from torch 2.5 on; one at a time before)."""
    if _INCREMENT_TAKES_LISTS:
        torch.autograd.graph.increment_version(tensors)
    else:
        for t in tensors:
            torch.autograd.graph.increment_version(t)


try:
    torch.autograd.graph.increment_version([])
    _INCREMENT_TAKES_LISTS = True
except TypeError:
    _INCREMENT_TAKES_LISTS = False


# Every compiled step and step function alive, to drop their C++ steps when the interpreter exits: one held by
# something that outlives the modules' teardown (a global step hook, a module-level optimizer's patched step) would
# otherwise still be alive when nanobind checks for leaked instances, which it reports as a reference-counting bug.
_live_steps = weakref.WeakSet()


@atexit.register
def _release_at_exit():
    for step in list(_live_steps):
        step._release()


# One lock per torch optimizer, shared by every compiled step made of it (optjit.compile(opt) twice, or patch).
_step_locks = weakref.WeakKeyDictionary()
_step_locks_guard = threading.Lock()


class _Claim:
    """A caller's claim on a _StepLock, from the thread that made it."""

    __slots__ = ("thread", "__weakref__")

    def __init__(self):
        self.thread = threading.get_ident()


class _StepLock:
    """What every compiled step of one optimizer shares: the lock, and what must outlive a rebuilt step.

    The lock is a list of weak references to live claims, in the order they were made: the first live one holds it.
    Taking it is one list append, and it is released when its claim is dropped or dies, so an exception arriving
    between any two bytecodes (a KeyboardInterrupt inside the first, compiling call, say) never leaves it taken: a
    mutex acquired just before such an interrupt stayed acquired for good."""

    def __init__(self):
        self.claims = []
        # id(param) -> (weak reference, autograd version, data address) of each param whose f32 master the last step wrote
        self.master_versions = {}
        self.load_hooks = False  # _keep_uncast_state has hooked the optimizer's load_state_dict

    def claim(self, claim):
        reference = weakref.ref(claim)
        self.claims.append(reference)  # one atomic step under the GIL
        return reference

    def unclaim(self, reference):
        try:
            self.claims.remove(reference)
        except ValueError:  # dropped as dead by holder() already
            pass

    def holder(self):
        """The claim holding the lock (the first live one), or None. Dead claims met on the way are dropped."""
        for reference in list(self.claims):
            claim = reference()
            if claim is not None:
                return claim
            self.unclaim(reference)
        return None


# The dtypes of block-quantized state's codes (the group option state_dtype); torch < 2.1 has no float8.
_CODE_DTYPES = tuple(d for d in (torch.uint8, getattr(torch, "float8_e4m3fn", None)) if d is not None)


def _kept_as_saved(entries):
    """The entries of one param's saved state that torch's load_state_dict would cast to the param's dtype and optjit
    keeps as saved: an f32 master_param, and block-quantized state (codes, which a cast to floats would turn into
    their indexes, and their "<key>.scale")."""
    kept = {}
    if not isinstance(entries, dict):
        return kept
    for key, value in entries.items():
        if not isinstance(value, torch.Tensor):
            continue
        if key == "master_param" and value.dtype == torch.float32:
            kept[key] = value
        elif value.dtype in _CODE_DTYPES and isinstance(entries.get(f"{key}.scale"), torch.Tensor):
            kept[key] = value
            kept[f"{key}.scale"] = entries[f"{key}.scale"]
    return kept


def _keep_uncast_state(opt, record):
    """torch's load_state_dict casts every state entry but `step` to its param's dtype: a master_param too (bf16),
    and the codes of quantized state (to floats). Those of the state dict being loaded are put back as saved once it
    has loaded (a pre and a post hook, once per optimizer), and masters loaded so are trusted as they are."""
    if record.load_hooks:
        return
    record.load_hooks = True
    loading = {}

    def before(optimizer, state_dict):
        loading["ids"] = [i for group in state_dict["param_groups"] for i in group["params"]]
        loading["kept"] = {i: _kept_as_saved(entries) for i, entries in state_dict["state"].items()}

    def after(optimizer):
        kept = loading.pop("kept", {})
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for i, p in zip(loading.pop("ids", []), params):
            state = optimizer.state.get(p, {})
            for key, value in kept.get(i, {}).items():
                if key in state:
                    state[key] = value.to(device=p.device, copy=True)
        # The loaded masters are trusted as they are; a param written after this load restarts its master.
        record.master_versions.clear()
        _remember_master_versions(optimizer, record)

    opt.register_load_state_dict_pre_hook(before)
    opt.register_load_state_dict_post_hook(after)


# Stochastic rounding's step count (the stream's position), kept in each param group that rounds so: torch's
# state_dict saves group keys and load_state_dict restores them, and every compiled step of the optimizer reads it,
# so a rebuilt step, another compile and a resumed run continue the stream instead of drawing step 0's bits again.
_ROUNDING_STEPS_KEY = "optjit_stochastic_rounding_steps"


def _rounding_groups(opt):
    return [group for group in opt.param_groups if group.get("stochastic_rounding")]


def _master_params(opt):
    """The params of groups with master weights that have an f32 master in opt.state, with it."""
    for group in opt.param_groups:
        if group.get("master_weights"):
            for p in group["params"]:
                master = opt.state.get(p, {}).get("master_param")
                if master is not None:
                    yield p, master


def _reseed_changed_masters(opt, record):
    """A param written since its master was (p.copy_, model.load_state_dict, p.data = t, steps without master
    weights or by plain torch) is the truth: its master starts again from it, or the step would put the old value
    back. Writes through p.data in place (p.data.clamp_) change neither the version nor the address: autograd does
    not see them, and neither does this."""
    versions = record.master_versions
    if not versions:
        return
    with torch.no_grad():
        for p, master in _master_params(opt):
            seen = versions.get(id(p))
            if seen is not None and seen[0]() is p and seen[1:] != (p._version, _local(p).data_ptr()):
                master.copy_(p)


def _remember_master_versions(opt, record):
    # Updated, not replaced: a group whose master weights are off for a while keeps its entries, so that turning them
    # on again finds its params changed.
    record.master_versions.update(
        {id(p): (weakref.ref(p), p._version, _local(p).data_ptr()) for p, _ in _master_params(opt)}
    )


def _widen_cast_masters(opt):
    """Masters torch's load_state_dict cast to the param's dtype before optjit hooked it (loaded before compiling):
    f32 again, in the param's layout. Their low bits are gone; a warning says so once per load."""
    cast = [(p, master) for p, master in _master_params(opt) if master.dtype != torch.float32]
    for p, master in cast:
        opt.state[p]["master_param"] = master.to(torch.float32, memory_format=torch.preserve_format)
    if cast:
        warnings.warn(
            f"{len(cast)} master weight(s) were loaded as {cast[0][1].dtype} (torch's load_state_dict casts state to "
            "the param's dtype) and continue in f32 from those values: compile (or patch) the optimizer before "
            "load_state_dict to keep the checkpoint's f32 masters exactly",
            stacklevel=5,
        )


def _restore_cast_codes(opt):
    """Block-quantized state torch's load_state_dict cast to the param's dtype before optjit hooked it (loaded before
    compiling): its codes again, exactly (uint8 indexes and e4m3 values are exact in every float dtype), and its
    scales in f32 (their low bits are gone for bf16 and f16 params; a warning says so). The group's state_dtype says
    which codes; values that are not such codes are refused."""
    widened = 0
    for group in opt.param_groups:
        if not _torch_optim.quantizes_state(group):
            continue
        dtype = group["state_dtype"]
        for p in group["params"]:
            state = opt.state.get(p)
            for key, value in list(state.items()) if state else ():
                scales = state.get(f"{key}.scale")
                if not isinstance(scales, torch.Tensor) or value.dtype in _CODE_DTYPES or not value.is_floating_point():
                    continue
                codes = value.to(torch.float8_e4m3fn if dtype == "fp8" else torch.uint8)
                if not torch.equal(codes.to(value.dtype), value):
                    raise Error(
                        f"state '{key}' of a param of shape {list(p.shape)} is {value.dtype} beside its scales, and "
                        f"its values are not {dtype} codes: the state was not saved with state_dtype={dtype!r}"
                    )
                state[key] = codes
                if scales.dtype != torch.float32:
                    state[f"{key}.scale"] = scales.to(torch.float32)
                    widened += 1
    if widened:
        warnings.warn(
            f"{widened} quantized state scale(s) were loaded in a lower precision (torch's load_state_dict casts state "
            "to the param's dtype) and continue in f32 from those values: compile (or patch) the optimizer before "
            "load_state_dict to keep the checkpoint's scales exactly",
            stacklevel=5,
        )


def _new_state_entries(cxx, flat, p):
    """cxx.new_state(flat) for param `p`: for a DTensor, whether its state is quantized is the whole tensor's
    (_quantized_shards.shards_quantize), not its shard's."""
    shard_quantizes = None
    if _quantized_shards.is_dtensor(p):
        block = cxx.state_block_size(flat)
        shard_quantizes = block > 0 and _quantized_shards.shards_quantize(p, block)
    return cxx.new_state(flat, shard_quantizes)


def _quantize_constructor_state(opt, cls, cxx, params):
    """torch's Adagrad makes its state in its constructor, in the param's dtype (sum = initial_accumulator_value,
    step = 0). In a group with state_dtype, a `sum` still untouched, of a param the new step quantizes (cxx's layout
    for it), is replaced in place by the same values quantized."""
    if cls is not torch.optim.Adagrad:
        return
    group_of = [group for group in opt.param_groups for _ in group["params"]]
    for flat, p in enumerate(params):
        group = group_of[flat]
        state = opt.state.get(p) if _torch_optim.quantizes_state(group) else None
        held = state.get("sum") if state else None
        if not isinstance(held, torch.Tensor) or held.dtype in _CODE_DTYPES or float(state.get("step", 0)) != 0:
            continue
        if not bool((held == group["initial_accumulator_value"]).all()):
            continue
        layout = next((entry[4] for entry in _new_state_entries(cxx, flat, p) if entry[0] == "sum"), None)
        if layout is not None:
            state.update(_torch_optim.quantized_state(p, "sum", layout))


def _step_lock(opt):
    with _step_locks_guard:
        lock = _step_locks.get(opt)
        if lock is None:
            lock = _step_locks[opt] = _StepLock()
        return lock


def _norm_tensor(norm, params):
    """`norm` as clip_grad_norm_ returns it for the grads of `params`: it stacks each grad's norm (in the grad's
    dtype, a grad having its param's) on the first grad's device, so the result has their promoted real dtype there;
    torch.tensor(0.0) for no grads. Over DTensor grads torch's result is a DTensor with a partial placement; optjit has
    the reduced norm already and returns it replicated, the same value for full_tensor(), item() and float()."""
    if not params:
        return torch.tensor(0.0)
    dtype = functools.reduce(torch.promote_types, (p.dtype for p in params))
    dtype = dtype.to_real() if dtype.is_complex else dtype
    if isinstance(norm, torch.Tensor):  # f64 on the device, where the step left it: converted there, no wait
        return norm.to(dtype)
    first = params[0]
    try:
        from torch.distributed.tensor import DTensor, Replicate
    except ImportError:  # a torch built without torch.distributed
        DTensor = None
    if DTensor is not None and isinstance(first, DTensor):
        local = torch.tensor(norm, dtype=dtype, device=first.to_local().device)
        mesh = first.device_mesh
        return DTensor.from_local(local, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return torch.tensor(norm, dtype=dtype, device=first.device)


def _take_over_inf_check(opt, scaler):
    """(grad_scale, found_inf, check_in_step) for a step GradScaler hands itself to (grad_scaler=): what
    GradScaler.step does for a fused optimizer (torch/amp/grad_scaler.py), with the inf check left to the step. After
    scaler.unscale_(opt) the grads are unscaled and checked already: the step reads that found_inf. Otherwise the
    step divides by the scale and fills a found_inf of its own, which scaler.update() reads as this optimizer's."""
    from torch.amp.grad_scaler import OptState

    state = scaler._per_optimizer_states[id(opt)]
    scale = scaler._get_scale_async()
    if state["stage"] is OptState.UNSCALED:
        found = sum(t.to(scale.device, non_blocking=True) for t in state["found_inf_per_device"].values())
        return getattr(opt, "grad_scale", None), found, False
    found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)  # 0-d, as GradScaler's own
    state["found_inf_per_device"][scale.device] = found_inf
    return scale * getattr(opt, "grad_scale", 1), found_inf, True


def _clipping(max_grad_norm, norm_type, error_if_nonfinite):
    """(max_norm or None, norm_type as a float, error_if_nonfinite), checked as clip_grad_norm_ takes them."""
    if isinstance(norm_type, str) and norm_type == "inf":
        norm_type = float("inf")
    if not isinstance(norm_type, (int, float)) or float(norm_type) not in (2.0, float("inf")):
        raise Error(f"norm_type is {norm_type!r}: fused clipping takes 2 or inf (the 2-norm or the largest |grad|)")
    if max_grad_norm is not None:
        if isinstance(max_grad_norm, torch.Tensor):
            if max_grad_norm.numel() != 1:
                raise Error(
                    f"max_grad_norm is a tensor of {max_grad_norm.numel()} elements: clip_grad_norm_ takes one number"
                )
            max_grad_norm = max_grad_norm.item()
        if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float)):
            raise Error(f"max_grad_norm is {max_grad_norm!r}, not a number")
        max_grad_norm = float(max_grad_norm)  # any number, as clip_grad_norm_ takes it (inf only logs the norm)
    return (max_grad_norm, float(norm_type), bool(error_if_nonfinite))


def _unwrapped(opt):
    """The torch optimizer inside a training framework's wrapper: accelerate's AcceleratedOptimizer (.optimizer) and
    Lightning's LightningOptimizer (._optimizer) step the optimizer they wrap, which is what optjit compiles."""
    for cls in type(opt).__mro__:
        if cls.__name__ == "AcceleratedOptimizer" and cls.__module__.startswith("accelerate"):
            return _unwrapped(opt.optimizer)
        if cls.__name__ == "LightningOptimizer" and cls.__module__.startswith(("lightning", "pytorch_lightning")):
            return _unwrapped(opt._optimizer)
    return opt


def _accelerate_wrappers(opt):
    """accelerate's AcceleratedOptimizers wrapping `opt` with a GradScaler: each saved opt.step when it wrapped it and
    puts that method back as opt.step around every scaled step, which would drop a patch made after wrapping."""
    accelerate = sys.modules.get("accelerate.optimizer")
    if accelerate is None:
        return []
    owners = []
    for referrer in gc.get_referrers(opt):  # the wrapper itself, or its __dict__ where it has one
        if isinstance(referrer, dict) and referrer.get("optimizer") is opt:
            owners.extend(gc.get_referrers(referrer))
        else:
            owners.append(referrer)
    return [
        owner
        for owner in owners
        if isinstance(owner, accelerate.AcceleratedOptimizer)
        and getattr(owner, "optimizer", None) is opt
        and getattr(owner, "scaler", None) is not None
    ]


def compile(opt, max_grad_norm=None, norm_type=2.0, error_if_nonfinite=False):
    """opt's step as a compiled callable (compiles on the first call); see CompiledStep. With max_grad_norm, each
    step clips the grads first, exactly as torch.nn.utils.clip_grad_norm_(params, max_grad_norm, norm_type,
    error_if_nonfinite) would, fused into the step. A framework's wrapper (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer) compiles the optimizer it wraps."""
    return CompiledStep(_unwrapped(opt), max_grad_norm, norm_type, error_if_nonfinite)


def patch(
    opt, max_grad_norm=None, norm_type=2.0, error_if_nonfinite=False, fuse_inf_check=False, fuse_unscale=False
):
    """Makes opt.step itself the compiled step, so that loops calling opt.step() (or GradScaler.step(opt)) need no
    change. Returns the CompiledStep; optjit.unpatch(opt) undoes it. max_grad_norm and the rest: as compile.

    A framework's wrapper (accelerate's AcceleratedOptimizer, Lightning's LightningOptimizer) patches the optimizer it
    wraps; an AcceleratedOptimizer with a GradScaler, which puts back the step it saved at wrap time around every
    scaled step, is given the compiled step to put back instead (whether the wrapper or the optimizer is patched).

    fuse_unscale: the patched optimizer claims the contract of torch's fused optimizers (_step_supports_amp_scaling):
    GradScaler.step(opt) hands it opt.grad_scale and opt.found_inf, and the kernel divides the grads, instead of
    GradScaler unscaling them in a pass of its own. Off by default, as for the torch optimizer patched (its fused=True
    claims it): frameworks that clip grads between unscale_ and step refuse fused optimizers (Lightning does).

    fuse_inf_check (implies fuse_unscale): the patched step takes grad_scaler=, so GradScaler.step(opt) hands it the
    whole unscale-and-check and runs no inf-check pass of its own over the grads: the step checks them in its first
    pass (see CompiledStep). torch warns (FutureWarning) that it will stop passing grad_scaler= one day; until then
    this saves a pass.

    Patching a patched optimizer again with the same arguments returns its compiled step; with others (clipping
    turned on, say), it patches it anew with them."""
    opt = _unwrapped(opt)
    fuse_unscale = bool(fuse_unscale or fuse_inf_check)
    arguments = (_clipping(max_grad_norm, norm_type, error_if_nonfinite), bool(fuse_inf_check), fuse_unscale)
    undo = getattr(opt, "_optjit_unpatch", None)
    if undo is not None:
        if undo.arguments == arguments:
            return opt.step.compiled
        undo()
    compiled = CompiledStep(opt, max_grad_norm, norm_type, error_if_nonfinite)
    saved_step = vars(opt).get("step")
    saved_amp = vars(opt).get("_step_supports_amp_scaling")
    had_amp = "_step_supports_amp_scaling" in vars(opt)

    if fuse_inf_check:

        @functools.wraps(type(opt).step)
        def step(closure=None, grad_scaler=None):
            return compiled(closure, grad_scaler)

    else:

        @functools.wraps(type(opt).step)
        def step(closure=None):
            return compiled(closure)

    step.__signature__ = inspect.signature(step, follow_wrapped=False)  # what GradScaler looks for grad_scaler in
    step.compiled = compiled
    step._wrapped_by_lr_sched = True  # LR schedulers see the step they track (compiled steps set _opt_called)
    opt.step = step
    if fuse_unscale:
        # As torch's fused optimizers do, the patched step lets GradScaler hand it the scale (opt.grad_scale) and the
        # inf check (opt.found_inf) instead of unscaling every grad in a pass of its own: the kernel divides.
        opt._step_supports_amp_scaling = True
    wrappers = [
        (w, w._optimizer_original_step_method, w._optimizer_patched_step_method) for w in _accelerate_wrappers(opt)
    ]
    for wrapper, _, _ in wrappers:
        from accelerate.optimizer import patch_optimizer_step

        wrapper._optimizer_original_step_method = step
        wrapper._optimizer_patched_step_method = patch_optimizer_step(wrapper, step)

    def deepcopy_patched(memo):
        """copy.deepcopy(opt): the copy torch makes (its __getstate__ keeps defaults, state and param_groups), patched
        with the same arguments, so that it has the same public attributes and steps compiled too."""
        del opt.__deepcopy__  # torch's own copy, without this hook
        try:
            copied = copy.deepcopy(opt, memo)
        finally:
            opt.__deepcopy__ = deepcopy_patched
        patch(copied, max_grad_norm, norm_type, error_if_nonfinite, fuse_inf_check, fuse_unscale)
        return copied

    opt.__deepcopy__ = deepcopy_patched

    def unpatch_this():
        if saved_step is None:
            del opt.step
        else:
            opt.step = saved_step
        if had_amp:
            opt._step_supports_amp_scaling = saved_amp
        elif "_step_supports_amp_scaling" in vars(opt):
            del opt._step_supports_amp_scaling
        for wrapper, original, patched in wrappers:
            wrapper._optimizer_original_step_method = original
            wrapper._optimizer_patched_step_method = patched
        del opt.__deepcopy__
        del opt._optjit_unpatch

    unpatch_this.arguments = arguments
    opt._optjit_unpatch = unpatch_this
    return compiled


def unpatch(opt):
    """Undoes optjit.patch(opt): opt.step is torch's again."""
    undo = getattr(_unwrapped(opt), "_optjit_unpatch", None)
    if undo is None:
        raise Error("this optimizer is not patched by optjit.patch")
    undo()
