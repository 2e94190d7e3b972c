"""The training prompts in a seeded, resumable order, split across processes."""
from __future__ import annotations

from typing import Sequence

import torch

from mmrl.core.seeds import derived_seed


class PromptStream:
    """Prompts in a seeded order, reshuffled every epoch; process p of P reads global indices p, p+P, p+2P, ...

    `position` counts the prompts this process has consumed, so the stream is resumable. With one process of
    batch 2B or two processes of batch B the same global prompts are used.
    """

    def __init__(self, rows: Sequence[dict], seed: int, rank: int = 0, world: int = 1, position: int = 0):
        if len(rows) == 0:
            raise ValueError("the prompt dataset is empty")
        self.rows, self.seed, self.rank, self.world, self.position = list(rows), seed, rank, world, position
        self._perm_epoch, self._perm = -1, None

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(derived_seed(self.seed, "data", epoch))
            self._perm, self._perm_epoch = torch.randperm(len(self.rows), generator=g), epoch
        return self._perm

    def take(self, k: int) -> list[tuple[int, dict]]:
        """The next k (global index, row) pairs of this process."""
        out = []
        for _ in range(k):
            g = self.rank + self.position * self.world
            epoch, i = divmod(g, len(self.rows))
            out.append((g, self.rows[int(self._order(epoch)[i])]))
            self.position += 1
        return out
