"""The default project, with every existing user in it, so no object made before projects is lost or hidden
when reads become scoped to projects: admins own it, researchers are members (each writes what they made), and
annotators and reviewers view it (their site role keeps them to their queues anyway)."""

from django.db import migrations

DEFAULT_PROJECT_NAME = "default"


def role_for(user, group_names):
    if user.is_superuser or "admin" in group_names:
        return "owner"
    if "researcher" in group_names:
        return "member"
    return "viewer"


def create_default_project(apps, schema_editor):
    project_model = apps.get_model("projects", "Project")
    membership_model = apps.get_model("projects", "Membership")
    user_model = apps.get_model("auth", "User")
    project, _ = project_model.objects.get_or_create(
        name=DEFAULT_PROJECT_NAME, defaults={"description": "Everything made before projects existed."}
    )
    for user in user_model.objects.prefetch_related("groups"):
        names = {group.name for group in user.groups.all()}
        membership_model.objects.get_or_create(project=project, user=user, defaults={"role": role_for(user, names)})


class Migration(migrations.Migration):
    dependencies = [("projects", "0001_initial"), ("accounts", "0002_reviewer_group")]

    operations = [migrations.RunPython(create_default_project, migrations.RunPython.noop)]
