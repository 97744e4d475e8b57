"""The scheduler's tables take this app's names (runs_quota becomes scheduling_quota, …): a rename, every
row kept."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0001_initial")]

    operations = [
        migrations.AlterModelTable(name="clustersample", table=None),
        migrations.AlterModelTable(name="clustersnapshot", table=None),
        migrations.AlterModelTable(name="preemption", table=None),
        migrations.AlterModelTable(name="quota", table=None),
    ]
