"""Creates the reviewer role's group (the role that adjudicates review items), as 0001 did the others."""

from django.db import migrations


def create_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.get_or_create(name="reviewer")


def delete_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="reviewer").delete()


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_role_groups")]

    operations = [migrations.RunPython(create_group, delete_group)]
