from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0005_audit_depth"),
    ]

    operations = [
        migrations.RemoveField(model_name="toolapproval", name="waiter_inbox"),
        migrations.AddField(
            model_name="toolapproval",
            name="expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="toolapproval",
            name="started_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="toolapproval",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["expires_at"],
                name="appr_pending_expiry",
            ),
        ),
    ]
