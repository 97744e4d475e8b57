"""Judge agreement: the exact-match reward as a judge of a 200-item review campaign of the demo task, against
seeded human labels.

The rollouts are the demo task's RL prompts with seeded responses of five kinds (bench/_review.py): the
right sum, a wrong one, the right sum in words, the right sum with a stray number after it, a wrong sum that
quotes the right one. Three annotators label "is the answer correct?" with the truth, each flipping it with
probability --human-noise (seeded); their labels go in through the review services, as the judgement
endpoint stores them. The judge run is the real path: recorded by the service, sent to Celery by name,
routed to the `user_code` queue, scored by a Celery worker consuming that queue (started here) with the
registry's exact-match reward. The report is the campaign's own (posttrain.review.selectors.judge_agreement):
Cohen's kappa, true and false positive rates with the humans as the truth, the items the judge gets wrong
(broken down here by response kind), and the annotators' own agreement.

    .venv/bin/python bench/judge_agreement.py [--items 200] [--human-noise 0.05] [--seed 0] \
        [--pg-url postgres://postgres@127.0.0.1:5432] [--redis-url redis://127.0.0.1:6379/0]
    .venv/bin/python bench/judge_agreement.py --smoke     # 20 items

Prints one JSON document on stdout (progress on stderr); exits 1 if the judge run did not finish.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OURS_BIN = REPO / ".venv" / "bin"
DB = "bench_judge_agreement"
ANNOTATORS = ("ann", "bob", "cat")
WORKER_READY_S = 90
JUDGE_WAIT_S = 600

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


def log(message: str) -> None:
    print(f"[judge-agreement {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def start_worker(env: dict[str, str], workdir: Path) -> _servers.Server:
    """A Celery worker on the user_code queue only, as a deployment runs user code; once it says `ready.`."""
    log_path = workdir / "worker.log"
    command = [str(OURS_BIN / "celery"), "-A", "workers.celery_app", "worker", "-Q", "user_code", "--pool", "solo"]
    command += ["--loglevel", "INFO", "--without-gossip", "--without-mingle", "--purge"]
    worker = _servers.start("user_code worker", command, env=env, log_path=log_path)
    deadline = time.monotonic() + WORKER_READY_S
    while "ready." not in log_path.read_text():
        if worker.process.poll() is not None or time.monotonic() > deadline:
            raise worker.failure("did not say it was ready")
        time.sleep(0.3)
    return worker


def human_labels(rollouts: list[dict], noise: float, seed: int) -> dict[str, list[bool]]:
    rng = random.Random(f"{seed}:humans")
    return {name: [r["right"] != (rng.random() < noise) for r in rollouts] for name in ANNOTATORS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--human-noise", type=float, default=0.05, help="each annotator's chance to flip the truth")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="20 items: checks the bench runs, measures nothing")
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    args = ap.parse_args()
    machine = MachineLoad()
    items = 20 if args.smoke else args.items

    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench-judge-agreement-"))
    worker = None
    try:
        env = django_setup(fresh_database(args.pg_url, DB), workdir, args.redis_url)
        from django.db import transaction

        from posttrain.accounts.services import user_create
        from posttrain.registry.models import RewardFunction
        from posttrain.review import judging, selectors
        from posttrain.review import services as review

        rollouts = demo_rollouts(items, args.seed)
        run = run_with_rollouts(rollouts)
        people = [user_create(name, "a-long-bench-passphrase", "annotator") for name in ANNOTATORS]
        owner, project = campaign_owner()
        campaign = review.campaign_create(
            name="is the sum right",
            kind="single",
            questions=[{"key": "correct", "kind": "pass_fail", "label": "Is the answer correct?"}],
            source={"runs": [str(run.id)], "rule": "random", "k": items, "seed": args.seed},
            overlap=len(ANNOTATORS),
            annotators=people,
            project=project,
            user=owner,
        )
        review.campaign_activate(campaign)
        labels = human_labels(rollouts, args.human_noise, args.seed)
        by_prompt = {r["prompt"]: i for i, r in enumerate(rollouts)}
        t0 = time.perf_counter()
        for item in campaign.items.select_related("rollout_a", "campaign"):
            for user in people:
                review.judgement_submit(
                    item, user, {"correct": labels[user.username][by_prompt[item.rollout_a.prompt]]}
                )
        judged_s = time.perf_counter() - t0
        log(f"{items} items, {items * len(ANNOTATORS)} human judgements stored in {judged_s:.1f}s")

        worker = start_worker(env, workdir)
        exact = RewardFunction.objects.create(
            name="exact match", kind="builtin", spec={"type": "exact_match", "name": "exact_match"}
        )
        t0 = time.perf_counter()
        with transaction.atomic():
            judge = judging.judge_run_create(campaign, exact)  # sent after commit, as from a web request
        deadline = time.monotonic() + JUDGE_WAIT_S
        while judge.state not in ("done", "failed") and time.monotonic() < deadline:
            time.sleep(0.2)
            judge.refresh_from_db()
        judge_s = time.perf_counter() - t0
        if judge.state != "done":
            log(f"the judge run is {judge.state} after {judge_s:.0f}s: {judge.error}")
            print(json.dumps({"bench": "judge_agreement", "error": f"judge run {judge.state}: {judge.error}"}))
            return 1

        report = selectors.judge_agreement(judge)
        (question,) = report["questions"]
        kind_of = {r["prompt"]: r["kind"] for r in rollouts}
        humans = selectors.agreement(campaign)
        truth_vs_labels = Counter(
            (r["right"], selectors.campaign_labels(campaign).labels[item.pk]["correct"].value)
            for item in campaign.items.select_related("rollout_a")
            for r in [rollouts[by_prompt[item.rollout_a.prompt]]]
        )
        doc = {
            "bench": "judge_agreement",
            "what": "exact-match reward as a judge of a demo-task campaign, against seeded human labels",
            "config": {
                "items": items,
                "smoke": args.smoke,
                "annotators": len(ANNOTATORS),
                "human_noise": args.human_noise,
                "seed": args.seed,
                "response_kinds": dict(sorted(Counter(r["kind"] for r in rollouts).items())),
                "judge": "registry builtin exact_match (numeric: the response's last number against the label)",
                "path": "judge_run_create -> Celery task workers.review_judge_run -> user_code queue -> worker",
                "cpus": os.cpu_count(),
                "load_average_1m": os.getloadavg()[0],
            },
            "judge": {
                "items": question["items"],
                "kappa": question["kappa"],
                "agreement": question["agreement"],
                "tpr": question["rates"]["tpr"],
                "fpr": question["rates"]["fpr"],
                "confusion": question["confusion"],
                "wrong": len(question["wrong"]),
                "wrong_by_kind": dict(sorted(Counter(kind_of[w["prompt"]] for w in question["wrong"]).items())),
                "failed_samples": judge.failed_samples,
            },
            "humans": {
                "alpha": humans["questions"][0]["alpha"],
                "pairwise_kappa": [(p["annotators"], p["kappa"]) for p in humans["questions"][0]["pairwise_kappa"]],
                "majority_label_vs_truth": {
                    f"truth={t} label={lab}": n for (t, lab), n in sorted(truth_vs_labels.items())
                },
            },
            "timing_s": {"human_judgements": round(judged_s, 2), "judge_run": round(judge_s, 2)},
            "total_s": round(time.perf_counter() - started, 1),
            "machine": machine.report(),
        }
        print(json.dumps(doc, indent=2))
        return 0
    finally:
        tear_down(args.pg_url, DB, workdir, [worker], log)


if __name__ == "__main__":
    sys.exit(main())
