"""Serializer fields that refer to project objects by id: only objects the request's user reads resolve, so an
id of another project's object is answered exactly as an id that does not exist."""

from __future__ import annotations

from rest_framework import serializers

from posttrain.projects.access import readable


class ReadableRelatedField(serializers.PrimaryKeyRelatedField):
    """A PrimaryKeyRelatedField over the rows of its queryset the serializer's `context["request"]` user reads
    (`project_field`: the path to the row's project). Without a request in the context it resolves nothing."""

    def __init__(self, *, project_field: str = "project", **kwargs):
        self.project_field = project_field
        super().__init__(**kwargs)

    def get_queryset(self):
        queryset = super().get_queryset()
        assert queryset is not None  # every use gives a queryset (a read-only field never resolves)
        request = self.context.get("request")
        if request is None:
            return queryset.none()
        return readable(queryset, request.user, self.project_field)


CREATE_IN_HELP = (
    "The project to create in (its id or name). Default: the browser's chosen project, or the one project you can "
    "create in."
)


def project_input_field(help_text: str = CREATE_IN_HELP) -> serializers.CharField:
    """The `project` a request creates in (id or name); see posttrain.projects.permissions for the default."""
    return serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=100, help_text=help_text)


def project_name_field() -> serializers.CharField:
    return serializers.CharField(source="project.name", read_only=True, help_text="The project it belongs to.")
