"""More synthetic data for bench/real/run.py, in formats bench/real/synth.py does not make (run.py looks a
run's `make` up in both). Same conventions: each generator takes the path to fill and its size, writes
seeded random content, and does nothing when the path already holds it."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def _done(folder: Path) -> bool:
    return (folder / ".synth-done").exists()


def _mark(folder: Path) -> None:
    (folder / ".synth-done").write_text("")


def npy_array(path: Path, rows: int = 12000, columns: int = 8) -> None:
    """A float64 matrix saved by numpy.save (the UCI POWER file of the MAF data sets, power/data.npy, is
    such a matrix with 8 columns)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.random.default_rng(0).standard_normal((rows, columns)))


def cifar100(folder: Path, train: int = 1000, test: int = 500) -> None:
    """torchvision's CIFAR-100 python pickles under folder/cifar-100-python (train, test, meta). As for
    CIFAR-10, the run's `cifar_shim` accepts the files without their md5 sums."""
    base = folder / "cifar-100-python"
    if _done(base):
        return
    base.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, count in (("train", train), ("test", test)):
        fine = rng.integers(0, 100, size=count)
        with (base / name).open("wb") as handle:
            pickle.dump(
                {
                    "data": rng.integers(0, 256, size=(count, 3072), dtype=np.uint8),
                    "fine_labels": fine.tolist(),
                    "coarse_labels": (fine // 5).tolist(),
                },
                handle,
            )
    with (base / "meta").open("wb") as handle:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)], "coarse_label_names": [f"s{i}" for i in range(20)]}, handle)
    _mark(base)


def ncf_ratings(folder: Path, dataset: str = "ml-1m", users: int = 300, items: int = 500, per_user: int = 15, negatives: int = 99) -> None:
    """The NCF repository's preprocessed MovieLens files: folder/<dataset>.train.rating (`user<TAB>item<TAB>rating<TAB>time`
    a line) and folder/<dataset>.test.negative (`(user,item)` then `negatives` items the user never rated, tab-separated),
    one held-out item per user."""
    if _done(folder):
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with (folder / f"{dataset}.train.rating").open("w") as train, (folder / f"{dataset}.test.negative").open("w") as test:
        for user in range(users):
            rated = rng.choice(items, size=per_user + 1, replace=False)
            for item in rated[:-1]:
                train.write(f"{user}\t{item}\t5\t978300760\n")
            unrated = np.setdiff1d(np.arange(items), rated)
            test.write(f"({user},{rated[-1]})\t" + "\t".join(map(str, rng.choice(unrated, size=negatives, replace=False))) + "\n")
    _mark(folder)


def urbansound(folder: Path, clips: int = 512, classes: int = 10, folds: int = 10, sample_rate: int = 22050, seconds: float = 1.0) -> None:
    """UrbanSound8K's layout: folder/metadata/UrbanSound8K.csv (slice_file_name, fsID, start, end, salience,
    fold, classID, class) and folder/audio/fold<N>/<slice_file_name>, mono 16-bit PCM WAV files."""
    import csv
    import wave

    if _done(folder):
        return
    rng = np.random.default_rng(0)
    (folder / "metadata").mkdir(parents=True, exist_ok=True)
    length = int(sample_rate * seconds)
    with (folder / "metadata" / "UrbanSound8K.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["slice_file_name", "fsID", "start", "end", "salience", "fold", "classID", "class"])
        for index in range(clips):
            label, fold = int(rng.integers(0, classes)), index % folds + 1
            name = f"{100000 + index}-{label}-0-0.wav"
            target = folder / "audio" / f"fold{fold}"
            target.mkdir(parents=True, exist_ok=True)
            samples = rng.integers(-8000, 8000, size=int(length * rng.uniform(0.6, 1.2)), dtype=np.int16)
            with wave.open(str(target / name), "wb") as audio:
                audio.setnchannels(1)
                audio.setsampwidth(2)
                audio.setframerate(sample_rate)
                audio.writeframes(samples.tobytes())
            writer.writerow([name, 100000 + index, 0.0, len(samples) / sample_rate, 1, fold, label, f"class{label}"])
    _mark(folder)


def empty_checkpoint(path: Path) -> None:
    """A checkpoint holding an empty state dict, for a script that loads pretrained weights with
    `load_state_dict(..., strict=False)`: its network keeps its random initialisation."""
    import torch

    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({}, path)


GENERATORS = {
    "npy_array": npy_array,
    "cifar100": cifar100,
    "ncf_ratings": ncf_ratings,
    "urbansound": urbansound,
    "empty_checkpoint": empty_checkpoint,
}


def ogbg_raw(folder: Path, graphs: int = 800, nodes: tuple[int, int] = (10, 30), tasks: int = 1) -> None:
    """An OGB graph-property data set as its download unpacks (what PygGraphPropPredDataset processes itself,
    folder = dataset/<name with _>): raw/{edge,node-feat,edge-feat,num-node-list,num-edge-list,graph-label}.csv.gz with
    molecule-like graphs (a chain with random extra bonds; atom and bond features within the ranges of
    ogb.utils.features, binary labels), split/scaffold/{train,valid,test}.csv.gz (80/10/10) and RELEASE_v1.txt."""
    import gzip

    if _done(folder):
        return
    rng = np.random.default_rng(0)
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    (folder / "split" / "scaffold").mkdir(parents=True, exist_ok=True)
    atom_ranges, bond_ranges = [119, 4, 11, 11, 9, 5, 5, 2, 2], [4, 5, 2]
    edges, node_feat, edge_feat, node_counts, edge_counts = [], [], [], [], []
    for _ in range(graphs):
        n = int(rng.integers(nodes[0], nodes[1] + 1))
        pairs = [(i, i + 1) for i in range(n - 1)] + [tuple(sorted(rng.choice(n, 2, replace=False))) for _ in range(n // 4)]
        edges += pairs
        node_feat += [[int(rng.integers(0, r)) for r in atom_ranges] for _ in range(n)]
        edge_feat += [[int(rng.integers(0, r)) for r in bond_ranges] for _ in pairs]
        node_counts.append(n)
        edge_counts.append(len(pairs))

    def write(name: str, rows) -> None:
        with gzip.open(folder / name, "wt") as handle:
            handle.writelines(",".join(map(str, row if isinstance(row, (list, tuple)) else [row])) + "\n" for row in rows)

    write("raw/edge.csv.gz", edges)
    write("raw/node-feat.csv.gz", node_feat)
    write("raw/edge-feat.csv.gz", edge_feat)
    write("raw/num-node-list.csv.gz", node_counts)
    write("raw/num-edge-list.csv.gz", edge_counts)
    write("raw/graph-label.csv.gz", rng.integers(0, 2, size=(graphs, tasks)).tolist())
    order = rng.permutation(graphs)
    train, valid = int(0.8 * graphs), int(0.9 * graphs)
    write("split/scaffold/train.csv.gz", sorted(order[:train]))
    write("split/scaffold/valid.csv.gz", sorted(order[train:valid]))
    write("split/scaffold/test.csv.gz", sorted(order[valid:]))
    (folder / "RELEASE_v1.txt").write_text("")
    _mark(folder)


GENERATORS["ogbg_raw"] = ogbg_raw
