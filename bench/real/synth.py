"""Synthetic data in the exact on-disk formats the real-world suite's scripts read.

Each generator takes the folder to fill and its size, writes seeded random content, and does nothing
when the folder already holds it. Sizes are small so a whole run takes seconds, but keep the
scripts' batch arithmetic (MNIST's 60000 and CIFAR's 50000 are multiples of the scripts' batch
sizes; so are the defaults here).
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np


def _done(folder: Path) -> bool:
    return (folder / ".synth-done").exists()


def _mark(folder: Path) -> None:
    (folder / ".synth-done").write_text("")


def mnist(folder: Path, train: int = 6000, test: int = 1000) -> None:
    """torchvision's MNIST raw files (IDX format, uncompressed) under folder/MNIST/raw."""
    raw = folder / "MNIST" / "raw"
    if _done(raw):
        return
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, count in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=count, dtype=np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, count, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, count) + labels.tobytes())
    _mark(raw)


def cifar10(folder: Path, train: int = 5000, test: int = 1000) -> None:
    """torchvision's CIFAR-10 python pickles under folder/cifar-10-batches-py. torchvision checks
    their md5 sums, which random content cannot match: the run's environment points PYTHONPATH at
    bench/real/shim, whose sitecustomize accepts files that exist."""
    base = folder / "cifar-10-batches-py"
    if _done(base):
        return
    base.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def batch(name: str, count: int) -> None:
        data = rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=count).tolist()
        with (base / name).open("wb") as handle:
            pickle.dump({"data": data, "labels": labels}, handle)

    for index in range(1, 6):
        batch(f"data_batch_{index}", train // 5)
    batch("test_batch", test)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with (base / "batches.meta").open("wb") as handle:
        pickle.dump({"label_names": names}, handle)
    _mark(base)


def word_corpus(path: Path, lines: int = 2000, vocabulary: int = 1000) -> None:
    """A text file of sentences over a small vocabulary (Penn Treebank's layout: one sentence a line)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(vocabulary)]
    with path.open("w") as handle:
        for _ in range(lines):
            handle.write(" " + " ".join(words[i] for i in rng.integers(0, vocabulary, size=rng.integers(5, 25))) + " \n")


def image_folder(
    folder: Path, splits: tuple[str, ...] = ("train", "validation"), classes: int = 10, per_class: int = 32, size: int = 64
) -> None:
    """ImageNet's folder layout: folder/<split>/<class>/<image>.jpg."""
    from PIL import Image

    if _done(folder):
        return
    rng = np.random.default_rng(0)
    for split in splits:
        for label in range(classes):
            target = folder / split / f"n{label:08d}"
            target.mkdir(parents=True, exist_ok=True)
            for index in range(per_class):
                pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(target / f"{index:05d}.jpg", quality=90)
    folder.mkdir(parents=True, exist_ok=True)
    _mark(folder)


def timm_checkpoint(path: Path, model: str = "resnet18", num_classes: int = 10) -> None:
    """Randomly initialised weights of a timm model as a checkpoint file (validate.py loads pretrained
    weights, a download, unless given one). Built by the timm pinned beside the script, in path's folder."""
    import subprocess
    import sys

    if path.exists():
        return
    code = (
        "import sys, timm, torch; torch.manual_seed(0); "
        "torch.save(timm.create_model(sys.argv[1], num_classes=int(sys.argv[2])).state_dict(), sys.argv[3])"
    )
    subprocess.run([sys.executable, "-c", code, model, str(num_classes), path.name], cwd=path.parent, check=True)


def pet_images(folder: Path, breeds: int = 10, per_breed: int = 32, size: int = 64) -> None:
    """The Oxford-IIIT Pet layout: one folder of `<breed>_<number>.jpg` files, the label in the name."""
    from PIL import Image

    if _done(folder):
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for breed in range(breeds):
        for index in range(per_breed):
            pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"breed{breed}_{index + 1}.jpg", quality=90)
    _mark(folder)


def hub_weights(folder: Path, model: str = "resnet50d") -> None:
    """Randomly initialised weights of a timm model where `pretrained=True` finds them offline: the
    Hugging Face hub cache layout (HF_HUB_CACHE=folder, HF_HUB_OFFLINE=1) for the model's default
    pretrained tag, asked of the timm the run imports."""
    import subprocess
    import sys

    if _done(folder):
        return
    folder.mkdir(parents=True, exist_ok=True)
    code = """
import sys, pathlib, timm, torch, safetensors.torch
torch.manual_seed(0)
net = timm.create_model(sys.argv[1], pretrained=False)
repo = net.pretrained_cfg["hf_hub_id"].split("@")[0]
snapshot = pathlib.Path(sys.argv[2], "models--" + repo.replace("/", "--"))
(snapshot / "refs").mkdir(parents=True, exist_ok=True)
(snapshot / "refs" / "main").write_text("0" * 40)
files = snapshot / "snapshots" / ("0" * 40)
files.mkdir(parents=True, exist_ok=True)
safetensors.torch.save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(files / "model.safetensors"))
"""
    subprocess.run([sys.executable, "-c", code, model, str(folder)], check=True)
    _mark(folder)


def image_list(path: Path, count: int = 64, size: int = 128) -> None:
    """A JSON list of image file paths (the layout of create_data_lists' train_images.json in the
    super-resolution tutorial): `count` random RGB JPEGs of size x size pixels in a folder beside it."""
    import json

    from PIL import Image

    if path.exists():
        return
    images = path.parent / (path.stem + "_files")
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = []
    for index in range(count):
        target = images / f"{index:05d}.jpg"
        Image.fromarray(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)).save(target, quality=90)
        names.append(str(target.resolve()))
    path.write_text(json.dumps(names))


def paired_images(folder: Path, splits: tuple[str, ...] = ("train", "test"), count: int = 16, size: int = 286) -> None:
    """Aligned image pairs in pix2pix's folder layout: folder/<split>/a/<name>.jpg and folder/<split>/b/<name>.jpg,
    the same names on both sides."""
    from PIL import Image

    if _done(folder):
        return
    rng = np.random.default_rng(0)
    for split in splits:
        for side in ("a", "b"):
            (folder / split / side).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            for side in ("a", "b"):
                pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / split / side / f"{index:05d}.jpg", quality=90)
    _mark(folder)


def empty_folder(folder: Path) -> None:
    """A folder that a script writes into but does not create itself (Cutout's logs/ and checkpoints/)."""
    folder.mkdir(parents=True, exist_ok=True)


def byte_archive(path: Path, size: int = 92_000_000) -> None:
    """A gzip file of `size` bytes of printable text (enwik8's layout: a byte stream that scripts read
    whole and split at 90e6 for validation, so the size must pass that split)."""
    if path.exists():
        return
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    chunk = 4_000_000
    with gzip.open(path, "wb", compresslevel=1) as handle:
        for start in range(0, size, chunk):
            handle.write(rng.integers(32, 127, size=min(chunk, size - start), dtype=np.uint8).tobytes())


def interaction_sequences(path: Path, users: int = 1024, items: int = 2000, shortest: int = 5, longest: int = 40) -> None:
    """A user-item interaction log, one `user item` pair of integers a line, ids from 1, each user's
    items in time order (SASRec's data/<name>.txt layout)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with path.open("w") as handle:
        for user in range(1, users + 1):
            for item in rng.integers(1, items + 1, size=rng.integers(shortest, longest + 1)):
                handle.write(f"{user} {item}\n")


def citation_graph(folder: Path, name: str = "cora", nodes: int = 2708, features: int = 500, classes: int = 7, edges: int = 5429) -> None:
    """A citation network in Cora's planetoid text layout: folder/<name>.content (`<paper id> <0/1
    features...> <class name>` a line) and folder/<name>.cites (`<cited id> <citing id>` a line)."""
    if _done(folder):
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ids = rng.choice(10 * nodes, size=nodes, replace=False) + 1
    bits = (rng.random((nodes, features)) < 0.02).astype(np.uint8)
    labels = rng.integers(0, classes, size=nodes)
    with (folder / f"{name}.content").open("w") as handle:
        for paper, row, label in zip(ids, bits, labels):
            handle.write(f"{paper}\t" + "\t".join(map(str, row)) + f"\tclass_{label}\n")
    pairs = rng.integers(0, nodes, size=(edges, 2))
    with (folder / f"{name}.cites").open("w") as handle:
        for cited, citing in pairs:
            handle.write(f"{ids[cited]}\t{ids[citing]}\n")
    _mark(folder)


def tiktoken_cache(folder: Path, source: str = "") -> None:
    """tiktoken's download cache for the "gpt2" encoding (TIKTOKEN_CACHE_DIR=folder), so that
    get_encoding("gpt2") works offline: the two GPT-2 BPE files a script's own repository carries (a
    run's `support`, under `source`, relative to folder's parent), each stored under the SHA-1 of its
    download address, as tiktoken looks them up (it checks their SHA-256 on load)."""
    import hashlib
    import shutil

    if _done(folder):
        return
    folder.mkdir(parents=True, exist_ok=True)
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for name in ("vocab.bpe", "encoder.json"):
        shutil.copyfile(folder.parent / source / name, folder / hashlib.sha1((base + name).encode()).hexdigest())
    _mark(folder)


def text_csv(folder: Path, splits: tuple[str, ...] = ("train", "validation", "test"), rows: int = 400, classes: int = 2) -> None:
    """Labelled texts as CSV files with `text` and `label` columns, one per split (folder/<split>.csv),
    the layout of the prepared IMDb splits; every split but the first has a fifth of its rows."""
    import csv

    if _done(folder):
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for index, split in enumerate(splits):
        with (folder / f"{split}.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            for _ in range(rows if index == 0 else rows // 5):
                words = rng.integers(0, 1000, size=rng.integers(20, 300))
                writer.writerow([" ".join(f"w{w}" for w in words), int(rng.integers(0, classes))])
    _mark(folder)


def hub_text_model(folder: Path, repo: str = "distilbert-base-uncased", model_type: str = "distilbert") -> None:
    """A randomly initialised Hugging Face text encoder and a WordPiece tokenizer (vocabulary: the
    special tokens and w0..w999, the words of word_corpus/text_csv) where `from_pretrained(repo)` finds
    them offline: the hub cache layout (HF_HUB_CACHE=folder, HF_HUB_OFFLINE=1). Built by the
    transformers the run imports."""
    import subprocess
    import sys

    if _done(folder):
        return
    files = folder / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
    files.mkdir(parents=True, exist_ok=True)
    (files.parent.parent / "refs").mkdir(exist_ok=True)
    (files.parent.parent / "refs" / "main").write_text("0" * 40)
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(1000)]
    (files / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    (files / "tokenizer_config.json").write_text('{"do_lower_case": true, "model_max_length": 512}')
    code = """
import sys, torch, transformers
torch.manual_seed(0)
config = transformers.AutoConfig.for_model(sys.argv[1], vocab_size=int(sys.argv[2]))
transformers.AutoModel.from_config(config).save_pretrained(sys.argv[3])
"""
    subprocess.run([sys.executable, "-c", code, model_type, str(len(vocabulary)), str(files)], check=True)
    _mark(folder)


GENERATORS = {
    "image_list": image_list,
    "empty_folder": empty_folder,
    "paired_images": paired_images,
    "byte_archive": byte_archive,
    "timm_checkpoint": timm_checkpoint,
    "mnist": mnist,
    "cifar10": cifar10,
    "word_corpus": word_corpus,
    "image_folder": image_folder,
    "pet_images": pet_images,
    "hub_weights": hub_weights,
    "interaction_sequences": interaction_sequences,
    "citation_graph": citation_graph,
    "tiktoken_cache": tiktoken_cache,
    "text_csv": text_csv,
    "hub_text_model": hub_text_model,
}
