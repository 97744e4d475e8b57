"""Serializers of the projects API: shapes only (rules in posttrain.projects.services and .access)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from posttrain.projects.access import is_admin, role_in
from posttrain.projects.models import Membership, Project, ProjectRole


class ProjectSerializer(serializers.ModelSerializer):
    member_count = serializers.IntegerField(read_only=True, default=0)
    role = serializers.SerializerMethodField(
        help_text="Your role in it (owner, maintainer, member, viewer); null where you see it as an admin only."
    )
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Project
        fields = ["id", "name", "description", "role", "member_count", "created_by", "created_at"]
        read_only_fields = fields

    def get_role(self, project: Project) -> str | None:
        request = self.context.get("request")
        return role_in(request.user, project.pk) if request is not None else None


class ProjectCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)


class ProjectUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(allow_blank=True, max_length=10_000)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "added_at"]
        read_only_fields = fields


class MembershipSetSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=ProjectRole.choices)


class CurrentProjectSerializer(serializers.Serializer):
    project = serializers.CharField(
        allow_null=True,
        max_length=100,
        help_text="A project's id or name; null: every project you read.",
    )


def current_payload(project: Project | None, request: Any) -> dict[str, Any]:
    return {
        "project": ProjectSerializer(project, context={"request": request}).data if project is not None else None,
        "admin": is_admin(request.user),
    }
