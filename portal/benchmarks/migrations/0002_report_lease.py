# The report's run holds it through the shared lease kit (portal.leases.Leased): the heartbeat
# field keeps its values under the kit's name, and the holder is named.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("benchmarks", "0001_initial"),
    ]

    operations = [
        migrations.RenameField(
            model_name="benchmarkreport",
            old_name="heartbeat_at",
            new_name="lease_heartbeat_at",
        ),
        migrations.AddField(
            model_name="benchmarkreport",
            name="lease_owner",
            field=models.CharField(blank=True, max_length=200),
        ),
    ]
