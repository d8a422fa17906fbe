"""What the rng rules share: which torch calls touch the random-number state."""

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


def torch_call(call, site) -> str | None:
    """The last part of a `torch.` function's qualified name (None for any other call)."""
    qual = site.env.qualify(call.func) or ""
    return qual.rsplit(".", 1)[-1] if qual.startswith("torch.") else None


def touches_state(last: str) -> bool:
    """`torch.manual_seed`, `torch.cuda.get_rng_state`, `torch.Generator`..."""
    return last in _STATE or last == "Generator"
