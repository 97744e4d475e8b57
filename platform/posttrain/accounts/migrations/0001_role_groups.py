"""Creates the role groups, so a fresh database already has them (user_set_role also creates a
missing one, e.g. after a test flush)."""

from django.db import migrations

ROLE_GROUPS = ("admin", "researcher", "annotator")


def create_groups(apps, schema_editor):
    group_model = apps.get_model("auth", "Group")
    for name in ROLE_GROUPS:
        group_model.objects.get_or_create(name=name)


def delete_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLE_GROUPS).delete()


class Migration(migrations.Migration):
    dependencies = [("auth", "0012_alter_user_first_name_max_length")]

    operations = [migrations.RunPython(create_groups, delete_groups)]
