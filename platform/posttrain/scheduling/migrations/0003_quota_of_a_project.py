"""A quota may belong to a project (all the project's runs together) as well as to a user or a group: exactly one
of the three. Every existing quota belongs to a user or a group already and is kept as it is."""

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('projects', '0002_default_project'),
        ('scheduling', '0002_tables_renamed'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='quota',
            name='quota_for_a_user_or_a_group',
        ),
        migrations.AddField(
            model_name='quota',
            name='project',
            field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='run_quota', to='projects.project'),
        ),
        migrations.AlterField(
            model_name='quota',
            name='borrowing',
            field=models.BooleanField(default=False, help_text="A group's or a project's quota only: its CPU and GPU limits are a guarantee rather than a cap. Its runs may borrow idle room beyond them, and another team or project within its own quota takes that room back by preemption."),
        ),
        migrations.AlterField(
            model_name='quota',
            name='weight',
            field=models.FloatField(default=1.0, help_text="Fair share: the user's, team's or project's share of the cluster over time, relative to the others'.", validators=[django.core.validators.MinValueValidator(0.001)]),
        ),
        migrations.AddConstraint(
            model_name='quota',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('group__isnull', True), ('project__isnull', True), ('user__isnull', False)), models.Q(('group__isnull', False), ('project__isnull', True), ('user__isnull', True)), models.Q(('group__isnull', True), ('project__isnull', False), ('user__isnull', True)), _connector='OR'), name='quota_for_one_user_group_or_project', violation_error_message='A quota belongs to exactly one user, group or project.'),
        ),
    ]
