"""The telemetry tables take this app's names (runs_metricrow becomes telemetry_metricrow, …): a rename, every
row kept. Index and constraint names stay as the runs app gave them."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0001_initial")]

    operations = [
        migrations.AlterModelTable(name="metricblock", table=None),
        migrations.AlterModelTable(name="metricrow", table=None),
        migrations.AlterModelTable(name="rolloutfile", table=None),
        migrations.AlterModelTable(name="runlog", table=None),
    ]
