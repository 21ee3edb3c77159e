"""Cached prefix lengths of waiting requests, looked up once per request.

The planner must size a waiting request's first chunk at the history vLLM will give it, and
vLLM finds that history (its prefix-cache hit) only inside `schedule()`, after we planned.
`PrefixHits` asks vLLM's cache ahead of it (the lookup comes from
`compat.prefix_cache_lookup`, which says why that lookup changes nothing in vLLM) and keeps the
answer by request id, so a request that waits many steps costs one lookup, not one per step.
An entry is dropped when the request is scheduled (it then has real computed tokens), when it
finishes or is aborted, and when the prefix cache is reset; a request whose token count changed
(a streaming session that appended input) is looked up again.

Between the lookup and the step that schedules the request, the cache may change under it
(another request caches more of a shared prefix, or blocks are evicted). Where vLLM's layout
allows a cheap check (`compat.prefix_cache_probe`: two hash-table reads, the check made with
the answer), the kept answers of the waiting requests a step can reach are checked every step
and looked up again when stale.
Elsewhere a stale answer shows as a plan that differs from what ran, in the trace.

Within one step, vLLM caches each scheduled request's full blocks as it allocates them, so a
waiting request admitted after another that shares its prefix finds more than the lookup
before the step did (a burst of requests with one system prompt computes it once).
`grown_in_step` finds those requests in a plan (`compat.prefix_cache_in_step` does the block
matching, from each waiting request's own lookup), and those a plan gave a longer prefix than
the chunks before them now cache; the runtime then plans again with the prefix they will find.
Blocks vLLM evicts within the step, to place an earlier request in a full pool, are not
foreseen: such a plan shows as a mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# Far above any admission limit (only admissible waiting requests are looked up): a safety
# bound, should an entry ever outlive its request unseen.
MAX_ENTRIES = 65536


class PrefixHits:
    def __init__(self, lookup: Callable[[Any], int],
                 probe: Callable[[Any, int], Callable[[], bool]] | None = None,
                 max_entries: int = MAX_ENTRIES,
                 in_step: Callable[[Sequence[tuple[Any, int, int]]], dict[int, int]] | None
                 = None) -> None:
        self._lookup = lookup
        self._probe = probe
        self._in_step = in_step
        self._max_entries = max_entries
        # req_id -> (num_tokens, hit, the check that the hit still holds or None)
        self._hits: dict[str, tuple[int, int, Callable[[], bool] | None]] = {}
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._hits)

    def hit(self, request: Any, check: bool = False) -> int:
        """Tokens of `request` vLLM will find cached, for a request with nothing computed;
        with `check`, a kept answer is first checked against the cache (when it can be)."""
        rid = request.request_id
        num_tokens = request.num_tokens
        entry = self._hits.get(rid)
        if entry is not None and entry[0] == num_tokens:
            still = entry[2]
            if not check or still is None or still():
                return entry[1]
        if len(self._hits) >= self._max_entries:
            self._hits.clear()
        self.lookups += 1
        hit = max(0, min(int(self._lookup(request)), num_tokens - 1))
        probe = self._probe
        self._hits[rid] = (num_tokens, hit, probe(request, hit) if probe is not None else None)
        return hit

    def drop(self, req_ids: Iterable[str]) -> None:
        hits = self._hits
        if hits:
            for rid in req_ids:
                hits.pop(rid, None)

    def clear(self) -> None:
        self._hits.clear()

    @property
    def sees_in_step(self) -> bool:
        return self._in_step is not None

    def grown_in_step(self, requests: Mapping[str, Any],
                      items: Sequence[tuple[str, int, int, bool]]) -> dict[str, int]:
        """Requests of a plan (`(req_id, history, tokens, is_prefill)` in walk order) that
        start with nothing computed and will find another prefix than planned: a longer one,
        cached by prefill chunks before them in the same step, or a shorter one than a plan
        made for such a prefix (planned again, a chunk before it computes fewer blocks):
        req_id -> that prefix in tokens."""
        grown_at = self._in_step
        if grown_at is None or len(items) < 2:
            return {}
        # Only prefill chunks are matched: a decode caches a block of generated tokens, which
        # no waiting prompt can share (a next turn needs the whole reply). With hundreds of
        # decodes in a step this keeps the pass to a field check per decode.
        chunks: list[tuple[Any, int, int]] = []
        planned: list[tuple[str, int]] = []
        kept = self._hits
        for rid, history, tokens, is_prefill in items:
            if not is_prefill:
                continue
            req = requests.get(rid)
            if req is None:
                break
            # A waiting request is matched from its own lookup, not from a prefix an earlier
            # plan of this step gave it.
            entry = kept.get(rid) if req.num_computed_tokens == 0 else None
            hit = entry[1] if entry is not None and entry[0] == req.num_tokens else history
            chunks.append((req, min(hit, history), tokens))
            planned.append((rid, history))
        if len(chunks) < 2:
            return {}
        found = grown_at(chunks)
        out = {}
        for k, (rid, history) in enumerate(planned):
            hit = found.get(k, chunks[k][1])
            if hit != history:
                out[rid] = hit
        return out
