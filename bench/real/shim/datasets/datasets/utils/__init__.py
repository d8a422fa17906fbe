from . import logging

__all__ = ["logging"]
