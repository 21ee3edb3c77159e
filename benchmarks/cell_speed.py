"""How fast the machine ran during one benchmark cell, apart from the policy it served.

The 2-core VM the benchmarks run on changes speed for tens of seconds at a time. In the
16k same-arrivals run (`engine_bench_auto_vs_base_same_16k`) auto's first 14 steps, the same
chunks in every round, took 414-488 ms in rounds 1 and 4 and 546-688 ms in round 5; base's
cells stayed within 3% of their usual speed. A 30-second cell that meets such a stretch is
10-40% slower for reasons no policy controls, and five rounds do not average that away.

Two figures per cell, neither of which depends on which policy ran:

* ``slowdown``: the median over the cell's prefill steps of the wall time each step took (the
  interval between its trace line and the one before; the lines are stamped as each step's
  output comes back) over the startup sweep's latency model. The sweep model is fixed for the
  whole run, so the figure moves with the machine; its bias for a policy's step shapes is the
  same in every round and cancels when each policy's rounds are taken over its own median
  (:func:`relative`).
* ``steal_s``: CPU time the hypervisor gave to other guests during the cell (``/proc/stat``),
  where the kernel reports it.

And one figure that does depend on the policy: ``worker_faults``, the page faults vLLM's
workers took during the cell (``/proc/<pid>/stat``). A step larger than the memory a worker's
allocator still holds maps fresh pages, and on these VMs that costs far more than the step's
compute; the latency model has no term for it. How much more is a property of the run, read
once at its start (:func:`guest_memory`): where a virtio balloon reports freed pages to the
host, a first touch waits for the host to back the page again. A run takes that cost out of
its cells by filling each worker's heap once before them (:func:`fill_heap`).

:func:`request_slowdowns` takes the slowdown over each request's wait for its first token
alone: a slow stretch often covers part of a cell (round 5's above: the first wave's 14 steps,
not the rest), and the requests that waited through it carry it. :func:`adjusted_by_request`
divides each request's TTFT by its slowdown relative to the same request's median over the
rounds (the same arrival slot meets the same kind of steps), and averages: the round's TTFT
at the policy's usual speed. The raw figures stay the verdicts; the adjusted ones say how much
of a spread is the machine, and the run order of the cells (slow stretches spanning adjacent
cells of different policies) says whether it was.
"""

from __future__ import annotations

import mmap
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_ascend_cpp.core.latency_model import LatencyModel
from vllm_ascend_cpp.sim.profile import step_items

# An interval this much longer than the model's forecast is an idle wait for an arrival, not a
# slow step; the median would mostly ignore it, a short cell may not.
IDLE_FACTOR = 5.0


def steal_s(stat_path: str = "/proc/stat") -> float | None:
    """Seconds of steal time since boot, summed over CPUs; None where not reported."""
    try:
        with open(stat_path, encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    # "cpu user nice system idle iowait irq softirq steal ...": steal is the 8th counter.
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def worker_faults(proc: str = "/proc", title: str = "VLLM::") -> int | None:
    """Page faults (minor and major) taken so far by the processes whose title starts with
    ``title`` (vLLM names its engine core and worker processes ``VLLM::...``); None when
    there is none. Summed over processes, so a difference across a cell counts what the
    workers took during it as long as none started or ended in between."""
    total = 0
    found = False
    try:
        pids = [d for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as fh:
                if not fh.read(len(title)).startswith(title.encode()):
                    continue
            with open(os.path.join(proc, pid, "stat"), encoding="ascii") as fh:
                stat = fh.read()
        except OSError:
            continue
        faults = _stat_faults(stat)
        if faults is None:
            continue
        total += faults
        found = True
    return total if found else None


def _stat_faults(stat: str) -> int | None:
    """Minor plus major page faults from the text of a ``/proc/<pid>/stat``."""
    # "pid (comm) state ppid ...": comm may hold spaces; minflt and majflt are the 10th
    # and 12th fields, the 8th and 10th after the closing parenthesis.
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 10:
        return None
    return int(fields[7]) + int(fields[9])


def fill_heap(worker: Any, mib: int) -> dict:
    """Run in each vLLM worker (``collective_rpc``): take ``mib`` MiB from the allocator the
    way an activation does (a torch tensor), write every page, and give it back.

    The workers' allocator (tcmalloc, never releasing: ``cpu_env``) keeps that memory, backed,
    for the steps that follow. Without it, a step larger than any the heap has held grows the
    heap onto fresh pages, and on VMs whose balloon reports freed pages each one costs about
    20 us: the stalls that fell on auto's largest steps. With it, every policy starts on a
    heap that has already held one step far larger than any it serves. Returns the page faults
    and seconds the fill took in this worker. ``worker`` is vLLM's, unused."""
    import torch

    with open("/proc/self/stat", encoding="ascii") as fh:
        before = _stat_faults(fh.read()) or 0
    t0 = time.perf_counter()
    block = torch.empty(int(mib) << 20, dtype=torch.uint8)
    block.fill_(1)
    del block
    seconds = time.perf_counter() - t0
    with open("/proc/self/stat", encoding="ascii") as fh:
        after = _stat_faults(fh.read()) or 0
    return {"pid": os.getpid(), "faults": after - before, "s": round(seconds, 2)}


# virtio's device id of a memory balloon, and the feature bit by which its driver reports
# freed guest pages to the host (VIRTIO_BALLOON_F_REPORTING).
_BALLOON_DEVICE = 0x0005
_REPORTING_BIT = 5
_PAGE = 4096


def reporting_balloons(sys_virtio: str = "/sys/bus/virtio") -> list[str]:
    """The virtio balloon devices whose driver hands freed guest memory back to the host.

    The host then drops those pages, and the guest's next touch of each one waits for the host
    to back it again. On the test bed's VMs that made a page fault cost about 20 us instead of
    0.5 (1 GiB touched 15 s after it was last freed: 5.1 s; right after: 0.14 s), and vLLM's
    workers take such faults whenever a step needs more memory than their allocator holds:
    61k in one auto cell, whose largest step ran 1.2 s where 0.35 were predicted."""
    out = []
    devices = os.path.join(sys_virtio, "devices")
    try:
        names = sorted(os.listdir(devices))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(devices, name, "device"), encoding="ascii") as fh:
                if int(fh.read().strip(), 16) != _BALLOON_DEVICE:
                    continue
            with open(os.path.join(devices, name, "features"), encoding="ascii") as fh:
                bits = fh.read().strip()
        except (OSError, ValueError):
            continue
        if not os.path.exists(os.path.join(devices, name, "driver")):
            continue
        if len(bits) > _REPORTING_BIT and bits[_REPORTING_BIT] == "1":
            out.append(name)
    return out


def stop_page_reporting(sys_virtio: str = "/sys/bus/virtio") -> list[str]:
    """Unbind the balloon driver from every device in :func:`reporting_balloons` (root only),
    so that memory the guest has touched once stays backed; returns the devices unbound.
    Raises PermissionError where that is not allowed."""
    done = []
    for name in reporting_balloons(sys_virtio):
        with open(os.path.join(sys_virtio, "drivers", "virtio_balloon", "unbind"), "w",
                  encoding="ascii") as fh:
            fh.write(name)
        done.append(name)
    return done


def _touch_s(mib: int) -> float:
    """Seconds to touch every page of ``mib`` MiB of fresh anonymous memory once, then free it."""
    if mib <= 0:
        return 0.0
    size = mib << 20
    buf = mmap.mmap(-1, size)
    try:
        t0 = time.perf_counter()
        for off in range(0, size, _PAGE):
            buf[off] = 1
        return time.perf_counter() - t0
    finally:
        buf.close()


def first_touch_us(mib: int = 256) -> float:
    """Wall time per 4 KiB page to touch ``mib`` MiB of fresh anonymous memory once."""
    return _touch_s(mib) / ((mib << 20) // _PAGE) * 1e6


def touch_free_memory(reserve_mib: int = 1536, meminfo: str = "/proc/meminfo") -> dict:
    """Touch all memory the kernel reports available but ``reserve_mib`` MiB, once, then free
    it: with page reporting stopped, every page the workers take later is already backed.
    Returns the MiB touched and the seconds it took."""
    try:
        with open(meminfo, encoding="ascii") as fh:
            avail_kib = next(int(line.split()[1]) for line in fh
                             if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return {"mib": 0, "s": 0.0}
    mib = max(0, avail_kib // 1024 - int(reserve_mib))
    return {"mib": mib, "s": round(_touch_s(mib), 1)}


def guest_memory(mib: int = 256) -> dict:
    """What a page fault costs on this machine now: whether freed memory goes back to the
    host, and the cost per page of touching ``mib`` MiB twice (the second pass takes the pages
    the first one just freed, backed by the host whatever the first found)."""
    return {"page_reporting": bool(reporting_balloons()),
            "first_touch_us_per_page": round(first_touch_us(mib), 2),
            "again_us_per_page": round(first_touch_us(mib), 2)}


def sweep_model(report: Mapping) -> LatencyModel | None:
    """The startup sweep's model from an engine's profiling report: the run's fixed
    yardstick of machine speed (None without coefficients)."""
    coefficients = report.get("coefficients")
    return LatencyModel.from_dict(coefficients) if coefficients else None


def cell_slowdown(lines: Sequence[Mapping], model: Any) -> float | None:
    """Median over the cell's prefill steps of the step's wall interval over ``model``'s
    forecast of it (``model.step_ms``); None with no such step."""
    ratios = []
    for prev, line in zip(lines, lines[1:]):
        if not line.get("requests"):
            continue
        t0, t1 = prev.get("time"), line.get("time")
        if not isinstance(t0, (int, float)) or not isinstance(t1, (int, float)):
            continue
        items = step_items(line)
        if items is None:
            continue
        forecast = model.step_ms(items)
        wall = (t1 - t0) * 1e3
        if forecast > 0 and 0 < wall < IDLE_FACTOR * forecast:
            ratios.append(wall / forecast)
    return statistics.median(ratios) if ratios else None


def request_slowdowns(lines: Sequence[Mapping], model: Any, start_wall: float,
                      arrivals_s: Sequence[float], ttfts_s: Sequence[float]) -> list[float | None]:
    """Per request, the slowdown (:func:`cell_slowdown`) of the steps that finished while it
    waited for its first token: from its arrival (``start_wall`` + arrival, wall clock as the
    trace stamps) to its first token. A stretch of slow machine within a cell lands on the
    requests that waited through it; None for a request no prefill step finished for."""
    out: list[float | None] = []
    times = [ln.get("time") for ln in lines]
    for arrival, ttft in zip(arrivals_s, ttfts_s):
        lo, hi = start_wall + arrival, start_wall + arrival + ttft
        inside = [i for i, t in enumerate(times) if isinstance(t, (int, float)) and lo <= t <= hi]
        # The line before the first one inside opens that step's interval.
        out.append(cell_slowdown(lines[max(0, inside[0] - 1):inside[-1] + 1], model)
                   if inside else None)
    return out


def relative(slowdowns: Sequence[float | None]) -> list[float] | None:
    """Each round's slowdown over the median round's (None unless every round has one)."""
    if not slowdowns or any(s is None or s <= 0 for s in slowdowns):
        return None
    mid = statistics.median(slowdowns)
    return [s / mid for s in slowdowns]


def adjusted(ttfts: Sequence[float], slowdowns: Sequence[float | None]) -> list[float] | None:
    """Each round's TTFT at the policy's median-round machine speed, one slowdown per round
    (None when a round has none)."""
    rel = relative(slowdowns)
    if rel is None or len(rel) != len(ttfts):
        return None
    return [t / r for t, r in zip(ttfts, rel)]


def request_relative(slowdowns: Sequence[Sequence[float | None]]
                     ) -> list[list[float | None]] | None:
    """Per round, each request's slowdown over the same request's median over the rounds
    (the same arrival slot, the same kind of steps); None when the rounds do not line up."""
    if not slowdowns or any(len(s) != len(slowdowns[0]) for s in slowdowns):
        return None
    usual = []
    for i in range(len(slowdowns[0])):
        seen = [s[i] for s in slowdowns if s[i] is not None and s[i] > 0]
        usual.append(statistics.median(seen) if seen else None)
    return [[None if u is None or f is None or f <= 0 else f / u for f, u in zip(s, usual)]
            for s in slowdowns]


def adjusted_by_request(ttfts: Sequence[Sequence[float]],
                        slowdowns: Sequence[Sequence[float | None]]) -> list[float] | None:
    """Each round's mean TTFT with every request at its usual speed: its TTFT over its
    :func:`request_relative` slowdown. A request without a slowdown counts as it ran. None
    when the rounds do not line up."""
    rel = request_relative(slowdowns)
    if rel is None or len(ttfts) != len(rel) or any(len(t) != len(r) for t, r in zip(ttfts, rel)):
        return None
    return [statistics.mean(x if f is None else x / f for x, f in zip(t, r))
            for t, r in zip(ttfts, rel)]
