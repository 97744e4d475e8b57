"""The `Sample` table goes: its rows are rollout files now (0011), and review items hold their own copies
(review 0002)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0012_samples_to_rollout_files"),
        ("review", "0002_rollout_copies_gold_adjudication_judges"),
    ]

    operations = [migrations.DeleteModel(name="Sample")]
