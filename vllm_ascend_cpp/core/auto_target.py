"""``target: auto``: the step target that minimises the predicted time to first token.

On ``S`` pipeline stages a run of steps costing ``t_1..t_n`` (every stage alike) delivers the
output of its last step after ``sum(t) + (S-1)*max(t)`` (a proportionate flow shop: the
critical path crosses the stages once, at the largest step). For one prompt of work ``W``
split into ``n`` equal steps with per-step overhead ``c`` that is ``W + n*c + (S-1)*(W/n + c)``,
smallest near ``n = sqrt((S-1)*W/c)``: too large a target leaves the other stages idle while
the big last chunk drains, too small a one pays ``c`` too often.

With several prefills queued, request ``j`` gets its first token after every step up to its
last chunk plus ``S-1`` times the largest step so far. Only the drain after the last step is
latency; the queue's own work fills the pipeline in between, so the best target grows with the
queued work and, with enough of it, every chunk becomes as large as the token budget allows.

The forecast runs the steps through the pipeline as vLLM's engine does: at most ``S`` batches
in flight (``EngineCore.step_with_batch_queue``), so a step enters stage 0 only once the step
``S`` back has left the last stage, after the host time of its dispatch. That limit makes a fall
in step cost expensive: on two stages the critical path runs over ``max(t_k, t_(k-1))`` for
every step, so each fall is paid in full while stage 0 waits for a free slot. The
closed form above has no such limit and charges nothing for it. The steps already in flight
(their planned costs, from the runtime) start the forecast where a full pipeline holds them
when the oldest batch has just come back: the newest on stage 1, the one before on stage 2, and
so on. An earlier version left them out and used the closed form: a new head then saw no cost
in starting below the large steps of the head before it, and under at most ``S`` batches in
flight the stages idled until those drained (in the simulator, cheap per-step constant,
concurrency 4, 16K prompts, two stages: 0.6% above ``base``, beyond the arrival noise). Charging
every new head ``(S-1)`` times the largest step since the pipeline last drained (the version
before that) overstated it instead, and in a closed loop of clients the target only climbed.

Decodes ride in the coming steps in phases. Under pipeline parallelism a decode's next token
can be scheduled only once its last one is back, ``S`` steps later, and vLLM's walk skips it
in between, so each step carries the decodes of its phase only: with ``S = 2`` and three
decodes in one phase, every other step is heavy and the planner gives the lead prefill what
those decodes leave of the target (its smallest chunk when they take it all). The forecast
runs that cycle step by step. An earlier version spread the decodes of one step's candidates
evenly over every step; those hold only that step's phase, and none at all on a step between,
so a choice made there saw no decodes, picked a small target, and the heavy steps then gave the
prompt its smallest chunk (in the simulator one such prompt's TTFT doubled against ``base``).
Even when they are all seen, the even spread misses the planner's steps by 10-21% where the
decodes take most of the target (``tests/unit/test_auto_target.py``; the cycle is within 1%).

:class:`AutoTarget` forecasts the steps the planner would make for a queue at a candidate
target (each step's lead chunk is the predictor's own ``next_chunk``, fold rule included; the
rest of the step is filled as :class:`~.step_planner.StepPlanner` fills it), scores the mean
completion time over the queue and searches the target on a geometric grid, then refines. For
a lone prompt the winner is checked against the base target with the real predictor, so
``auto`` never predicts a worse TTFT than ``base``. Choices are cached by the queue's shape in
coarse buckets.

:class:`AutoTargetTracker` is the per-engine state the manager keeps: it re-chooses only when
the head of the prefill queue changes, more prefill work arrives or decodes join or leave, and
keeps the target from falling while the same head is being prefilled (its first choice saw its
whole prompt; letting the target fall as the rest shrinks cost up to 5.6% against ``base`` in
the simulator), so a step costs a dictionary lookup or less. It keeps the decodes of the last
``S-1`` steps, which with this step's make the cycle the forecast runs. A choice kept while
decodes joined (a prompt finished its prefill) or left planned the rest of the head around a
load that was gone: with both policies serving the same arrivals (4c+4 requests, three prompt
draws, four arrival draws each), re-choosing then took the cases where auto's mean TTFT over
the arrival draws was above ``base``'s from 8 to 3 of 192, the worst from 2.0% to 1.0% above
(``benchmarks/results/sim_auto_vs_base_phases_pooled.md`` against ``sim_auto_vs_base.md``).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from . import step_planner
from .latency_model import pipeline_ttft_ms
from .predictor import ChunkSizePredictor
from .step_planner import Candidate, held_chunk, phase_move

__all__ = ["AutoChoice", "AutoTarget", "AutoTargetTracker", "DecodeLoad", "MAX_QUEUE",
           "decode_phases"]

# Requests beyond this far down the queue do not change the choice: by then the target is at
# the budget's cap anyway.
MAX_QUEUE = 16
_GRID_POINTS = 24
_REFINE_POINTS = 8
_CACHE_SIZE = 4096
# Targets so small that the queue would take more steps than this are not considered.
_MAX_STEPS = 512


@dataclass(frozen=True)
class AutoChoice:
    """A chosen target and what it is predicted to give.

    ``predicted_ms`` is the mean predicted completion (time to first token, from now) over the
    queue at ``target_ms``; ``base_predicted_ms`` the same at the base target (NaN when the
    base target is not usable).
    """

    target_ms: float
    predicted_ms: float
    base_target_ms: float
    base_predicted_ms: float
    steps: int
    queue: int

    def to_dict(self) -> dict:
        def clean(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {"target_ms": clean(self.target_ms), "predicted_ttft_ms": clean(self.predicted_ms),
                "base_target_ms": clean(self.base_target_ms),
                "base_predicted_ttft_ms": clean(self.base_predicted_ms), "steps": self.steps,
                "queue": self.queue}


def _bucket(v: int) -> int:
    # About 1/32 relative resolution: prompts that differ by less share a choice.
    v = int(v)
    if v < 256:
        return v
    shift = v.bit_length() - 6
    return (v >> shift) << shift


# Decodes riding in the coming steps: one ``(cost without c, tokens)`` pair, or one per step
# of a repeating cycle.
DecodeLoad = tuple[float, int] | Sequence[tuple[float, int]]


def decode_phases(decodes: DecodeLoad) -> tuple[tuple[float, int], ...]:
    """``decodes`` as a non-empty cycle of clean ``(cost ms >= 0, tokens >= 0)`` pairs."""
    pairs = [decodes] if len(decodes) == 2 and not isinstance(decodes[0], Sequence) \
        else list(decodes)
    out = []
    for ms, tokens in pairs:
        ms = float(ms)
        out.append((ms if math.isfinite(ms) and ms > 0 else 0.0, max(0, int(tokens))))
    return tuple(out) or ((0.0, 0),)


def _pipeline_state(in_flight: Sequence[float], stages: int) -> tuple[list[float], deque]:
    """Each stage's free time and the in-flight steps' completion times, from now.

    The steps in flight (their planned costs, oldest first) are placed where a full pipeline
    has them when the oldest batch has just come back: the newest on stage 1, the one before
    on stage 2, and so on, each starting its stage now; stage 0 is free."""
    free = [0.0] * stages
    slots: deque[float] = deque()
    steps = [float(t) for t in in_flight if math.isfinite(t) and t > 0][-(stages - 1):] \
        if stages > 1 else []
    m = len(steps)
    for i, t in enumerate(steps):
        end = 0.0
        for s in range(m - i, stages):
            end = max(end, free[s]) + t
            free[s] = end
        slots.append(end)
    return free, slots


class AutoTarget:
    """Chooses a step target for a prefill queue from the predictor's model; see module doc."""

    def __init__(self, predictor: ChunkSizePredictor, stages: int, *,
                 grid_points: int = _GRID_POINTS, refine_points: int = _REFINE_POINTS,
                 cache_size: int = _CACHE_SIZE, host_ms: float = 0.0) -> None:
        if isinstance(stages, bool) or int(stages) < 1:
            raise ValueError(f"stages must be a positive integer, got {stages!r}")
        self.predictor = predictor
        self.stages = int(stages)
        self.grid_points = max(4, int(grid_points))
        self.refine_points = max(0, int(refine_points))
        self._cache: OrderedDict[tuple, AutoChoice] = OrderedDict()
        self._cache_size = max(1, int(cache_size))
        self.cache_hits = 0
        self.cache_misses = 0
        m = predictor.model
        self.ready = predictor.ready and m is not None
        if m is not None:
            self._c = m.c
            # Host work between steps (scheduling, output handling) delays each dispatch; the
            # forecast puts it on the dispatch path, where a full pipeline hides it.
            h = float(host_ms)
            self.host_ms = h if math.isfinite(h) and h > 0 else 0.0
        base = predictor.target_ms
        self.base_target_ms = float(base) if base is not None else math.nan

    # -- the lean forecast ----------------------------------------------------------------

    def decode_cost(self, history: int, tokens: int) -> float:
        """What one running decode adds to a step (without c)."""
        return self._cost(int(history), int(tokens)) if self.ready else 0.0

    def _cost(self, L: int, x: int) -> float:
        return self.predictor.model.chunk_cost_ms(L, x)

    def forecast(self, prefills: Sequence[tuple[int, int]], budget: int, target_ms: float,
                 give_up_at: float = math.inf,
                 decodes: DecodeLoad = ((0.0, 0),),
                 in_flight: Sequence[float] = ()) -> tuple[float, int]:
        """Mean predicted completion over the queue at ``target_ms``, and the step count.

        ``decodes`` is ``(cost without c, tokens)`` of the decodes riding in each coming
        step, one pair per step of a repeating cycle (see :class:`AutoTargetTracker`; a single
        pair means the same in every step). The planner gives them their share of the target
        and of the budget first and the lead prefill what is left, at least its smallest chunk
        when they take it all; the rest of the step is filled with the prefills behind it.
        Returns ``(inf, steps)`` as soon as the mean provably reaches ``give_up_at``.
        """
        p = self.predictor
        align = p.alignment
        smallest = p.starved_chunk
        target = float(target_ms)
        # Per phase of the cycle: (time left for prefills, tokens left, per-step constant).
        phases = decode_phases(decodes)
        cycle = [(target - ms, max(1, int(budget) - tokens), self._c + ms)
                 for ms, tokens in phases]
        period = len(cycle)
        # The planner's rule 6 (finish in the quieter phase) moves a prompt's last step.
        loads = [tokens for _, tokens in phases] if period > 1 \
            and step_planner.BALANCE_PHASES else None
        merge_limit = step_planner.PHASE_MERGE_LIMIT
        # The predictor's own sizing rule (fold rule included) and root, bound once: this
        # loop runs a few thousand times per search.
        size = p.size
        root = p.root
        cost_of = p.model.sums_cost_ms
        S = self.stages
        host = self.host_ms
        free, slots = _pipeline_state(in_flight, S)
        clock = 0.0
        n = len(prefills)
        done_sum = 0.0
        done = 0
        steps = 0
        j = 0
        L, R = prefills[0]
        while j < n:
            t, room, c = cycle[steps % period]
            if t > 0:
                x = size(L, R, room, t)[0]
            else:
                # The decodes fill the target: the lead still gets its smallest chunk.
                x = min(smallest, R, room)
            if loads is not None:
                move = phase_move(x, R, loads[steps % period], loads[(steps + 1) % period],
                                  room)
                if move == "hold":
                    x = held_chunk(R, align, smallest) or x
                elif move == "merge" and t > 0 \
                        and cost_of(L, R, L * R, R * R) <= merge_limit * t:
                    x = R
            cost = cost_of(L, x, L * x, x * x)
            used = x
            L += x
            R -= x
            finished = 0
            while R <= 0:
                finished += 1
                j += 1
                if j >= n:
                    break
                L, R = prefills[j]
                # The planner fills what is left of the step with the next prefill.
                if cost >= t or used >= room:
                    break
                part = root(L, t - cost)
                if part <= 0:
                    break
                part = int(min(part, R, room - used))
                if part < R:
                    part -= part % align
                if part <= 0:
                    break
                cost += cost_of(L, part, L * part, part * part)
                used += part
                L += part
                R -= part
            step = c + cost
            # vLLM's engine keeps at most S batches in flight: when full it waits for the
            # oldest to come back, then spends the host time and dispatches.
            if len(slots) >= S:
                clock = max(clock, slots.popleft())
            clock += host
            end = clock
            for s in range(S):
                end = max(end, free[s]) + step
                free[s] = end
            slots.append(end)
            steps += 1
            if finished:
                done_sum += finished * end
                done += finished
            # Every request not yet done completes no earlier than this step.
            if (done_sum + (n - done) * end) / n >= give_up_at:
                return math.inf, steps
        return done_sum / n, steps

    def _exact_single(self, history: int, remaining: int, budget: int, t: float) -> float:
        p = self.predictor.with_model(self.predictor.model, target_ms=t)
        plan = p.plan(remaining, budget=budget, history=history)
        return pipeline_ttft_ms([c.predicted_ms for c in plan], self.stages)

    # -- the choice -----------------------------------------------------------------------

    def choose(self, prefills: Sequence[tuple[int, int]], budget: int,
               decodes: DecodeLoad = ((0.0, 0),),
               in_flight: Sequence[float] = ()) -> AutoChoice | None:
        """The best target for this queue (walk order), or None when there is nothing to do.

        ``decodes`` is the decodes riding in the coming steps, as :meth:`forecast` takes it."""
        if not self.ready:
            return None
        queue = [(max(0, int(L)), int(R)) for L, R in list(prefills)[:MAX_QUEUE] if int(R) > 0]
        budget = int(budget)
        if not queue or budget < 1:
            return None
        dec = decode_phases(decodes)
        flight = tuple(float(t) for t in in_flight if math.isfinite(t) and t > 0)
        key = (tuple((_bucket(L), _bucket(R)) for L, R in queue), budget,
               tuple((_bucket(int(ms * 1000)), _bucket(tokens)) for ms, tokens in dec),
               tuple(_bucket(int(t * 1000)) for t in flight))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self.cache_hits += 1
            return hit
        self.cache_misses += 1
        choice = self._search(queue, budget, dec, flight)
        self._cache[key] = choice
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return choice

    def _bounds(self, queue: list[tuple[int, int]],
                budget: int) -> tuple[float, float, float, float]:
        """``(lowest, highest, closed-form guess, queued work)`` of the targets worth trying."""
        p = self.predictor
        smallest = max(min(p.min_chunk, budget), min(p.alignment, budget), 1)
        low = self._cost(0, smallest)
        # Past the cost of the largest budget-sized chunk every chunk is capped: same plan.
        high = max(self._cost(max(0, L + R - min(budget, R)), min(budget, R)) for L, R in queue)
        work = sum(self._cost(L, R) for L, R in queue)
        if self._c > 0 and work > 0:
            n = math.sqrt((self.stages - 1) * work / self._c) or 1.0
            guess = work / max(n, 1.0)
        else:
            guess = low
        return low, high, guess, work

    def _search(self, queue: list[tuple[int, int]], budget: int,
                dec: tuple[tuple[float, int], ...] = ((0.0, 0),),
                flight: tuple[float, ...] = ()) -> AutoChoice:
        base_t = self.base_target_ms
        low, high, guess, work = self._bounds(queue, budget)
        # The grid is in prefill cost; the target also pays for the decodes riding along.
        shift = sum(ms for ms, _ in dec) / len(dec)
        decode_tokens = max(tokens for _, tokens in dec)
        candidates: list[float] = []
        if math.isfinite(high) and high > 0:
            # Far below the closed-form guess only more steps are bought; cut the grid there
            # so that tiny targets do not make the forecast walk thousands of steps.
            lo = max(low, guess / 16.0, high * 1e-6, work / _MAX_STEPS)
            if not lo > 0 or lo >= high:
                candidates.append(high + shift)
            else:
                ratio = (high / lo) ** (1.0 / (self.grid_points - 1))
                candidates.extend(lo * ratio ** k + shift for k in range(self.grid_points))
        usable_base = math.isfinite(base_t) and base_t > 0
        if usable_base:
            candidates.append(base_t)
        if not candidates:
            return AutoChoice(base_t, math.nan, base_t, math.nan, 0, len(queue))
        if len(queue) > 1:
            # Queued work only fills the pipeline: never go below the head's own best.
            alone = self.choose(queue[:1], budget, dec, flight)
            if alone is not None and math.isfinite(alone.target_ms) and alone.target_ms > 0:
                least = alone.target_ms
                L, R = queue[0]
                if R <= budget - decode_tokens:
                    # A head that fits in one step is as well off at its own cost as at any
                    # larger target (the lone choice breaks that tie upwards): only the
                    # queue behind it may argue for more.
                    least = min(least, self._cost(L, R) + shift)
                candidates = [t for t in candidates if t >= least]
                candidates.append(least)
        scored: list[tuple[float, int, float]] = []
        best = math.inf
        # Largest first: few steps each, and a good ``best`` early lets the long forecasts of
        # small targets stop as soon as they cannot win.
        for t in sorted(set(candidates), reverse=True):
            value, steps = self.forecast(queue, budget, t, give_up_at=best, decodes=dec,
                                         in_flight=flight)
            scored.append((value, steps, t))
            best = min(best, value)
        scored.sort(key=lambda s: s[2])
        i = min(range(len(scored)), key=lambda k: (scored[k][0], -scored[k][2]))
        if self.refine_points and math.isfinite(scored[i][0]):
            left = scored[i - 1][2] if i > 0 else scored[i][2]
            right = scored[i + 1][2] if i + 1 < len(scored) else scored[i][2]
            if right > left:
                step = (right / left) ** (1.0 / (self.refine_points + 1))
                for k in range(1, self.refine_points + 1):
                    t = left * step ** k
                    value, steps = self.forecast(queue, budget, t, give_up_at=best,
                                                 decodes=dec, in_flight=flight)
                    scored.append((value, steps, t))
                    best = min(best, value)
        value, steps, target = min(scored, key=lambda s: (s[0], -s[2]))
        base_value = math.nan
        if usable_base:
            base_value = next((v for v, _, t in scored if t == base_t), math.nan)
        if len(queue) == 1 and decode_tokens == 0 and usable_base and not flight:
            # The lean forecast skips a few of the predictor's tail rules; for a lone prompt
            # the real plan decides, so auto can never predict worse than base.
            L, R = queue[0]
            exact_auto = self._exact_single(L, R, budget, target)
            exact_base = self._exact_single(L, R, budget, base_t)
            base_value = exact_base
            if exact_base < exact_auto:
                target, value = base_t, exact_base
            else:
                value = exact_auto
        return AutoChoice(float(target), float(value), base_t, float(base_value), steps,
                          len(queue))


class AutoTargetTracker:
    """The per-engine auto-target state kept by the manager (see the module docstring)."""

    def __init__(self, auto: AutoTarget) -> None:
        self.auto = auto
        self.head: str | None = None
        self.target_ms: float | None = None
        self.choice: AutoChoice | None = None
        self._n_prefills = 0
        self._queued_tokens = 0
        # The decodes running (over the whole cycle) when the target was last chosen.
        self._decodes_seen = 0
        # Set when the costs changed under a kept head: choose again, still never lower.
        self._costs_changed = False
        # The decodes vLLM scheduled in each of the last S-1 steps, oldest first (fed by
        # :meth:`record` once per step). Under pipeline parallelism a decode's next token can
        # be scheduled only when its last one is back, S steps later, and vLLM's walk skips
        # it in between: a step's candidates hold only the decodes of its phase, and the next
        # S-1 steps carry those of the steps before, in turn. Steps with no prefill are never
        # planned, so only a record of every step scheduled keeps this true: one kept from the
        # planned steps alone still held the last prefill step's decodes when a new prompt
        # arrived during decode-only steps, and the first choice for it saw none.
        self._recent: deque[tuple[float, int]] = deque(maxlen=max(0, auto.stages - 1))
        self._decodes: tuple[tuple[float, int], ...] = ((0.0, 0),)
        self.choices_made = 0

    def record(self, decodes: Sequence[tuple[int, int]]) -> None:
        """``(history, tokens)`` of each decode vLLM scheduled in a step, once per step
        scheduled (planned or not)."""
        if self._recent.maxlen:
            self._recent.append((sum(self.auto.decode_cost(h, max(1, n)) for h, n in decodes),
                                 sum(max(1, int(n)) for _, n in decodes)))

    def target_for(self, candidates: Sequence[Candidate], max_budget: int,
                   max_requests: int | None = None,
                   in_flight: Sequence[float] = ()) -> float | None:
        """This step's target, or None to leave the planner on its own target."""
        limit = len(candidates) if max_requests is None else max(0, min(len(candidates),
                                                                        int(max_requests)))
        prefills: list[tuple[int, int]] = []
        head: str | None = None
        decode_ms = 0.0
        decode_tokens = 0
        walking = True
        for i in range(limit):
            cand = candidates[i]
            if not cand.is_prefill:
                decode_ms += self.auto.decode_cost(cand.history, max(1, cand.remaining))
                decode_tokens += max(1, cand.remaining)
            if cand.remaining <= 0:
                walking = False  # the walk ends here (see step_planner.simulate)
            if walking and cand.is_prefill and len(prefills) < MAX_QUEUE:
                if head is None:
                    head = cand.req_id
                prefills.append((cand.history, cand.remaining))
        # This step, then the decodes that rode S-1 steps ago, ..., then last step's.
        self._decodes = ((decode_ms, decode_tokens), *self._recent)
        if not prefills:
            return self.target_ms
        queued = sum(r for _, r in prefills[1:])
        same_head = head == self.head
        # Decodes joining or leaving change every coming step's load: the choice is stale.
        running = _bucket(sum(tokens for _, tokens in self._decodes))
        if same_head and self.target_ms is not None and len(prefills) <= self._n_prefills \
                and queued <= self._queued_tokens and running == self._decodes_seen \
                and not self._costs_changed:
            self._remember(len(prefills), queued)
            return self.target_ms
        self._decodes_seen = running
        self._costs_changed = False
        choice = self.auto.choose(prefills, max_budget, self._decodes, in_flight)
        self._remember(len(prefills), queued)
        if choice is None or not math.isfinite(choice.target_ms) or choice.target_ms <= 0:
            return self.target_ms if same_head else None
        target = choice.target_ms
        if same_head and self.target_ms is not None:
            target = max(target, self.target_ms)
        self.head = head
        self.target_ms = target
        self.choice = choice
        self.choices_made += 1
        return target

    def rebound(self, auto: AutoTarget) -> AutoTargetTracker:
        """A tracker for ``auto`` (a refitted model, a new host time) that keeps this one's
        head, target and recent decodes, and chooses again on its next step under the new
        costs without going below the kept target. Starting afresh instead forgets that the
        head's first choice saw its whole prompt: the next choice sees only the rest, and the
        target falls mid-prompt, which the same-head rule exists to prevent. On a serving
        engine accepted refits come every hundred steps or so, most of them small."""
        new = AutoTargetTracker(auto)
        new.head = self.head
        new.target_ms = self.target_ms
        new.choice = self.choice
        new._n_prefills = self._n_prefills
        new._queued_tokens = self._queued_tokens
        new._decodes_seen = self._decodes_seen
        new._recent.extend(self._recent)
        new._decodes = self._decodes
        new.choices_made = self.choices_made
        new._costs_changed = self.target_ms is not None
        return new

    def _remember(self, n: int, queued: int) -> None:
        self._n_prefills = n
        self._queued_tokens = queued
