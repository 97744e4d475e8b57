"""Builds the search index of rollout files that have none (docs/ROLLOUTS.md, "Search index"): files
moved over by a migration, or written while no worker ran. Workers build it after each samples event."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from posttrain.telemetry.models import RolloutFile
from posttrain.telemetry.rollouts import rollout_index_update


class Command(BaseCommand):
    help = "Build the search index of every run's rollout files that lack one (or of the runs named)."

    def add_arguments(self, parser):
        parser.add_argument("runs", nargs="*", help="run ids (default: every run with rollout files)")

    def handle(self, *args, runs: list[str], **options):
        run_ids = runs or [str(r) for r in RolloutFile.objects.values_list("run_id", flat=True).distinct()]
        for run_id in run_ids:
            written = rollout_index_update(run_id)
            self.stdout.write(f"{run_id}: {written} index files written")
