# Job steps and batch trials are sent through the task outbox (portal.outbox) instead of the
# job's own send record: a step sent already is simply owed (PENDING) until a step claims it, and
# the outbox's messages say whether and when the broker took it.

from django.db import migrations, models


def sent_is_owed(apps, schema_editor):  # type: ignore[no-untyped-def]
    # A step owed or sent before this migration has no outbox message: the next run of
    # `tuning_jobs_redispatch` owes it again (a copy still in the broker's queue is then a no-op:
    # the job's lease sees to it).
    TuningJob = apps.get_model("jobs", "TuningJob")
    TuningJob.objects.filter(dispatch="sent").update(dispatch="pending")


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0006_trial_batches"),
        ("outbox", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(sent_is_owed, migrations.RunPython.noop),
        migrations.RemoveField(model_name="tuningjob", name="dispatched_at"),
        migrations.RemoveField(model_name="trial", name="dispatched_at"),
        migrations.AlterField(
            model_name="tuningjob",
            name="dispatch",
            field=models.CharField(
                choices=[
                    ("pending", "Step owed"),
                    ("taken", "Taken by a worker"),
                    ("trials", "Trials out on the pool's hosts"),
                ],
                default="pending",
                max_length=16,
            ),
        ),
    ]
