"""KV-cache blocks with prefix caching: block hashes, reference counts and LRU eviction.

Mirrors vLLM v1's block pool: a request holds a list of blocks; full prompt blocks are
registered under their chained hash; a block whose last holder finishes goes to the *tail* of
the free queue with its hash kept (a later request can still hit it), and allocation takes
blocks from the *head*, evicting the least recently freed cached block first. A request frees
its blocks tail-first, so a prompt's last blocks are evicted before its shared prefix.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    """`num_blocks` blocks of `block_size` tokens."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> block id
        # The free queue (ref count 0) in two parts, head first: the blocks never used yet, ids
        # `fresh` to `num_blocks - 1` in order (vLLM's queue starts as every block in id order,
        # and a used block can only rejoin behind them); then the blocks freed since, least
        # recently freed first (values unused). Kept as a counter, the first part costs nothing
        # to build: a pool is made for every simulated configuration, with one entry per block of
        # the whole KV cache.
        self.fresh = 0
        self.free: OrderedDict[int, None] = OrderedDict()
        self.num_evictions = 0  # cached blocks reused for other content

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.fresh + len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def longest_hit(self, hashes: list[int], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of `hashes` (at most `max_blocks`)."""
        if not self.enable_caching:
            return []
        hit = []
        cached = self.cached
        for h in hashes[:max_blocks]:
            block = cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def num_free_after_touch(self, blocks: list[int]) -> int:
        """Free blocks left once `blocks` (a cache hit) are taken off the free queue."""
        return self.num_free - sum(1 for b in blocks if self.ref_count[b] == 0)

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref_count[b] == 0:
                del self.free[b]
            self.ref_count[b] += 1

    def allocate(self, count: int) -> list[int]:
        """Take `count` blocks from the head of the free queue (caller checked there are enough)."""
        ref_count = self.ref_count
        # Never-used blocks first (the head of vLLM's queue), in id order.
        fresh = self.fresh
        take = min(count, self.num_blocks - fresh)
        out = list(range(fresh, fresh + take))
        for block in out:
            ref_count[block] = 1
        self.fresh = fresh + take
        if take == count:
            return out
        free = self.free
        block_hash = self.block_hash
        cached = self.cached
        for _ in range(count - take):
            block, _ = free.popitem(last=False)
            old = block_hash[block]
            if old is not None:
                if cached.get(old) == block:
                    del cached[old]
                block_hash[block] = None
                self.num_evictions += 1
            ref_count[block] = 1
            out.append(block)
        return out

    def register(self, block: int, block_hash: int) -> None:
        """Make a full block findable by its hash (first writer wins, as in vLLM)."""
        if self.enable_caching and self.block_hash[block] is None and block_hash not in self.cached:
            self.block_hash[block] = block_hash
            self.cached[block_hash] = block

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block; freed ones join the free queue tail-first."""
        ref_count = self.ref_count
        free = self.free
        for b in reversed(blocks):
            left = ref_count[b] - 1
            ref_count[b] = left
            if left == 0:
                free[b] = None
