"""Annotation speed in the browser: keyboard-only judgements per minute on a review campaign, and the server
time of every action the work page sends.

A fresh Postgres database holds a 100-item single campaign over a run of the demo task (bench/_review.py),
two questions (pass/fail, a 1-5 rating with a rubric). uvicorn serves it (one worker), as `make demo`
does; headless Debian Chromium (Playwright) signs in as the annotator, opens the work page and, for every
item, presses P or F, a digit, and Enter, waiting for the next item to show before the next key. Enter
submits the judgement and claims the next item in the same request, so one item is one request.

Server time per action is the browser's own resource timing of each API request: responseStart −
requestStart (the wait for the first byte, on this machine's loopback: the server's time plus a few tens
of microseconds). Judgements per minute count from the first key to the last item done: what the page
allows, not what a person reads at (the script reads nothing).

    .venv/bin/python bench/review_speed.py [--items 100] [--pg-url postgres://postgres@127.0.0.1:5432]
    .venv/bin/python bench/review_speed.py --smoke     # 10 items

Prints one JSON document on stdout (progress on stderr); exits 1 when an action took longer than the goal
(100 ms server time), 2 when the page cannot be measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OURS_BIN = REPO / ".venv" / "bin"
DB = "bench_review_speed"
USERNAME, PASSWORD = "bench-annotator", "a-long-bench-passphrase"
GOAL_MAX_SERVER_MS = 100.0
CHROMIUM_FLAGS = [  # as tests/e2e/conftest.py
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
ACTIONS = {  # API path -> the action it is
    r"/api/review/campaigns/\d+/next/$": "claim next item",
    r"/api/review/items/\d+/judgement/$": "submit judgement (+ claim next)",
    r"/api/review/queue/$": "read my progress",
}

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK
from bench import _servers  # noqa: E402
from bench._machine import MachineLoad  # noqa: E402
from bench._review import (  # noqa: E402
    campaign_owner,
    demo_rollouts,
    django_setup,
    fresh_database,
    run_with_rollouts,
    tear_down,
)


class BenchError(Exception):
    """The page cannot be measured (exit 2)."""


def log(message: str) -> None:
    print(f"[review-speed {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_campaign(items: int, seed: int) -> int:
    from posttrain.accounts.services import user_create
    from posttrain.review import services as review

    run = run_with_rollouts(demo_rollouts(items, seed))
    annotator = user_create(USERNAME, PASSWORD, "annotator")
    owner, project = campaign_owner()
    campaign = review.campaign_create(
        name="bench review speed",
        kind="single",
        instructions="Is the sum right? Then rate how **plainly** it is said.",
        questions=[
            {"key": "correct", "kind": "pass_fail", "label": "Is the answer correct?"},
            {
                "key": "plain",
                "kind": "rating",
                "label": "Said plainly",
                "min": 1,
                "max": 5,
                "rubric": ["Unreadable.", "Hard to read.", "Readable.", "Plain.", "Just the number."],
            },
        ],
        source={"runs": [str(run.id)], "rule": "random", "k": items, "seed": seed},
        annotators=[annotator],
        project=project,
        user=owner,
    )
    review.campaign_activate(campaign)
    return campaign.pk


def action_of(url: str) -> str | None:
    path = url.split("?", 1)[0]
    return next((name for pattern, name in ACTIONS.items() if re.search(pattern, path)), None)


def summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    p95 = statistics.quantiles(ordered, n=100, method="inclusive")[94] if len(ordered) > 1 else ordered[0]
    return {
        "p50": round(statistics.median(ordered), 1),
        "p95": round(p95, 1),
        "max": round(ordered[-1], 1),
        "n": len(ordered),
    }


def measure(base: str, campaign_id: int, items: int, seed: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        raise BenchError("Debian chromium is missing (scripts/ensure_chromium.sh installs it)")
    server_ms: dict[str, list[float]] = {}
    rng = random.Random(f"{seed}:keys")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()

            def finished(request) -> None:
                action = action_of(request.url)
                timing = request.timing
                if action and timing["responseStart"] >= 0 and timing["requestStart"] >= 0:
                    server_ms.setdefault(action, []).append(timing["responseStart"] - timing["requestStart"])

            page.goto(f"{base}/login/?next=/annotate/{campaign_id}/")
            page.fill("#id_username", USERNAME)
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/annotate/{campaign_id}/", timeout=60_000)
            page.wait_for_selector("body[data-ready=true]", timeout=60_000)
            if not page.locator("#item-box").is_visible():
                raise BenchError("the work page shows no item")
            page.on("requestfinished", finished)
            shown_ms: list[float] = []
            t0 = time.perf_counter()
            for _ in range(items):
                before = page.get_attribute("#item-box", "data-item-id")
                page.keyboard.press("p" if rng.random() < 0.5 else "f")
                page.keyboard.press(str(rng.randint(1, 5)))
                pressed = time.perf_counter()
                page.keyboard.press("Enter")
                page.wait_for_function(
                    "(before) => { const box = document.getElementById('item-box');"
                    " return box.hidden || box.dataset.itemId !== before; }",
                    arg=before,
                    timeout=30_000,
                )
                shown_ms.append((time.perf_counter() - pressed) * 1000)
            elapsed_s = time.perf_counter() - t0
            done = page.locator("#done-title").inner_text() if page.locator("#done-box").is_visible() else None
            page.wait_for_timeout(300)  # the last requests' timing events
            version = browser.version
        finally:
            browser.close()
    return {"server_ms": server_ms, "shown_ms": shown_ms, "elapsed_s": elapsed_s, "done": done, "browser": version}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="10 items: checks the bench runs, measures nothing")
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    args = ap.parse_args()
    machine = MachineLoad()
    items = 10 if args.smoke else args.items

    started = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="bench-review-speed-"))
    server = None
    try:
        env = django_setup(fresh_database(args.pg_url, DB), workdir, redis_url=None)
        campaign_id = make_campaign(items, args.seed)
        from django.db import connections

        connections.close_all()
        server = _servers.start_uvicorn(env, workdir / "uvicorn.log").wait_until_up("/login/", 120)
        base = server.url
        log(f"server up at {base}; campaign {campaign_id} of {items} items")
        result = measure(base, campaign_id, items, args.seed)
        actions = {name: summary(values) for name, values in sorted(result["server_ms"].items())}
        slowest = max((s["max"] for s in actions.values() if s), default=None)
        met = slowest is not None and slowest <= GOAL_MAX_SERVER_MS and result["done"] == "All done"
        doc = {
            "bench": "review_speed",
            "what": "keyboard-only judgements per minute on the annotator's work page, and each action's server time",
            "config": {
                "items": items,
                "smoke": args.smoke,
                "questions": "pass/fail (P/F) and a 1-5 rating with a rubric (a digit); Enter submits and claims next",
                "server": "uvicorn posttrain.asgi:application, 1 worker, Postgres",
                "browser": f"Chromium {result['browser']} (headless, Playwright)",
                "server_time": "resource timing responseStart - requestStart, loopback",
                "cpus": os.cpu_count(),
                "load_average_1m_at_start": load_at_start,
                "load_average_1m_at_end": os.getloadavg()[0],
            },
            "judgements_per_minute": round(items / result["elapsed_s"] * 60, 1),
            "finished": result["done"],
            "server_ms_by_action": actions,
            "enter_to_next_item_shown_ms": summary(result["shown_ms"]),
            "goal": {"max_server_ms_at_most": GOAL_MAX_SERVER_MS, "slowest_ms": slowest, "met": met},
            "total_s": round(time.perf_counter() - started, 1),
            "machine": machine.report(),
        }
        print(json.dumps(doc, indent=2))
        return 0 if met else 1
    except BenchError as exc:
        log(f"cannot measure: {exc}")
        print(json.dumps({"bench": "review_speed", "error": str(exc)}, indent=2))
        return 2
    except Exception:
        path = workdir / "uvicorn.log"
        if path.exists():
            log("--- tail of uvicorn.log ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        raise
    finally:
        tear_down(args.pg_url, DB, workdir, [server], log)


if __name__ == "__main__":
    sys.exit(main())
