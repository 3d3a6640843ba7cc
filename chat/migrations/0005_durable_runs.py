from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0004_mcp_name_help"),
    ]

    operations = [
        migrations.RenameField(model_name="run", old_name="inbox", new_name="owner"),
        migrations.AddField(
            model_name="run",
            name="waiting_on",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="run",
            name="stop_requested",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="run",
            name="resumes",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status", "running")),
                fields=["owner", "heartbeat_at"],
                name="run_owner",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status", "running")),
                fields=["waiting_on"],
                name="run_waiting",
            ),
        ),
    ]
