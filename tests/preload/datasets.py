"""Module-level datasets for the preloader tests (importable, so spawned workers find them).

nebulgym's README dataset (``../shared/seeds/001_*.txt``) is here twice: `CustomDataset`
exactly as the README wrote it, only the import changed to ``from dualtrain import
patch_dataset``, and `PlainCustomDataset`, the same body undecorated, to compare with.
`make_images`, `read_image` and `label_of` are its `img_paths`, `reading_func` and
`labelling_func`: small PNG or JPEG files decoded into torch tensors. `Recording` is a
dataset that records the order its items are loaded in. `same_item` compares two items by
type and value, through containers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, List  # noqa: UP035 (List: the README's own spelling)

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from dualtrain import accelerate_dataset
from dualtrain.preload.decorators import patch_dataset  # nebulgym's name, at its home


def picture(i: int, size: tuple[int, int] = (12, 16)) -> np.ndarray:
    """A uint8 RGB picture, different for every `i`, smooth enough for JPEG."""
    height, width = size
    yy, xx = np.mgrid[0:height, 0:width]
    planes = [(xx * (i % 5 + 2) + yy * (c + 1) * 3 + 23 * i) % 256 for c in range(3)]
    return np.stack(planes, -1).astype(np.uint8)


def make_images(folder: str | os.PathLike[str], n: int, fmt: str = "png") -> list[str]:
    """Writes `n` pictures ``<label>_<i>.<fmt>`` (label ``i % 3``) in `folder`; their paths."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(n):
        path = os.path.join(folder, f"{i % 3}_{i}.{fmt}")
        Image.fromarray(picture(i)).save(path)
        paths.append(path)
    return paths


def read_image(path: str) -> torch.Tensor:
    """The README's `reading_func`: the decoded picture, float32 (3, H, W) in [0, 1]."""
    with Image.open(path) as im:
        pixels = np.asarray(im.convert("RGB"))
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).float() / 255


def label_of(path: str) -> int:
    """The README's `labelling_func`: the label written in the file's name."""
    return int(os.path.basename(path).partition("_")[0])


# nebulgym's README dataset, as written (seed 001), with dualtrain's import.
@patch_dataset(preloaded_data=20, max_memory_size=None)
class CustomDataset(Dataset):
    def __init__(self, img_paths: List[str], labelling_func: Callable, reading_func: Callable):  # noqa: UP006
        self._images = img_paths
        self._labelling_func = labelling_func
        self._reading_func = reading_func

    def __getitem__(self, item):
        img_path = self._images[item]
        label = self._labelling_func(img_path)
        input_tensor = self._reading_func(img_path)
        return input_tensor, label

    def __len__(self):
        return len(self._images)


class PlainCustomDataset(Dataset):
    """The README's dataset undecorated: what the decorated ones must serve."""

    def __init__(self, img_paths: list[str], labelling_func: Callable, reading_func: Callable):
        self._images = img_paths
        self._labelling_func = labelling_func
        self._reading_func = reading_func

    def __getitem__(self, item: int) -> tuple[torch.Tensor, int]:
        img_path = self._images[item]
        return self._reading_func(img_path), self._labelling_func(img_path)

    def __len__(self) -> int:
        return len(self._images)


@accelerate_dataset()
class CalledDataset(PlainCustomDataset):
    """The README's dataset under ``@accelerate_dataset()`` (the decorator changes only this
    subclass, not `PlainCustomDataset`)."""


@accelerate_dataset
class BareDataset(PlainCustomDataset):
    """The README's dataset under bare ``@accelerate_dataset``."""


class Recording(Dataset):
    """Items ``torch.full(shape, i)``; `loads` records each index loaded, in order.

    Indices out of [-n, n) raise IndexError, as a list does.
    """

    def __init__(self, n: int, shape: tuple[int, ...] = (4,)) -> None:
        self.n, self.shape = n, shape
        self.loads: list[Any] = []
        self._lock = threading.Lock()

    def __getitem__(self, index: Any) -> torch.Tensor:
        with self._lock:  # loader threads record too
            self.loads.append(index)
        if not -self.n <= index < self.n:
            raise IndexError(f"index {index} is out of range for {self.n} items")
        return torch.full(self.shape, float(index % self.n))

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:
        return {"n": self.n, "shape": self.shape, "loads": list(self.loads)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def same_item(a: Any, b: Any) -> bool:
    """`a` and `b` have the same types and values, through lists, tuples and dicts.

    Arrays and tensors compare dtype, shape and bits (so NaN equals NaN); Pillow images
    mode, size and pixels; JAX arrays dtype and bits.
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and _same_bits(a, b)
    if isinstance(a, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.requires_grad == b.requires_grad
            and torch.equal(_tensor_bits(a), _tensor_bits(b))
        )
    if isinstance(a, Image.Image):
        return a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()
    if type(a).__module__.partition(".")[0] in ("jax", "jaxlib"):
        return a.dtype == b.dtype and _same_bits(np.asarray(a), np.asarray(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_item(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_item(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    return bytes(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) == bytes(
        np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    )


def _tensor_bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)
