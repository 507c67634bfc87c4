# Types of the native scorer (controller/classifier/_ngram.c; docs/classifier.md).
import numpy as np
import numpy.typing as npt

MAX_NGRAM_SIZE: int
PRIME: int
SALT: int
MULTIPLIER: int
SEGMENT_SALT: int

def segment_sums(
    data: bytes,
    weights: memoryview | npt.NDArray[np.float32],
    num_bits: int,
    sizes: tuple[int, ...] | list[int],
    segment: int,
    /,
) -> tuple[tuple[float, ...], int]: ...
def request_probabilities(
    focus: str,
    context: str,
    weights: memoryview | npt.NDArray[np.float32],
    num_bits: int,
    sizes: tuple[int, ...] | list[int],
    length_scale: float,
    w1: memoryview | npt.NDArray[np.float64],
    b1: memoryview | npt.NDArray[np.float64],
    w2: memoryview | npt.NDArray[np.float64],
    b2: memoryview | npt.NDArray[np.float64],
    shape_table: bytes,
    shape_sizes: tuple[int, ...] | list[int],
    word_mode: int = 0,
    /,
) -> list[float] | None: ...
