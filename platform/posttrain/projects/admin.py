from django.contrib import admin

from posttrain.projects.models import Membership, Project


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    """Admins manage every project here; a project's owners and maintainers manage theirs on /projects/."""

    list_display = ("name", "description", "created_by", "created_at")
    search_fields = ("name", "description")
    readonly_fields = ("created_by", "created_at")
    inlines = (MembershipInline,)
