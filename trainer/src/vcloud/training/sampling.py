"""Data order as a pure function of (seed, epoch), resumable at any batch.

Exact resume needs the rest of an interrupted epoch to see exactly the batches the uninterrupted
run would have seen. ``DistributedSampler`` already derives each epoch's permutation from
``seed + epoch`` alone (no generator state carried between epochs) and deals it out to ranks;
:class:`ResumableSampler` adds a starting offset so a resumed epoch skips the batches it already
trained on without loading them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sized

from torch.utils.data import Dataset, DistributedSampler, Sampler


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` whose epoch can start after ``batches_done`` batches.

    Works without a process group (``world_size=1, rank=0``). Incomplete trailing batches are
    dropped per rank (``drop_last``) so every step has the same batch size on every rank.
    """

    def __init__(self, dataset: Dataset, *, batch_size: int, seed: int, world_size: int = 1, rank: int = 0,
                 shuffle: bool = True) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=True)
        self.batch_size = batch_size
        self._skip = 0

    @property
    def batches_per_epoch(self) -> int:
        """Optimizer steps in one full epoch (same on every rank)."""
        return super().__len__() // self.batch_size

    def set_position(self, epoch: int, batches_done: int = 0) -> None:
        """Make the next iteration yield epoch ``epoch`` from batch ``batches_done`` on."""
        if not 0 <= batches_done <= self.batches_per_epoch:
            raise ValueError(
                f"cannot resume at batch {batches_done} of an epoch with {self.batches_per_epoch} batches "
                "(dataset, batch size or world size changed since the checkpoint?)"
            )
        self.set_epoch(epoch)
        self._skip = batches_done * self.batch_size

    def __iter__(self) -> Iterator[int]:
        end = self.batches_per_epoch * self.batch_size
        return itertools.islice(super().__iter__(), self._skip, end)

    def __len__(self) -> int:
        return self.batches_per_epoch * self.batch_size - self._skip


class ShardSampler(Sampler[int]):
    """Evaluation split over ranks without padding or duplicates: rank r gets r, r+W, r+2W, ..."""

    def __init__(self, dataset: Sized, *, world_size: int = 1, rank: int = 0) -> None:
        self.indices = list(range(rank, len(dataset), world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
