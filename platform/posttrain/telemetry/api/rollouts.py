"""A run's rollout files over HTTP (posttrain.telemetry.rollouts; docs/ROLLOUTS.md):

    GET /api/runs/<id>/rollouts/                 the run's files (rows, bytes, statistics, available) and gaps
    GET /api/runs/<id>/rollouts/<name>           one file, streamed as stored (the export)
    PUT /api/runs/<id>/rollouts/<name>/upload    an external run's client uploads a step's file (run token)

The upload is streamed to a staged file as it arrives (its size bounded, Parquet's magic bytes checked at
both ends), then checked there without reading it into Python (posttrain.telemetry.rollout_checks: footer,
schema, rows, row groups, each row's texts and lists) and put in place only if it is a rollout file within
the engine's bounds. A run that ended, or a name a `samples` event announced already, is refused (409):
an announced file is never replaced. The `samples` event that follows names the file.
"""

from __future__ import annotations

from django.conf import settings
from django.http import FileResponse, HttpRequest
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from posttrain.accounts.permissions import IsResearcher
from posttrain.core.api.errors import ERRORS_RESPONSE
from posttrain.core.errors import InvalidInput, NotFound, PayloadTooLarge
from posttrain.core.run_tokens import require_run_token
from posttrain.projects.access import Access
from posttrain.projects.permissions import object_for
from posttrain.runs.models import Run
from posttrain.telemetry import rollouts
from posttrain_sdk.rollout_files import parse_file_name

PARQUET_MEDIA_TYPE = "application/vnd.apache.parquet"
PARQUET_MAGIC = b"PAR1"  # a Parquet file starts and ends with it
_UPLOAD_CHUNK = 1 << 20


class RolloutFileSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    part = serializers.IntegerField()
    name = serializers.CharField(help_text="The file's name: GET /api/runs/<id>/rollouts/<name> downloads it.")
    rows = serializers.IntegerField()
    bytes = serializers.IntegerField()
    sha256 = serializers.CharField()
    stats = serializers.JSONField(help_text="reward and length {count, mean, min, max}, finish_reasons, kept.")
    available = serializers.BooleanField(help_text="False: the index names the file, the store lacks it (a gap).")


class GapSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    reason = serializers.CharField()
    file = serializers.CharField(
        allow_null=True, help_text="The rollout file missing or unreadable; null for a step never announced."
    )


class RunRolloutFilesView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="A run's rollout files (Parquet, one per step) and the steps whose file is missing",
        responses={
            200: inline_serializer(
                "RolloutFiles",
                fields={"files": RolloutFileSerializer(many=True), "gaps": GapSerializer(many=True)},
            ),
            404: ERRORS_RESPONSE,
        },
    )
    def get(self, request: Request, pk) -> Response:
        run = object_for(request, Run.objects.all(), Access.READ, pk=pk)
        listing = rollouts.run_rollout_files(run)
        return Response({"files": listing.files, "gaps": rollouts.gaps_payload(listing.gaps)})


class RunRolloutFileView(APIView):
    permission_classes = [IsResearcher]

    @extend_schema(
        summary="Download one of a run's rollout files (Parquet)",
        responses={(200, PARQUET_MEDIA_TYPE): bytes, 404: ERRORS_RESPONSE},
    )
    def get(self, request: Request, pk, name: str) -> FileResponse:
        run = object_for(request, Run.objects.all(), Access.READ, pk=pk)
        if parse_file_name(name) is None or not run.rollout_files.filter(name=name).exists():
            raise NotFound(f"run {run.pk} has no rollout file {name[:60]!r}")
        response = FileResponse(rollouts.open_file(run.pk, name), content_type=PARQUET_MEDIA_TYPE)
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response


class RolloutUploadView(APIView):
    """An external run's client uploads a step's rollout file with the run's own bearer token (no session,
    no CSRF). The body is staged as it streams in and checked before it is put in place."""

    authentication_classes: list = []
    permission_classes = [AllowAny]  # the per-run token is checked in put()

    @extend_schema(
        summary="Upload one rollout file of an external run (the SDK's sender, before the samples event)",
        request={PARQUET_MEDIA_TYPE: bytes},
        responses={
            201: inline_serializer(
                "RolloutUpload", fields={"name": serializers.CharField(), "bytes": serializers.IntegerField()}
            ),
            400: ERRORS_RESPONSE,
            401: ERRORS_RESPONSE,
            403: ERRORS_RESPONSE,
            409: ERRORS_RESPONSE,
            413: ERRORS_RESPONSE,
        },
    )
    def put(self, request: Request, pk, name: str) -> Response:
        run = get_object_or_404(Run.objects.only("ingest_token_hash"), pk=pk)
        require_run_token(request.META.get("HTTP_AUTHORIZATION", ""), run.ingest_token_hash)
        if parse_file_name(name) is None:
            raise InvalidInput.one("name", "must be a rollout file name, step_<8-digit step>[.<part>].parquet")
        limit = settings.ROLLOUT_UPLOAD_MAX_BYTES
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
        if declared > limit:
            raise PayloadTooLarge(f"a rollout file may be at most {limit} bytes, this one is {declared}")
        size = rollouts.rollout_upload(run.pk, name, _body_chunks(request._request, limit))
        return Response({"name": name, "bytes": size}, status=201)


def _body_chunks(request: HttpRequest, limit: int):
    """The body in chunks, refused (before anything is put in place) when it grows past `limit` or does
    not begin and end as a Parquet file does."""
    seen = 0
    head = tail = b""
    while chunk := request.read(_UPLOAD_CHUNK):
        seen += len(chunk)
        if seen > limit:
            raise PayloadTooLarge(f"a rollout file may be at most {limit} bytes")
        if len(head) < len(PARQUET_MAGIC):
            head = (head + chunk)[: len(PARQUET_MAGIC)]
        tail = (tail + chunk)[-len(PARQUET_MAGIC) :]
        yield chunk
    if head != PARQUET_MAGIC or tail != PARQUET_MAGIC or seen < 3 * len(PARQUET_MAGIC):
        raise InvalidInput.one("body", "not a Parquet file: a rollout file is the Parquet bytes rollout_files writes")
