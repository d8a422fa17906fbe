"""Put on PYTHONPATH by bench/real/run.py (`shims = ["openml"]`) for scripts that download a table from
OpenML (`openml.datasets.get_dataset(id).get_data(...)`), which needs the network: this stand-in hands
back a seeded synthetic table of the same shape of answer, with no network.

The table for an id has 5000 rows, 4 categorical columns (pandas `category` dtype, 3 to 12 levels), 6
continuous ones and a binary target column `class` (its values "yes"/"no"); no missing values."""

from . import datasets

__all__ = ["datasets"]
