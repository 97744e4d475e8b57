"""The run page draws a GPU run's figures where a researcher looks for them: the train MFU in the
throughput panel on an axis of its own (a fraction beside tokens/s), the GPU peak memory of each role in
the memory panel beside the resident peaks; a CPU run's memory panel has no GPU curve at all."""

from __future__ import annotations

import time

import pytest

from posttrain.runs.models import RunState
from posttrain.telemetry.ingestion import events_ingest
from tests.support.browser import open_run_page, screenshot
from tests.unit.platform.helpers import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_dispatch", "storage")]

GPU_STEP = {
    "reward/mean": 0.5,
    "throughput/tokens_per_s": 12000.0,
    "throughput/train_tokens_per_s": 90000.0,
    "throughput/train_mfu": 0.42,
    "memory/driver_peak_gb": 6.5,
    "memory/driver_gpu_peak_gb": 31.2,
}
TRACES = """(id) => { const d = document.getElementById(id);
  return d && d.data ? d.data.map((t) => [t.name, t.yaxis || 'y']) : []; }"""


def open_run(page, web_server, experiment_run, metrics: dict) -> None:
    now = time.time()
    events_ingest(
        experiment_run.pk,
        [
            {
                "run": str(experiment_run.id),
                "seq": 1,
                "type": "status",
                "step": None,
                "time": now,
                "data": {"state": "running"},
            },
            *[
                {
                    "run": str(experiment_run.id),
                    "seq": 1 + step,
                    "type": "metrics",
                    "step": step,
                    "time": now,
                    "data": metrics,
                }
                for step in (1, 2)
            ],
        ],
    )
    open_run_page(page, web_server, experiment_run)


def test_a_gpu_run_shows_its_mfu_in_a_panel_of_its_own_and_its_gpu_memory_per_role(web_server, page, experiment):
    open_run(page, web_server, make_run(experiment, RunState.STARTING), GPU_STEP)
    page.wait_for_function(f"({TRACES})('chart-throughput').length === 2")
    assert set(dict(page.evaluate(TRACES, "chart-throughput"))) == {
        "throughput/tokens_per_s",
        "throughput/train_tokens_per_s",
    }
    page.wait_for_function(f"({TRACES})('chart-mfu').length === 1")  # a fraction: not on the tokens/s axis
    assert set(dict(page.evaluate(TRACES, "chart-mfu"))) == {"throughput/train_mfu"}
    memory = dict(page.evaluate(TRACES, "chart-memory"))
    assert set(memory) == {"memory/driver_peak_gb", "memory/driver_gpu_peak_gb"}
    screenshot(page, "run-gpu-panels")


def test_a_cpu_run_has_no_gpu_memory_curve(web_server, page, experiment):
    cpu_step = {k: v for k, v in GPU_STEP.items() if "gpu" not in k and "mfu" not in k}
    open_run(page, web_server, make_run(experiment, RunState.STARTING), cpu_step)
    page.wait_for_function(f"({TRACES})('chart-memory').length === 1")
    assert [name for name, _ in page.evaluate(TRACES, "chart-memory")] == ["memory/driver_peak_gb"]
    assert "throughput/train_mfu" not in dict(page.evaluate(TRACES, "chart-throughput"))
