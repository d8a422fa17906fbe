"""Put on PYTHONPATH by bench/real/run.py (`shims = ["seaborn"]`) for scripts that import seaborn only to style or draw
plots, which the GPU machine lacks: every function is there and draws nothing (`sns.set()`, `sns.histplot(...)`)."""


def __getattr__(name):
    return lambda *args, **kwargs: None
