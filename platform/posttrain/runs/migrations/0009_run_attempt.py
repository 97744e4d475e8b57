from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0008_scheduler"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="attempt",
            field=models.PositiveIntegerField(
                default=0,
                help_text="Ray jobs the run took before this one: each resume after a preemption is a new job.",
            ),
        ),
    ]
