from django.db import migrations, models


class Migration(migrations.Migration):
    """The ingest's claim becomes a lease (portal/leases.py): its time is the lease's heartbeat."""

    dependencies = [
        ("traffic", "0002_ingest_claim"),
    ]

    operations = [
        migrations.RenameField(
            model_name="trafficsample",
            old_name="claimed_at",
            new_name="lease_heartbeat_at",
        ),
        migrations.AddField(
            model_name="trafficsample",
            name="lease_owner",
            field=models.CharField(blank=True, max_length=200),
        ),
    ]
