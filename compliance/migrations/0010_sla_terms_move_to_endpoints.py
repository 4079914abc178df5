from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('compliance', '0009_auditevent_public_id'),
    ]

    # The SLA terms and closed windows are an endpoint's product state: they move to the
    # endpoints app (issue 22). Their tables stay where they are, with their row-level security
    # policies; only Django's model state moves.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='slawindowreport',
                    name='terms',
                ),
                migrations.RemoveField(
                    model_name='slawindowreport',
                    name='organization',
                ),
                migrations.DeleteModel(
                    name='SLATerms',
                ),
                migrations.DeleteModel(
                    name='SLAWindowReport',
                ),
            ],
            database_operations=[],
        ),
    ]
