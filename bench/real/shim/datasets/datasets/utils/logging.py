"""`datasets.utils.logging`'s verbosity switches, which the stand-in has nothing to apply to."""


def _nothing() -> None:
    return None


set_verbosity_warning = set_verbosity_error = set_verbosity_info = _nothing
