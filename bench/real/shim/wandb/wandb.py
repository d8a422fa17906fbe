"""Put on PYTHONPATH by bench/real/run.py for scripts that log to Weights & Biases: without an account or
network, `init`, `log`, `config.update`, `watch`, `save`, `Image` and the run's methods do nothing. The dist-info beside
it lets libraries that look up wandb's installed version (accelerate, diffusers) find it."""

from types import SimpleNamespace


def _nothing(*args, **kwargs):
    return None


config = SimpleNamespace(update=_nothing)
run = SimpleNamespace(name=None, log=_nothing, finish=_nothing, config=config)
log = finish = Image = _nothing


def init(*args, **kwargs):
    return run


def watch(*args, **kwargs):  # gradient and parameter histograms
    return None


def save(*args, **kwargs):  # upload a file to the run
    return None
