"""graphify's runtime: replays a rewritten loop's step from CUDA graphs, or runs it eagerly.

A rewritten file imports `CapturedStep` (whole step) or `GraphedModule` (a model's forward and
backward) from here. This module imports only torch and the standard library.

What the source cannot tell is decided on the first calls, from the objects the step really uses
(its closure, the globals it names and their attributes): which optimizers it steps and whether they
can read a tensor learning rate, whether a model is wrapped for distributed training, which modes its
modules are in. Whatever cannot be captured runs eagerly, with one warning naming the cause; a training
run is never stopped by the runtime. A loop that is entered again (a `train()` called once per epoch)
finds the graphs it captured before, as long as the step still refers to the same objects.
"""

from graphify.runtime.captured_step import CapturedStep
from graphify.runtime.common import GraphifyFallbackWarning, copy_outputs
from graphify.runtime.deferred import DeferredReads
from graphify.runtime.distributed import build_on_capture_stream
from graphify.runtime.graphed_module import GraphedModule

__version__ = "7"

__all__ = [
    "CapturedStep",
    "DeferredReads",
    "GraphedModule",
    "GraphifyFallbackWarning",
    "build_on_capture_stream",
    "copy_outputs",
    "__version__",
]
