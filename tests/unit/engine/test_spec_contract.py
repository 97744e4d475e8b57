"""The engine's contract with the platform (rl_engine.spec) imports and works with torch, transformers, ray,
vllm and deepspeed made unimportable: the web process validates configs, plans admissions, reads
checkpoints and scores a reward without loading any of them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

HEAVY = ("torch", "transformers", "ray", "vllm", "deepspeed", "peft")

# Run in a fresh interpreter: a finder first on sys.meta_path refuses the heavy packages (as on a host
# without them), then every module of the contract is imported and each of its parts is used once.
PROGRAM = textwrap.dedent(
    """
    import importlib.abc, json, sys, tempfile
    from pathlib import Path

    HEAVY = set(sys.argv[1].split(","))

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HEAVY:
                raise ImportError(f"{name} is unimportable in this test")
            return None

    sys.meta_path.insert(0, Refuse())

    from rl_engine.ledger import Draw, PromptLedger
    from rl_engine.spec import catalogues, checkpoints, config, jobs, ledger, resources, user_code

    folder = Path(tempfile.mkdtemp())
    cfg = config.demo_run_config(folder)
    text = config.dump_config(cfg)
    again = config.validate_config(config.apply_overrides(config.parse_text(text), ["train.steps=3"]))
    try:
        config.validate_config({"name": "x"})
        refused = None
    except config.ConfigError as exc:
        refused = sorted(e["loc"] for e in exc.errors)
    needs = resources.resource_needs(again)

    (folder / "checkpoints" / "step_2").mkdir(parents=True)
    (folder / "checkpoints" / "step_10").mkdir()
    latest = checkpoints.latest_checkpoint(folder)
    request = jobs.request_preemption(folder, "make room")
    asked = request.exists()
    jobs.clear_request(folder)

    (folder / "rows.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\\n')
    rows = user_code.read_rows(folder / "rows.jsonl")
    batch = user_code.RewardBatch.build(["1+1="], ["2"], ["2"])
    with user_code.CompositeReward([(user_code.build_component({"type": "exact_match"}), 1.0)]) as reward:
        scored = reward.score(batch).total

    written = PromptLedger(3)
    written.draw(1, [Draw(0, 2)])
    written.write_parquet(folder / ledger.LEDGER_FILE)
    summary = ledger.read_metadata(folder / ledger.LEDGER_FILE)

    print(json.dumps({
        "ledger_in_flight": summary["epochs"][0]["in_flight"],
        "steps": again.train.steps,
        "schema_sections": sorted(config.config_json_schema()["properties"])[:3],
        "refused": refused,
        "driver_cpus": needs["driver"]["CPU"],
        "latest": latest.name,
        "step_of": checkpoints.checkpoint_step(latest),
        "asked": asked,
        "cleared": not request.exists(),
        "rows": rows,
        "score": scored,
        "panels": len(catalogues.catalogue_json()["panels"]) > 0,
        "metric": catalogues.require("reward/mean"),
        "sandbox_status": type(user_code.sandbox.status()).__name__,
        "heavy_loaded": sorted(m for m in sys.modules if m.partition(".")[0] in HEAVY),
    }))
    """
)


def test_the_contract_works_with_the_deep_learning_libraries_unimportable():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, ",".join(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["heavy_loaded"] == []
    assert got["ledger_in_flight"] == 1
    assert got["steps"] == 3 and got["refused"] and "model" in got["refused"]
    assert got["schema_sections"] and got["driver_cpus"] > 0
    assert (got["latest"], got["step_of"]) == ("step_10", 10)
    assert got["asked"] and got["cleared"]
    assert got["rows"] == [{"prompt": "1+1=", "label": "2"}]
    assert got["score"] == [1.0]
    assert got["panels"] and got["metric"] == "reward/mean" and got["sandbox_status"] == "SandboxStatus"
