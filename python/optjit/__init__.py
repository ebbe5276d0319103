"""optjit: torch.optim optimizer steps compiled to one kernel per param group, in milliseconds.

    step = optjit.compile(opt)   # a callable: step() == opt.step(), in place on the model's params and opt.state
    optjit.patch(opt)            # or make opt.step itself the compiled step; optjit.unpatch(opt) undoes it
    @optjit.step_function        # a step written with torch._foreach_* calls, compiled (optjit._step_function)
"""

from ._optjit import Error
from ._compiled import CompiledStep, compile, patch, unpatch
from ._step_function import StepFunction, step_function

__all__ = ["CompiledStep", "Error", "StepFunction", "compile", "patch", "step_function", "unpatch"]
__version__ = "0.1.0"
