"""Compact per-request columns, filled while streaming, and prefix-reuse tracking.

Parsers append plain integers to `array` columns (no per-request objects); every
`FLUSH_ROWS` rows the builder turns them into numpy arrays, checks arrival order and runs the
prefix tracker on the whole chunk at once. Memory is a few int64 per request plus, for prefix
information, one int32 per distinct block id.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from tuning.workload.errors import TraceError

FLUSH_ROWS = 16_384
# Block ids below this are used directly as indices of the first-use table (4 bytes each, so at
# most 128 MiB); larger (sparse, hashed) ids are renumbered through a dict (see _sparse_from).
_DENSE_ID_LIMIT = 1 << 25
# ... and below this many per id read so far (at least _MIN_DIRECT_IDS): a dense trace numbers
# its blocks in order of first use, so its ids stay under it, while one id of 2**25 - 1 in a
# 300-byte file does not buy a table of 2**25 entries.
_DIRECT_IDS_PER_ID_READ = 8
_MIN_DIRECT_IDS = 1 << 16
_UNSEEN = np.iinfo(np.int32).max


@dataclass(frozen=True, eq=False)
class RequestColumns:
    """One entry per (successful) request, in arrival order. Numbers only, never text."""

    # int64 arrival times in the source's clock, ns (Unix epoch for absolute formats, trace
    # start for Mooncake/BurstGPT's relative times)
    arrival_ns: np.ndarray = field(repr=False)
    input_tokens: np.ndarray = field(repr=False)  # int64
    output_tokens: np.ndarray = field(repr=False)  # int64
    # int64, prompt tokens covered by the longest prefix of blocks seen in earlier requests
    # (unbounded cache); None when the source carries no prefix information.
    prefix_hit_tokens: np.ndarray | None = field(repr=False)
    # int64, prompt tokens the block ids describe. Equal to input_tokens except for logs whose
    # token counts were reported by the source while the blocks came from our tokenizer.
    prefix_tokens: np.ndarray | None = field(repr=False)

    @property
    def num_requests(self) -> int:
        return int(self.arrival_ns.shape[0])

    @property
    def arrival_s(self) -> np.ndarray:
        """float64 seconds since the first arrival."""
        if self.arrival_ns.size == 0:
            return np.zeros(0, dtype=np.float64)
        return (self.arrival_ns - self.arrival_ns[0]).astype(np.float64) / 1e9


@dataclass(frozen=True, eq=False)
class BlockStructure:
    """Prompt block ids of every request (kept only on request, for synthesis).

    `ids[offsets[i]:offsets[i + 1]]` are request i's blocks, renumbered densely (0, 1, ...) in
    order of first use; equal ids at the same position mean a shared prefix.
    """

    block_size_tokens: int
    ids: np.ndarray = field(repr=False)  # int64
    offsets: np.ndarray = field(repr=False)  # int64, num_requests + 1


@dataclass(frozen=True)
class ReuseCurve:
    """Prefix-cache hit ratio (share of prompt tokens) against LRU cache size, in blocks."""

    block_size_tokens: int
    cache_size_blocks: tuple[int, ...]
    hit_ratio: tuple[float, ...]
    num_requests_used: int  # the curve covers the first this-many requests of the trace
    num_requests_total: int


class PrefixTracker:
    """Longest already-seen prefix per request, with an unbounded cache, chunk by chunk.

    Block ids follow the Mooncake convention: an id names a block *and* everything before it
    (ids are prefix hashes), so "the prefix of blocks already seen" is "the leading blocks whose
    ids occurred in an earlier request". A repeated id inside one request does not count.
    """

    def __init__(self, *, block_size_tokens: int, curve_max_blocks: int, keep_blocks: bool) -> None:
        self.block_size_tokens = block_size_tokens
        self.num_requests = 0
        self.hit_tokens_total = 0
        self.prompt_tokens_total = 0
        self._first_use = np.full(0, _UNSEEN, dtype=np.int32)
        self._sparse: dict[int, int] | None = None
        # Ids from this one up go through `_sparse`: a budget that grows with the ids read until
        # the first sparse id arrives, then the table's size at that moment, fixed.
        self._sparse_from = _MIN_DIRECT_IDS
        self._ids_read = 0
        self._curve_max_blocks = curve_max_blocks
        self._curve_blocks = 0
        self._curve_full = curve_max_blocks <= 0
        self._curve_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._keep = keep_blocks
        self._kept_ids: list[np.ndarray] = []
        self._kept_counts: list[np.ndarray] = []
        self._renumber = np.full(0, -1, dtype=np.int64)
        self._next_dense = 0

    def _densify(self, ids: np.ndarray) -> np.ndarray:
        if self._sparse is None:
            self._ids_read += ids.shape[0]
            budget = max(_MIN_DIRECT_IDS, _DIRECT_IDS_PER_ID_READ * self._ids_read)
            self._sparse_from = min(_DENSE_ID_LIMIT, budget)
        large = ids >= self._sparse_from
        if self._sparse is None and not large.any():
            return ids
        if self._sparse is None:
            self._sparse = {}
            # Above every id used directly so far, this chunk's included.
            small = ids[~large]
            self._sparse_from = max(self._first_use.shape[0], int(small.max()) + 1 if small.size else 0)
            large = ids >= self._sparse_from
        table = self._sparse
        base = self._sparse_from
        out = ids.copy()
        out[large] = [table.setdefault(x, base + len(table)) for x in ids[large].tolist()]
        return out

    def add_chunk(
        self, ids: np.ndarray, counts: np.ndarray, prompt_tokens: np.ndarray, line_no: np.ndarray
    ) -> np.ndarray:
        """Covered prompt tokens for each request of the chunk (int64)."""
        num = counts.shape[0]
        if ids.size and int(ids.min()) < 0:
            pos = int(np.argmax(ids < 0))
            row = int(np.searchsorted(np.cumsum(counts), pos, side="right"))
            raise TraceError(int(line_no[row]), "`hash_ids` must be non-negative integers")
        ids = self._densify(ids)
        if ids.size:
            top = int(ids.max())
            if top >= self._first_use.shape[0]:
                grown = max(top + 1, 2 * self._first_use.shape[0])
                extra = np.full(grown - self._first_use.shape[0], _UNSEEN, dtype=np.int32)
                self._first_use = np.concatenate([self._first_use, extra])
        starts = np.zeros(num, dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        request = np.arange(self.num_requests, self.num_requests + num, dtype=np.int32)
        request_of_block = np.repeat(request, counts)
        np.minimum.at(self._first_use, ids, request_of_block)
        seen = self._first_use[ids] < request_of_block
        # Position of the first unseen block in each request (its length when all are seen).
        position = np.arange(ids.shape[0], dtype=np.int64) - np.repeat(starts, counts)
        first_unseen = np.where(seen, np.repeat(counts, counts), position)
        leading = np.zeros(num, dtype=np.int64)
        nonempty = counts > 0
        if ids.size:
            leading[nonempty] = np.minimum.reduceat(first_unseen, starts[nonempty])
        covered = np.minimum(leading * self.block_size_tokens, prompt_tokens)
        self.hit_tokens_total += int(covered.sum())
        self.prompt_tokens_total += int(prompt_tokens.sum())
        self.num_requests += num
        if not self._curve_full:
            self._collect_for_curve(ids, counts, prompt_tokens)
        if self._keep:
            self._kept_ids.append(self._renumber_dense(ids))
            self._kept_counts.append(counts.copy())
        return covered

    def _renumber_dense(self, ids: np.ndarray) -> np.ndarray:
        """Ids renumbered 0, 1, ... in order of first use (compact, independent of hashing)."""
        if ids.size == 0:
            return ids.copy()
        top = int(ids.max())
        if top >= self._renumber.shape[0]:
            extra = np.full(max(top + 1, 2 * self._renumber.shape[0]) - self._renumber.shape[0], -1)
            self._renumber = np.concatenate([self._renumber, extra.astype(np.int64)])
        fresh_values, first_index = np.unique(ids, return_index=True)
        fresh_mask = self._renumber[fresh_values] < 0
        fresh_values = fresh_values[fresh_mask][np.argsort(first_index[fresh_mask], kind="stable")]
        self._renumber[fresh_values] = np.arange(
            self._next_dense, self._next_dense + fresh_values.shape[0], dtype=np.int64
        )
        self._next_dense += int(fresh_values.shape[0])
        return self._renumber[ids]

    def _collect_for_curve(self, ids: np.ndarray, counts: np.ndarray, prompt_tokens: np.ndarray) -> None:
        cumulative = self._curve_blocks + np.cumsum(counts)
        take = int(np.searchsorted(cumulative, self._curve_max_blocks, side="right"))
        if take < counts.shape[0]:
            self._curve_full = True
        if take == 0:
            return
        used = int(counts[:take].sum())
        self._curve_parts.append((ids[:used].copy(), counts[:take].copy(), prompt_tokens[:take].copy()))
        self._curve_blocks += used

    def kept_blocks(self) -> BlockStructure:
        counts = np.concatenate(self._kept_counts) if self._kept_counts else np.zeros(0, np.int64)
        offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        ids = np.concatenate(self._kept_ids) if self._kept_ids else np.zeros(0, np.int64)
        return BlockStructure(block_size_tokens=self.block_size_tokens, ids=ids, offsets=offsets)

    def unique_blocks(self) -> int:
        return int(np.count_nonzero(self._first_use != _UNSEEN))

    def reuse_curve(self, num_points: int = 24) -> ReuseCurve:
        parts = self._curve_parts
        ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        counts = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        tokens = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
        sizes, ratios = lru_reuse_curve(ids, counts, tokens, self.block_size_tokens, num_points)
        return ReuseCurve(
            block_size_tokens=self.block_size_tokens,
            cache_size_blocks=tuple(int(s) for s in sizes),
            hit_ratio=tuple(float(r) for r in ratios),
            num_requests_used=int(counts.shape[0]),
            num_requests_total=self.num_requests,
        )


def _stack_distances(ids: np.ndarray) -> np.ndarray:
    """LRU stack distance of each access (distinct blocks touched since its last use; -1 if new).

    A Fenwick tree over access positions holds a 1 at the latest access of every block, so the
    distinct blocks between two uses of a block is a range sum. O(n log n), pure Python: the
    caller bounds n.
    """
    n = ids.shape[0]
    tree = [0] * (n + 1)
    last: dict[int, int] = {}
    out = np.full(n, -1, dtype=np.int64)
    total = 0
    for i, block in enumerate(ids.tolist()):
        previous = last.get(block)
        if previous is not None:
            # live marks after `previous` = total - prefix_sum(previous)
            j = previous + 1
            prefix = 0
            while j > 0:
                prefix += tree[j]
                j -= j & -j
            out[i] = total - prefix
            j = previous + 1
            while j <= n:
                tree[j] -= 1
                j += j & -j
            total -= 1
        j = i + 1
        while j <= n:
            tree[j] += 1
            j += j & -j
        total += 1
        last[block] = i
    return out


def lru_reuse_curve(
    ids: np.ndarray, counts: np.ndarray, prompt_tokens: np.ndarray, block_size_tokens: int, num_points: int
) -> tuple[np.ndarray, np.ndarray]:
    """Hit ratio (share of prompt tokens served from cache) for LRU caches of several sizes.

    Every request touches its blocks in order, so LRU is a stack algorithm: a block is in a
    cache of C blocks iff its stack distance is below C, and a request reuses its leading blocks
    while the running maximum of their distances stays below C.
    """
    total_tokens = int(prompt_tokens.sum())
    if ids.size == 0 or total_tokens == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    distance = _stack_distances(ids)
    # A first use never hits: give it a distance beyond any cache size.
    never = np.int64(1) << 40
    distance[distance < 0] = never
    starts = np.zeros(counts.shape[0], dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    request = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    position = np.arange(ids.shape[0], dtype=np.int64) - starts[request]
    # Running maximum of the distance inside each request: a per-request offset larger than any
    # distance keeps one request's maximum from leaking into the next.
    offset = request << 41
    running = np.maximum.accumulate(distance + offset) - offset
    # tokens carried by each block: a full block, the partial last one, or none past the prompt
    block_tokens = np.clip(prompt_tokens[request] - position * block_size_tokens, 0, block_size_tokens)
    unique_blocks = int(np.unique(ids).shape[0])
    sizes = np.unique(np.geomspace(1, max(unique_blocks, 1), num_points).round().astype(np.int64))
    order = np.argsort(running, kind="stable")
    sorted_distance = running[order]
    cumulative_tokens = np.concatenate([[0], np.cumsum(block_tokens[order])])
    hits = cumulative_tokens[np.searchsorted(sorted_distance, sizes, side="left")]
    return sizes, hits / total_tokens


class ColumnBuilder:
    """Where parsers put each request: append to the array columns, call `row_added()`.

    `block_ids`/`block_counts`/`prefix_tokens` are filled only when the parser has prefix
    information (`with_prefix=True`).
    """

    def __init__(
        self, *, with_prefix: bool, block_size_tokens: int, curve_max_blocks: int, keep_blocks: bool
    ) -> None:
        self.with_prefix = with_prefix
        self.line_no = array("q")
        self.arrival_ns = array("q")
        self.input_tokens = array("q")
        self.output_tokens = array("q")
        self.prefix_tokens = array("q")
        self.block_counts = array("q")
        self.block_ids = array("q")
        self.num_failed = 0
        self.tracker = (
            PrefixTracker(
                block_size_tokens=block_size_tokens,
                curve_max_blocks=curve_max_blocks,
                keep_blocks=keep_blocks,
            )
            if with_prefix
            else None
        )
        self._parts: dict[str, list[np.ndarray]] = {
            "arrival_ns": [],
            "input_tokens": [],
            "output_tokens": [],
            "hit": [],
            "prefix_tokens": [],
        }
        self._last_arrival_ns: int | None = None
        self._pending = 0

    def row_added(self) -> None:
        self._pending += 1
        if self._pending >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.line_no:
            return
        line_no = np.frombuffer(self.line_no, dtype=np.int64).copy()
        arrival = np.frombuffer(self.arrival_ns, dtype=np.int64).copy()
        previous = arrival[0] if self._last_arrival_ns is None else self._last_arrival_ns
        backwards = np.diff(arrival, prepend=previous) < 0
        if backwards.any():
            row = int(np.argmax(backwards))
            raise TraceError(
                int(line_no[row]),
                "the timestamp is earlier than the previous request's (timestamps must not go backwards)",
            )
        self._last_arrival_ns = int(arrival[-1])
        self._parts["arrival_ns"].append(arrival)
        self._parts["input_tokens"].append(np.frombuffer(self.input_tokens, dtype=np.int64).copy())
        self._parts["output_tokens"].append(np.frombuffer(self.output_tokens, dtype=np.int64).copy())
        if self.tracker is not None:
            prefix_tokens = np.frombuffer(self.prefix_tokens, dtype=np.int64).copy()
            hit = self.tracker.add_chunk(
                np.frombuffer(self.block_ids, dtype=np.int64).copy(),
                np.frombuffer(self.block_counts, dtype=np.int64).copy(),
                prefix_tokens,
                line_no,
            )
            self._parts["hit"].append(hit)
            self._parts["prefix_tokens"].append(prefix_tokens)
        for column in (
            self.line_no,
            self.arrival_ns,
            self.input_tokens,
            self.output_tokens,
            self.prefix_tokens,
            self.block_counts,
            self.block_ids,
        ):
            del column[:]
        self._pending = 0

    def finish(self) -> RequestColumns:
        self.flush()

        def joined(name: str) -> np.ndarray:
            parts = self._parts[name]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        return RequestColumns(
            arrival_ns=joined("arrival_ns"),
            input_tokens=joined("input_tokens"),
            output_tokens=joined("output_tokens"),
            prefix_hit_tokens=joined("hit") if self.tracker is not None else None,
            prefix_tokens=joined("prefix_tokens") if self.tracker is not None else None,
        )
