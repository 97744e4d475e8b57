"""A run's prompt ledger over HTTP (posttrain.telemetry.ledger; docs/ARCHITECTURE.md, "The prompt ledger"):

GET /api/runs/<id>/ledger/       per epoch: trained, filtered and dropped by reason, in flight, not drawn,
                                 skipped, duplicates; each resume with what it restored and re-did
GET /api/runs/<id>/ledger/file   the whole ledger (Parquet: a row per (epoch, row) with a fate)
"""

from __future__ import annotations

from django.http import FileResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.projects.access import Access
from posttrain.projects.permissions import object_for
from posttrain.runs.models import Run
from posttrain.telemetry import ledger
from posttrain.telemetry.api.rollouts import PARQUET_MEDIA_TYPE


class LedgerEpochSerializer(serializers.Serializer):
    epoch = serializers.IntegerField()
    rows = serializers.IntegerField(help_text="Training rows in the dataset (each epoch draws every one once).")
    trained = serializers.IntegerField(help_text="Rows with at least one sample in an update.")
    filtered = serializers.DictField(
        child=serializers.IntegerField(), help_text="Rows every filter left out, by filter."
    )
    dropped = serializers.DictField(
        child=serializers.IntegerField(), help_text="Rows dropped, by reason (staleness, lost_on_resume)."
    )
    in_flight = serializers.IntegerField(help_text="Rows drawn for a step not trained yet (generated ahead).")
    not_drawn = serializers.IntegerField(help_text="Rows of an epoch still going that the sampler has not reached.")
    skipped = serializers.IntegerField(help_text="Rows of an epoch the sampler left without a fate: must be 0.")
    duplicates = serializers.IntegerField(help_text="Rows resolved a second time in the epoch: must be 0.")


class LedgerResumeSerializer(serializers.Serializer):
    checkpoint_step = serializers.IntegerField()
    restored_in_flight = serializers.IntegerField(help_text="Rows generated ahead, restored with their rollouts.")
    lost_in_flight = serializers.IntegerField(help_text="Rows in flight whose rollouts the checkpoint lacked.")
    redone_steps = serializers.ListField(child=serializers.IntegerField(), help_text="Steps lost past the checkpoint.")
    redone_rows = serializers.IntegerField(help_text="Rows those steps had resolved, resolved again once.")
    seconds = serializers.FloatField(help_text="Building the engine and restoring the checkpoint, in seconds.")


class LedgerSerializer(serializers.Serializer):
    dataset_rows = serializers.IntegerField()
    epochs = LedgerEpochSerializer(many=True)
    resumes = LedgerResumeSerializer(many=True)
    totals = serializers.DictField(child=serializers.IntegerField(), help_text="The epochs' counts summed.")
    bytes = serializers.IntegerField(help_text="The Parquet file's size: GET .../ledger/file downloads it.")


class RunLedgerView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="The fate of every training row in every epoch, summed per epoch, and the run's resumes",
        responses={200: LedgerSerializer, 404: ERRORS_RESPONSE, 413: ERRORS_RESPONSE},
    )
    def get(self, request: Request, pk) -> Response:
        run = object_for(request, Run.objects.all(), Access.READ, pk=pk)
        return Response(ledger.run_ledger_summary(run))


class RunLedgerFileView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Download a run's whole prompt ledger (Parquet)",
        responses={(200, PARQUET_MEDIA_TYPE): bytes, 404: ERRORS_RESPONSE, 413: ERRORS_RESPONSE},
    )
    def get(self, request: Request, pk) -> FileResponse:
        run = object_for(request, Run.objects.all(), Access.READ, pk=pk)
        file = ledger.run_ledger_file(run)
        response = FileResponse(file.path.open("rb"), content_type=PARQUET_MEDIA_TYPE)
        response["Content-Disposition"] = f'attachment; filename="ledger-{run.pk}.parquet"'
        return response
