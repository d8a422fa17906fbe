"""openml.datasets.get_dataset (see the package's docstring)."""

import numpy as np
import pandas as pd

ROWS, CATEGORICAL, CONTINUOUS = 5000, 4, 6


class SyntheticDataset:
    default_target_attribute = "class"

    def __init__(self, dataset_id):
        self.dataset_id = dataset_id
        self.name = f"synthetic-{dataset_id}"

    def get_data(self, dataset_format="dataframe", target=None, **kwargs):
        rng = np.random.default_rng(int(self.dataset_id))
        columns = {}
        for index in range(CATEGORICAL):
            levels = [f"v{level}" for level in range(int(rng.integers(3, 13)))]
            columns[f"cat{index}"] = pd.Categorical(rng.choice(levels, size=ROWS), categories=levels)
        for index in range(CONTINUOUS):
            columns[f"num{index}"] = rng.standard_normal(ROWS) * (index + 1) + index
        frame = pd.DataFrame(columns)
        score = frame["num0"] + (frame["cat0"].cat.codes % 2) + 0.5 * rng.standard_normal(ROWS)
        labels = pd.Series(np.where(score > score.median(), "yes", "no"), name=self.default_target_attribute, dtype="category")
        indicator = [True] * CATEGORICAL + [False] * CONTINUOUS
        names = list(frame.columns)
        if target is None:
            return (
                frame.assign(**{self.default_target_attribute: labels}),
                None,
                indicator + [True],
                names + [self.default_target_attribute],
            )
        return frame, labels, indicator, names


def get_dataset(dataset_id, *args, **kwargs):
    return SyntheticDataset(dataset_id)
