# The holdout measured per assignment (intention to treat): each draw's window and counts.

from django.db import migrations, models


def _field(name, field):
    return migrations.AddField(model_name="holdoutdraw", name=name, field=field)


class Migration(migrations.Migration):
    dependencies = [
        ("replication", "0008_holdout_draws"),
    ]

    operations = [
        _field("window_start", models.DateTimeField(null=True)),
        _field("window_end", models.DateTimeField(null=True)),
        _field(
            "tokens",
            models.PositiveIntegerField(default=0, help_text="prefix tokens a hit must cover"),
        ),
        _field(
            "requests",
            models.PositiveIntegerField(default=0, help_text="its prefix's requests in the window"),
        ),
        _field(
            "hits",
            models.PositiveIntegerField(default=0, help_text="of those, cached over the prefix"),
        ),
        _field("cached_tokens", models.BigIntegerField(default=0)),
        _field("ttft_s", models.FloatField(default=0.0, help_text="sum of those requests' TTFT")),
        _field("ttft_n", models.PositiveIntegerField(default=0, help_text="how many sent a TTFT")),
        _field(
            "ttft_samples",
            models.JSONField(blank=True, default=list, help_text="the first TTFTs (s)"),
        ),
    ]
