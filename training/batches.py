"""Random fixed-length windows over a uint16 token stream, seeded, on the training device."""

from pathlib import Path

import numpy as np
import torch


def load_stream(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint16)


class WindowSampler:
    """Draws (batch, seq_len) windows uniformly from one or two streams.

    With a second stream, each row comes from it with probability ``second_fraction``
    (the draft mixes target continuations into the corpus this way).
    """

    def __init__(
        self,
        stream: np.ndarray,
        seq_len: int,
        seed: int,
        second: np.ndarray | None = None,
        second_fraction: float = 0.0,
    ):
        self.streams = [torch.from_numpy(stream.astype(np.int64))]
        if second is not None and second.size > seq_len + 1:
            self.streams.append(torch.from_numpy(second.astype(np.int64)))
        self.seq_len = seq_len
        self.second_fraction = second_fraction if len(self.streams) > 1 else 0.0
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """(batch_size, seq_len + 1) int64 token ids."""
        take_second = torch.rand(batch_size, generator=self.generator) < self.second_fraction
        rows = [self._window(int(flag)) for flag in take_second]
        return torch.stack(rows).to(device, non_blocking=True)

    def _window(self, which: int) -> torch.Tensor:
        stream = self.streams[which]
        start = int(
            torch.randint(0, stream.numel() - self.seq_len - 1, (1,), generator=self.generator)
        )
        return stream[start : start + self.seq_len + 1]

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def restore(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
