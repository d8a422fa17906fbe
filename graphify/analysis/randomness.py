"""Randomness: which calls draw from the host's generators (Python's `random`, numpy's) and which torch
callables draw from torch's."""

import libcst as cst

from graphify.analysis.calls import method_call

HOST_RANDOM = ("random.", "numpy.random.")  # modules whose calls draw from a host generator
# torch factories that draw random numbers (from the host generator, unless given `device=` or `generator=`)
RANDOM_FACTORIES = {"rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson"}
# torch callables and tensor methods that draw from the generator of their tensor's device
DEVICE_RANDOM = {"rand_like", "randn_like", "randint_like", "dropout", "uniform_", "normal_", "bernoulli_"}


def is_host_draw(call: cst.Call, env) -> bool:
    """Python or numpy RNG, or a gym space's `sample()` (`env.action_space.sample()`, numpy underneath)."""
    if (env.qualify(call.func) or "").startswith(HOST_RANDOM):
        return True
    m = method_call(call)
    return m is not None and m[1] == "sample" and isinstance(m[0], cst.Attribute) and m[0].attr.value.endswith("_space")
