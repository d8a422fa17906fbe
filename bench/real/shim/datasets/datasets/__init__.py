"""Put on PYTHONPATH by bench/real/run.py for scripts that read an image folder through Hugging Face
`datasets` (`load_dataset("imagefolder", data_dir=...)`), which the GPU machine lacks: the files of the
folder, sorted, as rows {"image": PIL image, "label": class folder index}, with `set_transform` applied
to one-row batches as `datasets` applies it."""

from pathlib import Path

from . import utils

__all__ = ["load_dataset", "utils"]

_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


class ImageFolder:
    def __init__(self, files: list[Path], classes: list[str]):
        self._files = files
        self._classes = classes
        self._transform = None

    def __len__(self) -> int:
        return len(self._files)

    def set_transform(self, transform) -> None:
        self._transform = transform

    def __getitem__(self, index: int) -> dict:
        from PIL import Image

        path = self._files[index]
        row = {"image": Image.open(path), "label": self._classes.index(path.parent.name)}
        if self._transform is None:
            return row
        return {key: values[0] for key, values in self._transform({k: [v] for k, v in row.items()}).items()}


def load_dataset(name: str, data_dir: str | None = None, split: str | None = None, **kwargs) -> ImageFolder:
    if name != "imagefolder" or data_dir is None:
        raise NotImplementedError(f"the datasets stand-in reads local image folders only, not {name!r}")
    files = sorted(p for p in Path(data_dir).rglob("*") if p.suffix.lower() in _IMAGE_SUFFIXES)
    return ImageFolder(files, sorted({p.parent.name for p in files}))
