"""`graphify rewrite`: turn eligible loops into warmup -> static buffers -> capture -> replay.

The names below load the rewriter (and libcst) on first use, so that the command line stays quick.
"""

_API = ("rewrite_source", "RewriteResult", "LoopOutcome")


def __getattr__(name):
    if name in _API:
        from graphify.rewrite import api

        return getattr(api, name)
    raise AttributeError(f"module 'graphify.rewrite' has no attribute {name!r}")


__all__ = list(_API)
