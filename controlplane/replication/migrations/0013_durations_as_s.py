# Durations are _s in the code (the forecast models' 0003 did the same): the policy's duration
# fields renamed, their columns and their check constraints' names kept. State only: no SQL.

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('replication', '0012_policy_knobs'),
    ]

    operations = [
        migrations.AlterField(
            model_name='policy',
            name='interval_seconds',
            field=models.PositiveIntegerField(db_column='interval_seconds', default=60, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(86400)], verbose_name='interval seconds'),
        ),
        migrations.RenameField(
            model_name='policy',
            old_name='interval_seconds',
            new_name='interval_s',
        ),
        migrations.AlterField(
            model_name='policy',
            name='replica_ttl_seconds',
            field=models.PositiveIntegerField(db_column='replica_ttl_seconds', default=900, validators=[django.core.validators.MinValueValidator(10), django.core.validators.MaxValueValidator(604800)], verbose_name='replica ttl seconds'),
        ),
        migrations.RenameField(
            model_name='policy',
            old_name='replica_ttl_seconds',
            new_name='replica_ttl_s',
        ),
        migrations.AlterField(
            model_name='policy',
            name='horizon_seconds',
            field=models.PositiveIntegerField(db_column='horizon_seconds', default=600, help_text='how far ahead plans look', validators=[django.core.validators.MinValueValidator(10), django.core.validators.MaxValueValidator(604800)], verbose_name='horizon seconds'),
        ),
        migrations.RenameField(
            model_name='policy',
            old_name='horizon_seconds',
            new_name='horizon_s',
        ),
        migrations.AlterField(
            model_name='policy',
            name='forecast_every_seconds',
            field=models.PositiveIntegerField(db_column='forecast_every_seconds', default=300, validators=[django.core.validators.MinValueValidator(10), django.core.validators.MaxValueValidator(86400)], verbose_name='forecast every seconds'),
        ),
        migrations.RenameField(
            model_name='policy',
            old_name='forecast_every_seconds',
            new_name='forecast_every_s',
        ),
        migrations.AlterField(
            model_name='policy',
            name='plan_every_seconds',
            field=models.PositiveIntegerField(db_column='plan_every_seconds', default=30, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(86400)], verbose_name='plan every seconds'),
        ),
        migrations.RenameField(
            model_name='policy',
            old_name='plan_every_seconds',
            new_name='plan_every_s',
        ),
        migrations.AlterField(
            model_name='policy',
            name='max_queue_seconds',
            field=models.FloatField(blank=True, db_column='max_queue_seconds', default=2.0, help_text="no speculative item lands on a serving engine whose queue (its agent's waiting requests, in seconds of prefill) is longer (empty: no limit)", null=True, validators=[django.core.validators.MinValueValidator(0.0), django.core.validators.MaxValueValidator(86400)], verbose_name='max queue seconds'),
        ),
        migrations.RenameField(
            model_name='policy',
            old_name='max_queue_seconds',
            new_name='max_queue_s',
        ),
        migrations.AlterField(
            model_name='policy',
            name='max_cluster_queue_seconds',
            field=models.FloatField(blank=True, db_column='max_cluster_queue_seconds', default=1.0, help_text='while the serving engines queue longer than this on average, plan no speculative copy or promotion, only warm-ups of joining engines (empty: no limit)', null=True, validators=[django.core.validators.MinValueValidator(0.0), django.core.validators.MaxValueValidator(86400)], verbose_name='max cluster queue seconds'),
        ),
        migrations.RenameField(
            model_name='policy',
            old_name='max_cluster_queue_seconds',
            new_name='max_cluster_queue_s',
        ),
        # The constraints' conditions name the fields; their SQL (columns, names) is unchanged.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='policy',
                    name='interval_seconds_range',
                ),
                migrations.RemoveConstraint(
                    model_name='policy',
                    name='replica_ttl_seconds_range',
                ),
                migrations.RemoveConstraint(
                    model_name='policy',
                    name='horizon_seconds_range',
                ),
                migrations.RemoveConstraint(
                    model_name='policy',
                    name='forecast_every_seconds_range',
                ),
                migrations.RemoveConstraint(
                    model_name='policy',
                    name='plan_every_seconds_range',
                ),
                migrations.RemoveConstraint(
                    model_name='policy',
                    name='max_queue_seconds_range',
                ),
                migrations.RemoveConstraint(
                    model_name='policy',
                    name='max_cluster_queue_seconds_range',
                ),
                migrations.AddConstraint(
                    model_name='policy',
                    constraint=models.CheckConstraint(condition=models.Q(('interval_s__gte', 1), ('interval_s__lte', 86400)), name='interval_seconds_range'),
                ),
                migrations.AddConstraint(
                    model_name='policy',
                    constraint=models.CheckConstraint(condition=models.Q(('replica_ttl_s__gte', 10), ('replica_ttl_s__lte', 604800)), name='replica_ttl_seconds_range'),
                ),
                migrations.AddConstraint(
                    model_name='policy',
                    constraint=models.CheckConstraint(condition=models.Q(('horizon_s__gte', 10), ('horizon_s__lte', 604800)), name='horizon_seconds_range'),
                ),
                migrations.AddConstraint(
                    model_name='policy',
                    constraint=models.CheckConstraint(condition=models.Q(('forecast_every_s__gte', 10), ('forecast_every_s__lte', 86400)), name='forecast_every_seconds_range'),
                ),
                migrations.AddConstraint(
                    model_name='policy',
                    constraint=models.CheckConstraint(condition=models.Q(('plan_every_s__gte', 1), ('plan_every_s__lte', 86400)), name='plan_every_seconds_range'),
                ),
                migrations.AddConstraint(
                    model_name='policy',
                    constraint=models.CheckConstraint(condition=models.Q(('max_queue_s__isnull', True), models.Q(('max_queue_s__gte', 0.0), ('max_queue_s__lte', 86400)), _connector='OR'), name='max_queue_seconds_range'),
                ),
                migrations.AddConstraint(
                    model_name='policy',
                    constraint=models.CheckConstraint(condition=models.Q(('max_cluster_queue_s__isnull', True), models.Q(('max_cluster_queue_s__gte', 0.0), ('max_cluster_queue_s__lte', 86400)), _connector='OR'), name='max_cluster_queue_seconds_range'),
                ),
            ],
        ),
    ]
