"""The whole product in a real browser on real servers: a researcher uploads a dataset, launches a run
from the form, watches its curves and rollouts grow live (browser → Celery → Ray job → engine → events
→ SSE → plotly), opens a sample, cancels another run and compares the two with a config diff.

The web server ends every live stream after 3 s (POSTTRAIN_SSE_MAX_STREAM_S), so the page's
EventSource reconnects with Last-Event-ID many times during the run: the curve it drew must hold every
step exactly once, as the API stores them.

A second journey picks a policy loss and a rollout correction in the form (GSPO with token TIS), with
their help shown as they are chosen, and watches the run draw its rollout-correction curves."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.support.browser import PASSWORD, log_in, open_ready, screenshot
from tests.support.stack import PlatformStack, platform_stack, postgres_url, stop_ray_jobs, tiny_demo_assets
from tests.unit.platform.helpers import default_project, grant_server_paths, join

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUN_TIMEOUT_MS = 180_000
REWARD_POINTS = "() => { const d = document.getElementById('chart-reward'); return d && d.data && d.data.length ? d.data[0].x.length : 0; }"


@pytest.fixture(scope="module")
def demo_assets(tmp_path_factory) -> Path:
    return tiny_demo_assets(tmp_path_factory, "journey-demo")


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, ray_head, tmp_path_factory) -> Iterator[PlatformStack]:
    from django.db import connection

    home = tmp_path_factory.mktemp("journey-stack")
    with platform_stack(
        ray_head, home, postgres_url(connection.settings_dict), extra_env={"POSTTRAIN_SSE_MAX_STREAM_S": "3"}
    ) as stack:
        try:
            yield stack
        finally:
            stop_ray_jobs(ray_head)


def config_input(page, loc: str):
    return page.locator(f'.sf-field[data-loc="{loc}"] input')


def launch_from_form(page, base: str, assets: dict, *, name: str, steps: int, seed: int) -> str:
    open_ready(page, f"{base}/launch/")
    page.fill("#exp-name", name)
    page.select_option("#exp-model", str(assets["model"].pk))
    page.select_option("#exp-dataset", str(assets["dataset"].pk))
    page.select_option("#reward-add", str(assets["reward"].pk))
    for section in ("checkpoint", "logging"):  # folded by default
        page.click(f'details.sf-section[data-loc="{section}"] > summary')
    config_input(page, "seed").fill(str(seed))
    config_input(page, "train.steps").fill(str(steps))
    config_input(page, "rollout.prompts_per_step").fill("2")
    config_input(page, "rollout.samples_per_prompt").fill("4")
    config_input(page, "rollout.max_new_tokens").fill("4")
    config_input(page, "logging.eval_every").fill("0")
    config_input(page, "logging.heartbeat_s").fill("1")
    config_input(page, "checkpoint.every_steps").fill("10")
    expect(page.locator("#validation-status")).to_contain_text("Valid", timeout=20_000)
    page.click("#launch-button")
    page.wait_for_url(re.compile(r".*/runs/[0-9a-f-]{36}/$"))
    page.wait_for_selector("body[data-ready=true]")
    return page.url.rstrip("/").rsplit("/", 1)[-1]


def test_a_researcher_launches_watches_cancels_and_compares_in_the_browser(stack, page, demo_assets):
    from posttrain.accounts.services import user_create
    from posttrain.registry.models import Dataset
    from posttrain.registry.services import model_register, reward_create
    from posttrain.telemetry.models import MetricRow

    base = stack.web.url
    researcher = grant_server_paths(
        join(user_create("barbara", PASSWORD, "researcher"), "maintainer")
    )  # an admin's grant
    assets = {
        "model": model_register("tiny demo", str(demo_assets / "model"), user=researcher, project=default_project()),
        "reward": reward_create(
            "correct", "builtin", {"type": "exact_match"}, user=researcher, project=default_project()
        ),
    }
    log_in(page, base, "barbara")

    # Upload the prompts on the registry page.
    open_ready(page, f"{base}/registry/")
    page.set_input_files("#dataset-file", str(demo_assets / "data" / "train.jsonl"))
    page.fill("#dataset-name", "sums")
    page.fill("#dataset-prompt-field", "prompt")
    page.fill("#dataset-label-field", "label")
    page.click("#dataset-form button[type=submit]")
    expect(page.locator("#dataset-rows tr", has_text="sums")).to_contain_text("5000")
    assets["dataset"] = Dataset.objects.get(name="sums")

    # Launch from the form; the browser lands on the run page and stays there (no reload from here on).
    first = launch_from_form(page, base, assets, name="sums journey", steps=60, seed=1)
    page.evaluate("window.__sameDocument = true")

    # Record, inside the page, how the reward curve and the rollout browser change as events arrive:
    # however fast the engine is on this machine, the growth is observed, not raced against.
    page.evaluate(f"""() => {{
        window.__seen = {{points: [], steps: []}};
        setInterval(() => {{
            const points = ({REWARD_POINTS})();
            const row = document.querySelector('#samples-table tbody tr[data-sample]');
            const step = row ? row.dataset.sample.split(':')[0] : null;  // the step the table shows
            if (window.__seen.points.at(-1) !== points) window.__seen.points.push(points);
            if (step && window.__seen.steps.at(-1) !== step) window.__seen.steps.push(step);
        }}, 50);
    }}""")
    page.wait_for_function(f"({REWARD_POINTS})() >= 3", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#stream-status")).to_have_attribute("data-status", re.compile("live|reconnecting"))
    screenshot(page, "journey-run-live")
    expect(page.locator("#samples-table tbody tr[data-sample]")).to_have_count(8)  # 2 prompts × 4 samples

    # Open a sample, with special tokens and whitespace made visible on demand.
    page.locator("#samples-table tbody tr[data-sample]").first.click()
    dialog = page.locator("#sample-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Prompt")
    expect(dialog).to_contain_text("Response")
    page.check("#show-special")
    expect(dialog.locator("pre.sample-text").first).to_have_text(re.compile(r"^\d+\+\d+=$"))
    screenshot(page, "journey-sample")
    page.click("#sample-close")

    # The run finishes; the page saw every step exactly once through all the stream reconnects.
    expect(page.locator("#run-state")).to_have_attribute("data-state", "succeeded", timeout=RUN_TIMEOUT_MS)
    stored = list(MetricRow.objects.filter(run_id=first).order_by("step").values_list("step", flat=True))
    assert stored == list(range(1, 61))
    page.wait_for_function(f"({REWARD_POINTS})() >= 60", timeout=30_000)
    drawn = page.evaluate("() => document.getElementById('chart-reward').data[0].x")
    assert drawn == stored
    expect(page.locator('#checkpoints-table tr[data-step="60"]')).to_contain_text("Register as model")
    expect(page.locator('#checkpoints-table tr[data-step="10"]')).to_contain_text(
        "pruned"
    )  # keep_last=2 of 10, 20, …, 60
    # The prompt ledger: 60 steps of 2 prompts drew 120 rows of epoch 0, each with a fate, none skipped or twice.
    ledger_cells = """() => [...document.querySelectorAll('#ledger-table tr[data-epoch="0"] td.num')]
        .map((td) => Number(td.textContent))"""
    # Reloaded when the run ended: wait for the end's figures (no row in flight) rather than race the reload.
    page.wait_for_function(f"(({ledger_cells})()).length === 7 && (({ledger_cells})())[3] === 0", timeout=30_000)
    cells = page.evaluate(ledger_cells)
    epoch, rows, trained, in_flight, not_drawn, skipped, twice = cells
    assert (epoch, rows - not_drawn, in_flight, skipped, twice) == (0, 120, 0, 0, 0), cells
    assert 0 <= trained <= 120  # the rest were filtered (a tiny policy often ties a group), each with its reason
    assert page.evaluate("window.__sameDocument") is True
    seen = page.evaluate("window.__seen")
    # The curve grew in place several times, and new steps' samples replaced the table, without a reload.
    assert len(seen["points"]) >= 4 and seen["points"] == sorted(seen["points"]), seen
    assert len(seen["steps"]) >= 2 and [int(s) for s in seen["steps"]] == sorted(int(s) for s in seen["steps"]), seen
    screenshot(page, "journey-run-finished")

    # Cancel another run: a clone with a longer schedule, cancelled from its page while it trains.
    second = launch_from_form(page, base, assets, name="sums journey long", steps=2000, seed=2)
    expect(page.locator("#run-state")).to_have_attribute("data-state", "running", timeout=RUN_TIMEOUT_MS)
    page.click("#cancel-run")
    expect(page.locator("#run-state")).to_have_attribute("data-state", "cancelled", timeout=90_000)
    screenshot(page, "journey-cancelled")

    # Compare the two runs: the config diff shows exactly the fields that differ.
    page.goto(f"{base}/compare/?runs={first},{second}")
    page.wait_for_selector("#config tr[data-path]")
    differing = set(page.eval_on_selector_all("#config tr[data-path]", "rows => rows.map(r => r.dataset.path)"))
    assert {"seed", "train.steps", "name"} <= differing
    assert "rollout.samples_per_prompt" not in differing
    screenshot(page, "journey-compare")


CORR_POINTS = "(id) => { const d = document.getElementById(id); return d && d.data ? d.data.map((t) => [t.name, t.x.length]) : []; }"


def test_a_gspo_run_with_tis_correction_launched_from_the_form_draws_its_rollout_correction_curves(
    stack, page, demo_assets, settings
):
    from posttrain.accounts.services import user_create
    from posttrain.registry.services import dataset_register_path, model_register, reward_create
    from posttrain.runs.models import Run
    from posttrain.telemetry.models import MetricRow

    base = stack.web.url
    settings.STORAGE_ROOT = stack.storage  # the dataset's copy goes where the stack's web process keeps datasets
    researcher = grant_server_paths(
        join(user_create("grace", PASSWORD, "researcher"), "maintainer")
    )  # an admin's grant
    model = model_register("tiny demo gspo", str(demo_assets / "model"), user=researcher, project=default_project())
    reward = reward_create(
        "correct answer", "builtin", {"type": "exact_match"}, user=researcher, project=default_project()
    )
    dataset, _ = dataset_register_path(
        "sums gspo", str(demo_assets / "data" / "train.jsonl"), user=researcher, project=default_project()
    )
    log_in(page, base, "grace")

    open_ready(page, f"{base}/launch/")
    page.fill("#exp-name", "sums gspo tis")
    page.select_option("#exp-model", str(model.pk))
    page.select_option("#exp-dataset", str(dataset.pk))
    page.select_option("#reward-add", str(reward.pk))
    loss = page.locator('.sf-field[data-loc="algorithm.policy_loss"]')
    expect(loss.locator("select")).to_have_value("0")  # ppo_clip, the default
    expect(loss.locator(".sf-choice-help")).to_contain_text("PPO's clipped surrogate")
    loss.locator("select").select_option(label="gspo")
    expect(loss.locator(".sf-choice-help")).to_contain_text("one ratio per sequence")
    method = page.locator('.sf-field[data-loc="algorithm.rollout_correction.method"]')
    method.locator("select").select_option(label="token_tis")
    expect(method.locator(".sf-choice-help")).to_contain_text("Token TIS")
    screenshot(page, "gspo-tis-launch")
    for section in ("logging",):  # folded by default
        page.click(f'details.sf-section[data-loc="{section}"] > summary')
    config_input(page, "train.steps").fill("6")
    config_input(page, "rollout.prompts_per_step").fill("2")
    config_input(page, "rollout.samples_per_prompt").fill("4")
    config_input(page, "rollout.max_new_tokens").fill("4")
    # Four tokens from the tiny model: most groups score alike, and the default filter would drop every one
    # of them (no update, no correction to draw); keep them all.
    page.locator('.sf-field[data-loc="rollout.filters.zero_advantage"] select').select_option(label="false")
    config_input(page, "logging.eval_every").fill("0")
    config_input(page, "logging.heartbeat_s").fill("1")
    expect(page.locator("#validation-status")).to_contain_text("Valid", timeout=20_000)
    expect(page.locator("#yaml-text")).to_have_value(re.compile(r"policy_loss: gspo"))
    expect(page.locator("#yaml-text")).to_have_value(re.compile(r"rollout_correction:\n    method: token_tis"))
    page.click("#launch-button")
    page.wait_for_url(re.compile(r".*/runs/[0-9a-f-]{36}/$"))
    page.wait_for_selector("body[data-ready=true]")
    run_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    run = Run.objects.get(pk=run_id)
    algorithm = run.resolved_config["algorithm"]
    assert (algorithm["policy_loss"], algorithm["rollout_correction"]["method"]) == ("gspo", "token_tis")

    expect(page.locator("#run-state")).to_have_attribute("data-state", "succeeded", timeout=RUN_TIMEOUT_MS)
    stored = list(MetricRow.objects.filter(run_id=run_id).order_by("step").values_list("step", flat=True))
    assert stored == list(range(1, 7))
    for chart, wanted in (
        ("chart-rollout_corr", {"rollout_corr/kl", "rollout_corr/log_ppl_abs_diff"}),
        ("chart-rollout_corr_chi2", {"rollout_corr/chi2_token", "rollout_corr/chi2_seq"}),
        ("chart-rollout_corr_weights", {"rollout_corr/weight_p05", "rollout_corr/weight_p95"}),
        ("chart-rollout_corr_dropped", {"rollout_corr/truncated_fraction"}),
    ):
        page.wait_for_function(
            f"(({CORR_POINTS})('{chart}').filter(([, n]) => n >= 6).length) >= {len(wanted)}", timeout=30_000
        )
        drawn = dict(page.evaluate(f"({CORR_POINTS})('{chart}')"))
        assert wanted <= set(drawn), drawn
        assert all(drawn[name] == 6 for name in wanted), drawn
    expect(page.locator("#chart-rollout_corr")).to_contain_text("Rollout correction")
    screenshot(page, "gspo-tis-run")
