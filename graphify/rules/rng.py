"""rng: random-number state handled on the host."""

from graphify.analysis.checker import code_of, kwarg
from graphify.rules.registry import rule

RESEED = rule(
    "GFY601", "rng-state-in-step", "rng", "error", "seeding, or reading/setting RNG state inside the step, is not replayed", False
)
GENERATOR = rule(
    "GFY602",
    "custom-generator-in-step",
    "rng",
    "error",
    "random ops on a custom `torch.Generator` need it registered with the graph",
    False,
)

RULES = (RESEED, GENERATOR)


_STATE = {
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "get_rng_state",
    "set_rng_state",
    "fork_rng",
    "get_rng_state_all",
    "set_rng_state_all",
}


def check(ck):
    for call, site in ck.calls():
        qual = site.env.qualify(call.func) or ""
        if not qual.startswith("torch."):
            continue
        last = qual.rsplit(".", 1)[-1]
        if last in _STATE or last == "Generator":
            yield ck.finding(
                RESEED,
                call,
                site,
                f"`{code_of(call)}` touches RNG state inside the step",
                "seed once before the loop; for per-step generators register them with `graph.register_generator_state`",
            )
        elif kwarg(call, "generator") is not None:
            yield ck.finding(
                GENERATOR,
                call,
                site,
                f"`{code_of(call)}` draws from a custom generator",
                "use the default CUDA generator, or register the generator with `graph.register_generator_state(gen)` before capture",
            )
