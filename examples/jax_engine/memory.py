"""The page allocator and the host copy of the page table.

Pages, not slots, are allocated: a request's position ``p`` lives in slot
``page * page_size + p % page_size`` of the page it got when it reached ``p``.
Page 0 (and with it slot 0, the padding slot) is never handed out.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PageAllocator", "RowAllocator"]


class PageAllocator:
    """LIFO free list of pages ``1 .. num_pages - 1``, with the owner of each page.

    LIFO order hands a page that was just freed to the next request at once, which
    is what makes a use-after-free visible quickly (in an engine, and in the canary).

    Parameters
    ----------
    num_pages : int
        Pages of the pool, page 0 included.
    """

    def __init__(self, num_pages: int):
        self.owner = np.zeros(num_pages, dtype=np.int64)  # request id per page, 0 = free
        self._free = list(range(num_pages - 1, 0, -1))  # pop() hands out 1, 2, 3 ...
        #: Fault hook: ``(page, owner)``: the next request other than ``owner`` to allocate gets
        #: ``page`` although ``owner`` still uses it (a premature free followed by reuse).
        self.hand_over: tuple[int, int] | None = None

    @property
    def available(self) -> int:
        return len(self._free)

    def alloc(self, owner: int) -> int:
        """A page for request ``owner`` (a positive id)."""
        if self.hand_over is not None and self.hand_over[1] != owner:
            page, self.hand_over = self.hand_over[0], None
        else:
            page = self._free.pop()
        self.owner[page] = owner
        return page

    def free(self, pages: list[int], owner: int) -> None:
        """Return the pages ``owner`` still holds (a page handed over meanwhile stays with its new owner)."""
        for page in pages:
            if self.owner[page] == owner:
                self.owner[page] = 0
                self._free.append(page)


class RowAllocator:
    """``req_to_token`` rows ``1 .. rows - 1`` (row 0 is the padding row, all zeros)."""

    def __init__(self, rows: int):
        self._free = list(range(rows - 1, 0, -1))

    @property
    def available(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        return self._free.pop()

    def free(self, row: int) -> None:
        self._free.append(row)
