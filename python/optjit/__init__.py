"""optjit: torch.optim optimizer steps compiled to one kernel per param group, in milliseconds.

    step = optjit.compile(opt)   # a callable: step() == opt.step(), in place on the model's params and opt.state
    optjit.patch(opt)            # or make opt.step itself the compiled step; optjit.unpatch(opt) undoes it
"""

from ._optjit import Error
from ._compiled import CompiledStep, compile, patch, unpatch

__all__ = ["CompiledStep", "Error", "compile", "patch", "unpatch"]
__version__ = "0.1.0"
