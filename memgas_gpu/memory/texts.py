"""A packed table of strings (UTF-8 bytes + offsets), storable in safetensors."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import Tensor

__all__ = ["TextTable"]


class TextTable:
    """Strings ``0..n-1`` as one ``uint8`` byte tensor and ``[n + 1]`` int64 offsets."""

    def __init__(self, data: Tensor, offsets: Tensor) -> None:
        self.data = data
        self.offsets = offsets

    @classmethod
    def from_strings(cls, texts: Iterable[str]) -> "TextTable":
        enc = [t.encode("utf-8", "surrogatepass") for t in texts]
        data = torch.frombuffer(bytearray(b"".join(enc) or b"\0"), dtype=torch.uint8).clone()
        off = torch.tensor([0] + [len(e) for e in enc], dtype=torch.int64).cumsum(0)
        return cls(data, off)

    def __len__(self) -> int:
        return int(self.offsets.numel()) - 1

    def __getitem__(self, i: int) -> str:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return bytes(self.data[a:b].numpy()).decode("utf-8", "surrogatepass")

    def strings(self, ids: Sequence[int]) -> list[str]:
        return [self[int(i)] for i in ids]

    def take(self, ids: Tensor) -> "TextTable":
        """Strings ``ids`` (in that order) as a new table (bytes gathered, not decoded)."""
        ids = torch.as_tensor(ids, dtype=torch.int64)
        a, b = self.offsets[ids], self.offsets[ids + 1]
        lens = b - a
        off = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
        if int(off[-1]) == 0:
            return TextTable(torch.zeros(1, dtype=torch.uint8), off)
        owner = torch.repeat_interleave(torch.arange(ids.numel()), lens)
        src = a[owner] + torch.arange(int(off[-1])) - off[:-1][owner]
        return TextTable(self.data[src], off)
