"""Today's `Sample` rows move to rollout files: one Parquet file per (run, step) in the rollout store, with
every field of every row (the per-token view's float16 arrays as float32 lists, its pieces as
`token_text`), indexed by a `RolloutFile` row. The next migration drops the table."""

from __future__ import annotations

import base64
from itertools import groupby

import numpy as np
from django.db import migrations

FIELDS = (
    "seq",
    "step",
    "index",
    "group",
    "prompt",
    "response",
    "label",
    "reward",
    "components",
    "advantage",
    "length",
    "finish_reason",
    "errors",
    "kept",
    "turns",
    "env",
    "tokens",
)
# The old per-token view's arrays (base64 float16) by the rollout file's column.
VIEW_ARRAYS = {
    "rollout_logprob": "rollout_logprob",
    "trainer_logprob": "trainer_logprob",
    "entropy": "entropy",
    "advantage": "token_advantage",
}


def _floats(packed: object) -> list[float] | None:
    if not isinstance(packed, str):
        return None
    return np.frombuffer(base64.b64decode(packed), dtype="<f2").astype(np.float32).tolist()


def _step_file(run_id, step: int, rows: list[dict]):
    from posttrain.telemetry.rollouts import rollout_folder
    from posttrain_sdk import rollout_files

    records, token_columns = [], {"token_text": [], **{c: [] for c in VIEW_ARRAYS.values()}}
    for row in rows:
        view = row["tokens"] if isinstance(row["tokens"], dict) else {}
        record = {key: row[key] for key in FIELDS if key not in ("seq", "tokens")}
        if view.get("versions"):
            record["versions"] = view["versions"]
        records.append(record)
        token_columns["token_text"].append(view.get("text") if view.get("text") else None)
        for name, column in VIEW_ARRAYS.items():
            token_columns[column].append(_floats(view.get(name)))
    columns = {name: values for name, values in token_columns.items() if any(v is not None for v in values)}
    table = rollout_files.rows_table(records, step, columns)
    return rollout_files.write_step(rollout_folder(run_id), table, step=step, metadata={"run": str(run_id)})


def samples_to_files(apps, schema_editor):
    Sample = apps.get_model("runs", "Sample")
    RolloutFile = apps.get_model("runs", "RolloutFile")
    run_ids = Sample.objects.order_by().values_list("run_id", flat=True).distinct()
    for run_id in list(run_ids):
        rows = Sample.objects.filter(run_id=run_id).order_by("step", "index").values(*FIELDS).iterator(chunk_size=2000)
        for step, grouped in groupby(rows, key=lambda row: row["step"]):
            step_rows = list(grouped)
            info = _step_file(run_id, step, step_rows)
            RolloutFile.objects.update_or_create(
                run_id=run_id,
                step=step,
                part=0,
                defaults={
                    "seq": max(row["seq"] for row in step_rows),
                    "name": info.name,
                    "rows": info.rows,
                    "bytes": info.bytes,
                    "sha256": info.sha256,
                    "stats": info.stats,
                },
            )


class Migration(migrations.Migration):
    dependencies = [("runs", "0011_rollout_files")]

    # Backwards: the index rows go; the files stay in the store (the Sample rows are not rebuilt).
    operations = [migrations.RunPython(samples_to_files, migrations.RunPython.noop, elidable=True)]
