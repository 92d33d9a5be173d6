"""Float sums in a fixed, documented order, so the search's tables and bounds are reproducible to
the last bit (plain Python: the plan command does not import NumPy, issue 15).

  pairwise_sum: pairwise summation (Higham, "The accuracy of floating point summation", SIAM J.
    Sci. Comput. 1993, §3; error O(ε log n) instead of O(ε n)) in NumPy's blocking, so a sum equals
    `np.sum` of the same float64 vector bit for bit (tested): runs shorter than 8 are added in turn
    from 0.0; runs of 8 to 128 as eight interleaved partial sums combined as ((0+1)+(2+3))+((4+5)+(6+7)),
    then the remainder in turn; longer runs split in two at a multiple of 8 below the middle.
  prefix_sums: running sums left to right (np.cumsum's order).

Python's builtin `sum` is not used on floats: from Python 3.12 it compensates its rounding, so its
result would depend on the interpreter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import reduce
from itertools import accumulate
from operator import add

PAIRWISE_BLOCK = 128  # NumPy's PW_BLOCKSIZE: longer runs are split in halves
UNROLL = 8  # partial sums of a block (NumPy's unrolling)


def prefix_sums(values: Iterable[float]) -> list[float]:
    """[0.0, v0, v0 + v1, ...]: n + 1 running sums, left to right (np.cumsum with a leading 0)."""
    return [0.0, *accumulate(values)]


def pairwise_sum(values: Sequence[float]) -> float:
    """The pairwise sum of `values` in NumPy's order (see the module docstring)."""
    n = len(values)
    if n < UNROLL:
        return reduce(add, values, 0.0)
    if n <= PAIRWISE_BLOCK:
        whole = n - n % UNROLL
        r = [reduce(add, values[j:whole:UNROLL]) for j in range(UNROLL)]
        return reduce(add, values[whole:], ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])))
    half = n // 2
    half -= half % UNROLL
    return pairwise_sum(values[:half]) + pairwise_sum(values[half:])
