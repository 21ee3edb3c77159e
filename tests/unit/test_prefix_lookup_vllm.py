"""The prefix-cache lookup against vLLM's real KVCacheManager (no engine, no workers).

`compat.prefix_cache_lookup` must give the hit vLLM's own `get_computed_blocks` gives, and
leave no trace: prefix-cache stats, KV events, block reference counts and the free queue's
eviction order are compared before and after. Built from a synthetic KVCacheConfig as vLLM's
own tests/v1/core do. Skipped without vLLM.
"""

from __future__ import annotations

import copy
import random

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.request import Request  # noqa: E402

from vllm_ascend_cpp import compat  # noqa: E402
from vllm_ascend_cpp.prefix_hits import PrefixHits  # noqa: E402

BLOCK = 16
init_none_hash(sha256)
HASHER = get_request_block_hasher(BLOCK, sha256)


def make_manager(num_blocks: int = 64, events: bool = True) -> KVCacheManager:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8,
                             dtype=torch.float32)
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)])
    return KVCacheManager(config, max_model_len=4096, scheduler_block_size=BLOCK,
                          hash_block_size=BLOCK, enable_caching=True, log_stats=True,
                          enable_kv_cache_events=events)


def make_request(rid: str, tokens: list[int], **extra: object) -> Request:
    params = SamplingParams(max_tokens=4, extra_args={"kv_cache_report_mode": "full"},
                            **extra)
    return Request(rid, tokens, params, None, block_hasher=HASHER)


class Sched:
    """What compat.prefix_cache_lookup reads from vLLM's Scheduler: its KV cache manager."""

    def __init__(self, manager: KVCacheManager) -> None:
        self.kv_cache_manager = manager


def run_to_completion(manager: KVCacheManager, req: Request) -> None:
    """Admit, compute and free a request as the scheduler would: its blocks stay cached."""
    blocks, hit, _ = manager.get_computed_blocks(req)
    manager.record_prefix_cache_stats(req, hit)
    assert manager.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None
    req.num_computed_tokens = req.num_tokens
    manager.free(req)


def snapshot(manager: KVCacheManager) -> dict:
    pool = manager.block_pool
    return {
        "stats": copy.deepcopy(vars(manager.prefix_cache_stats)),
        "events": list(pool.kv_event_queue),
        "ref_cnt": [b.ref_cnt for b in pool.blocks],
        "free_order": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "cached": len(pool.cached_block_hash_to_block._cache),
    }


def test_lookup_equals_vllm_hit_and_changes_nothing() -> None:
    rng = random.Random(3)
    manager = make_manager()
    lookup = compat.prefix_cache_lookup(Sched(manager))
    assert lookup is not None
    base = [rng.randrange(1, 500) for _ in range(200)]
    run_to_completion(manager, make_request("a", base))
    run_to_completion(manager, make_request("b", base[:50] + [7] * 90))
    manager.block_pool.take_events()
    cases = [
        base,  # all cached: the last token is recomputed, so the hit stops a block short
        base[:100] + [rng.randrange(1, 500) for _ in range(80)],  # partial block hit
        base[:50] + [7] * 90 + [1] * 33,  # the second request's prefix
        [rng.randrange(1, 500) for _ in range(70)],  # nothing
        base[:15],  # shorter than one block
    ]
    for i, tokens in enumerate(cases):
        req = make_request(f"q{i}", tokens)
        before = snapshot(manager)
        ours = lookup(req)
        after = snapshot(manager)
        assert after == before, f"case {i}: the lookup changed vLLM's state"
        # vLLM's own answer, through the call schedule() makes (it may emit events: that
        # is why we do not use it).
        _, theirs, _ = manager.get_computed_blocks(req)
        assert ours == theirs, (i, ours, theirs)
    assert lookup(make_request("all", base)) == 192  # 200 tokens, block 16, last recomputed


def test_get_computed_blocks_emits_events_the_lookup_does_not() -> None:
    # The reason the lookup goes to the coordinator: with KV events on and a request in
    # "full" report mode, vLLM's get_computed_blocks announces the hit.
    manager = make_manager()
    tokens = list(range(1, 100))
    run_to_completion(manager, make_request("a", tokens))
    manager.block_pool.take_events()
    lookup = compat.prefix_cache_lookup(Sched(manager))
    assert lookup is not None
    req = make_request("b", tokens)
    assert lookup(req) == 96
    assert manager.block_pool.kv_event_queue == []
    manager.get_computed_blocks(req)
    assert manager.block_pool.kv_event_queue != []


def test_opt_out_and_caching_off_find_nothing() -> None:
    manager = make_manager()
    tokens = list(range(1, 100))
    run_to_completion(manager, make_request("a", tokens))
    lookup = compat.prefix_cache_lookup(Sched(manager))
    assert lookup is not None
    # prompt_logprobs makes vLLM skip reading the cache for that request.
    req = make_request("b", tokens, prompt_logprobs=1)
    assert req.skip_reading_prefix_cache
    assert lookup(req) == 0 == manager.get_computed_blocks(req)[1]
    manager.enable_caching = False
    assert compat.prefix_cache_lookup(Sched(manager)) is None


def test_eviction_order_unchanged_under_pressure() -> None:
    # A pool just big enough: after looking up, allocating a new request must evict exactly
    # the blocks it would have evicted without the lookup.
    def evicted(look: bool) -> list[int]:
        manager = make_manager(num_blocks=14, events=False)
        a = list(range(1, 97))
        run_to_completion(manager, make_request("a", a))
        if look:
            lookup = compat.prefix_cache_lookup(Sched(manager))
            assert lookup is not None
            for k in range(5):
                lookup(make_request(f"p{k}", a[: 16 * (k + 1) + 3]))
        new = make_request("new", list(range(500, 500 + 16 * 10)))
        blocks, hit, _ = manager.get_computed_blocks(new)
        got = manager.allocate_slots(new, new.num_tokens - hit, hit, blocks)
        assert got is not None
        # The blocks the new request took, in order; each came off the free queue's head.
        return got.get_block_ids()[0]

    with_lookup, without = evicted(True), evicted(False)
    assert with_lookup == without
    assert len(without) == 10


def test_prefix_hits_cache_looks_up_once_per_request() -> None:
    manager = make_manager()
    tokens = list(range(1, 100))
    run_to_completion(manager, make_request("a", tokens))
    lookup = compat.prefix_cache_lookup(Sched(manager))
    assert lookup is not None
    hits = PrefixHits(lookup)
    req = make_request("b", tokens)
    assert [hits.hit(req) for _ in range(5)] == [96] * 5
    assert hits.lookups == 1


def test_probe_notices_a_growing_and_a_shrinking_hit() -> None:
    manager = make_manager(num_blocks=24, events=False)
    sched = Sched(manager)
    lookup, probe = compat.prefix_cache_lookup(sched), compat.prefix_cache_probe(sched)
    assert lookup is not None and probe is not None
    hits = PrefixHits(lookup, probe)
    shared = list(range(1, 161))  # 10 blocks
    a = make_request("a", shared + [900] * 20)
    # A is admitted and its first 64 tokens scheduled: those 4 blocks are cached.
    assert manager.allocate_slots(a, 64, 0, manager.get_computed_blocks(a)[0]) is not None
    b = make_request("b", shared + [901] * 40)
    assert hits.hit(b, check=True) == 64 == manager.get_computed_blocks(b)[1]
    assert probe(b, 64)()
    # A's next chunk caches 64 more tokens of the shared prefix: B's answer is stale.
    a.num_computed_tokens = 64
    assert manager.allocate_slots(a, 64) is not None
    assert not probe(b, 64)()
    assert hits.hit(b) == 64  # not checked: the kept answer
    assert hits.hit(b, check=True) == 128 == manager.get_computed_blocks(b)[1]
    assert hits.lookups == 2
    # A finishes and frees its blocks; a large request evicts them, tail first.
    a.num_computed_tokens = 128
    manager.free(a)
    c = make_request("c", list(range(5000, 5000 + 16 * 16)))
    assert manager.allocate_slots(c, c.num_tokens) is not None
    truth = manager.get_computed_blocks(b)[1]
    assert truth < 128
    assert not probe(b, 128)()
    assert hits.hit(b, check=True) == truth
    assert hits.lookups == 3


def test_no_probe_where_the_layout_is_not_plain() -> None:
    manager = make_manager()
    manager.coordinator.eagle_group_ids = {0}  # EAGLE drops the last block: no simple check
    assert compat.prefix_cache_probe(Sched(manager)) is None
    assert compat.prefix_cache_probe(Sched(make_manager())) is not None


def test_in_step_growth_is_what_vllm_finds_after_the_earlier_allocations() -> None:
    """Requests admitted one after another in a step, as schedule() does: each is allocated
    (and caches its full blocks) before the next is looked up. The growth predicted before
    any allocation, from the earlier requests' (history, tokens), must equal vLLM's own
    lookup at the moment the walk reaches the request."""
    rng = random.Random(7)
    checked = grew = 0
    for _ in range(60):
        manager = make_manager(num_blocks=400, events=False)
        sched = Sched(manager)
        lookup, grown = compat.prefix_cache_lookup(sched), compat.prefix_cache_in_step(sched)
        assert lookup is not None and grown is not None
        docs = [[rng.randrange(1, 30000) for _ in range(400)] for _ in range(2)]
        if rng.random() < 0.5:  # something of one document already cached
            run_to_completion(manager, make_request("old", docs[0][:rng.randrange(1, 300)]))
        reqs = []
        for i in range(rng.randrange(2, 5)):
            doc = docs[rng.randrange(2)]
            shared = rng.randrange(0, 400)
            tail = [rng.randrange(30000, 40000) for _ in range(rng.randrange(1, 60))]
            reqs.append(make_request(f"r{i}", doc[:shared] + tail))
        # The plan before the step: each request at its pre-step hit, tokens chosen by a
        # chunk size (here random), as the planner would.
        plan = []
        for req in reqs:
            hit = lookup(req)
            plan.append((req, hit, rng.randrange(1, req.num_tokens - hit + 1)))
        for k, (req, hit, _) in enumerate(plan):
            predicted = grown(plan[:k + 1]).get(k, hit)
            blocks, truth, _ = manager.get_computed_blocks(req)
            assert predicted == truth, (k, hit, predicted, truth)
            checked += 1
            grew += predicted > hit
            # vLLM's walk admits it with its true hit and the planned number of new tokens
            # (the planned count covers at least as much as it would at the true hit).
            n = min(plan[k][2], req.num_tokens - truth)
            assert manager.allocate_slots(req, n, truth, blocks) is not None
            plan[k] = (req, truth, n)
    assert checked > 100 and grew > 10, (checked, grew)


def test_in_step_growth_predicted_before_the_step_from_the_lookups() -> None:
    """What the runtime does: one call before the step, every chunk at its own pre-step hit
    (a request that grows computes from the prefix it finds, which a request after it may
    share). Each prediction must equal vLLM's lookup when its walk reaches the request."""
    rng = random.Random(8)
    checked = grew = chained = 0
    for _ in range(80):
        manager = make_manager(num_blocks=400, events=False)
        sched = Sched(manager)
        lookup, grown = compat.prefix_cache_lookup(sched), compat.prefix_cache_in_step(sched)
        assert lookup is not None and grown is not None
        doc = [rng.randrange(1, 30000) for _ in range(400)]
        if rng.random() < 0.5:
            run_to_completion(manager, make_request("old", doc[:rng.randrange(1, 300)]))
        reqs = [make_request(f"r{i}", doc[:rng.randrange(16, 400)]
                             + [rng.randrange(30000, 40000) for _ in range(rng.randrange(1, 9))])
                for i in range(rng.randrange(2, 6))]
        plan = []
        for req in reqs:
            hit = lookup(req)
            plan.append((req, hit, rng.randrange(1, req.num_tokens - hit + 1)))
        predicted = grown(plan)
        for k, (req, hit, n) in enumerate(plan):
            blocks, truth, _ = manager.get_computed_blocks(req)
            assert predicted.get(k, hit) == truth, (k, hit, predicted, truth)
            checked += 1
            grew += truth > hit
            chained += truth > hit and any(j in predicted for j in range(k))
            n = min(n, req.num_tokens - truth)
            assert manager.allocate_slots(req, n, truth, blocks) is not None
    assert checked > 150 and grew > 20 and chained > 5, (checked, grew, chained)


def test_bisection_equals_vllm_under_random_churn() -> None:
    """The plain layout's lookup bisects the request's block hashes, which is exact only if
    a chain's cached blocks always form a run from its start. Random churn on a pool far too
    small for the load (shared prefixes of several documents, partial prefills, requests
    freed in any order, so blocks are evicted and reused all the time): at every point the
    bisected hit equals vLLM's own `get_computed_blocks` and the coordinator's linear walk."""
    rng = random.Random(11)
    checked = nonzero = evictions = resets = 0
    for _ in range(40):
        manager = make_manager(num_blocks=rng.randrange(12, 60), events=False)
        sched = Sched(manager)
        lookup = compat.prefix_cache_lookup(sched)
        assert lookup is not None
        coordinator = manager.coordinator
        pool = manager.block_pool
        evict = pool._maybe_evict_cached_block

        def counting(block, evict=evict):  # how often the churn really evicts
            nonlocal evictions
            gone = evict(block)
            evictions += gone
            return gone

        pool._maybe_evict_cached_block = counting
        docs = [[rng.randrange(1, 30000) for _ in range(600)] for _ in range(3)]
        live: list[Request] = []
        n = 0

        def fresh(docs: list[list[int]] = docs) -> Request:
            nonlocal n
            n += 1
            doc = docs[rng.randrange(len(docs))]
            own = [rng.randrange(30000, 40000) for _ in range(rng.randrange(0, 40))]
            return make_request(f"r{n}", doc[:rng.randrange(1, 600)] + own)

        for _ in range(60):
            probe = fresh()
            ours = lookup(probe)
            blocks, theirs, _ = manager.get_computed_blocks(probe)
            walked = coordinator.find_longest_cache_hit(probe.block_hashes,
                                                        probe.num_tokens - 1)[1]
            assert ours == theirs == walked, (ours, theirs, walked)
            checked += 1
            nonzero += ours > 0
            if rng.random() < 0.6:
                # Admit it with a random share of its prompt, as a chunked prefill would.
                todo = rng.randrange(1, probe.num_tokens - theirs + 1)
                if manager.allocate_slots(probe, todo, theirs, blocks) is not None:
                    probe.num_computed_tokens = theirs + todo
                    live.append(probe)
            if live and rng.random() < 0.5:
                manager.free(live.pop(rng.randrange(len(live))))
            if not live and rng.random() < 0.1:
                # vLLM replaces its table of cached blocks: the lookup must read the new one.
                assert manager.reset_prefix_cache()
                resets += 1
    assert checked == 2400 and nonzero > 500 and evictions > 50, (checked, nonzero, evictions)
    assert resets > 5, resets


def test_whole_prefills_on_vllm_requests() -> None:
    """The tail of a long queue is planned unbuilt only when every request is a prompt with
    nothing computed and no output to replay (a preempted request keeps its output, and a
    prefix hit may then cover its whole prompt)."""
    fresh = [make_request(f"f{i}", list(range(1, 40 + i))) for i in range(3)]
    assert compat.whole_prefills(fresh)
    resumed = make_request("p", list(range(1, 60)))
    resumed.append_output_token_ids([5, 6])  # as after a preemption: output kept, 0 computed
    assert resumed.num_computed_tokens == 0
    assert not compat.whole_prefills([*fresh, resumed])
    started = make_request("s", list(range(1, 60)))
    started.num_computed_tokens = 16
    assert not compat.whole_prefills([*fresh, started])
    # Objects without vLLM's output list: the token counts say the same.
    from types import SimpleNamespace
    plain = [SimpleNamespace(num_computed_tokens=0, num_prompt_tokens=9, num_tokens=n)
             for n in (9, 11)]
    assert compat.whole_prefills(plain[:1]) and not compat.whole_prefills(plain)
