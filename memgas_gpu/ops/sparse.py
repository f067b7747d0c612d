"""Sparse-matrix plumbing shared by the ops: torch's sparse CSR warnings silenced in one
place, and the structure check of a CSR graph that every path runs before reading
through it.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator, Optional

import torch
from torch import Tensor

__all__ = ["quiet_sparse_warnings", "check_csr"]


@contextlib.contextmanager
def quiet_sparse_warnings() -> Iterator[None]:
    """Silence torch's notices about sparse CSR tensors inside the block: "Sparse CSR
    tensor support is in beta state" (and the one for BSR/CSC) and "Sparse invariant
    checks are implicitly disabled". Use it only around structures that were built by
    the package or checked (:func:`check_csr`); other warnings still show.

    Example::

        with quiet_sparse_warnings():
            A = torch.sparse_csr_tensor(indptr, indices, values, size=(n, n))
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Sparse \w+ tensor support is in beta",
                                category=UserWarning)
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly",
                                category=UserWarning)
        yield


def check_csr(indptr: Tensor, indices: Tensor, n_cols: int, name: str = "graph") -> None:
    """Raise ValueError unless ``(indptr, indices)`` is a well-formed CSR structure.

    Checked on the values as given (int32 or int64), before any narrowing:
    ``indptr[0] == 0``, ``indptr`` non-decreasing, ``indptr[-1] == len(indices)`` and
    every column in ``[0, n_cols)``. One host synchronisation.

    Args:
        indptr: ``[n + 1]`` integer row pointers.
        indices: ``[nnz]`` integer column indices.
        n_cols: number of columns (nodes).
        name: what the structure is, for the message.
    """
    for what, t in (("indptr", indptr), ("indices", indices)):
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name}: {what} must be an integer tensor, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name}: {what} must be 1-D, got shape {tuple(t.shape)}")
    if indptr.numel() == 0:
        raise ValueError(f"{name}: indptr must have n + 1 >= 1 entries")
    ip = indptr.to(torch.int64)
    facts = [ip[0], ip[-1]]
    facts.append((ip[1:] < ip[:-1]).any().to(torch.int64) if ip.numel() > 1
                 else ip.new_zeros(()))
    if indices.numel():
        lo, hi = torch.aminmax(indices)
        facts += [lo.to(torch.int64), hi.to(torch.int64)]
    first, last, decreasing, *span = torch.stack(facts).tolist()
    if first != 0:
        raise ValueError(f"{name}: indptr[0] must be 0, got {first}")
    if decreasing:
        raise ValueError(f"{name}: indptr decreases")
    if last != indices.numel():
        raise ValueError(f"{name}: indptr[-1] = {last} but indices has {indices.numel()} "
                         "entries")
    if span and (span[0] < 0 or span[1] >= n_cols):
        bad: Optional[int] = span[0] if span[0] < 0 else span[1]
        raise ValueError(f"{name}: column index {bad} out of range [0, {n_cols})")
