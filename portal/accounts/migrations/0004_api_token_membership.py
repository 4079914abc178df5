"""API tokens name the membership they were made under (issue 27 finding 12): a token works only
while that membership exists, so a removed member's tokens stay dead if they are invited back.
Tokens made before this are bound to their creator's current membership of the token's
organization; a token whose creator is no longer a member stays unbound, i.e. dead."""

import django.db.models.deletion
from django.db import migrations, models


def bind_tokens(apps, schema_editor):  # type: ignore[no-untyped-def]
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        # Every tenant's tokens: the platform scope, for this transaction only.
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('tailguard.scope', 'platform', true)")
    ApiToken = apps.get_model("accounts", "ApiToken")
    Membership = apps.get_model("accounts", "Membership")
    for token in ApiToken.objects.filter(membership__isnull=True).iterator():
        membership = Membership.objects.filter(
            organization_id=token.organization_id, user_id=token.created_by_id
        ).first()
        if membership is not None:
            ApiToken.objects.filter(pk=token.pk).update(membership=membership)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0003_own_memberships_policy"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="membership",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="api_tokens",
                to="accounts.membership",
            ),
        ),
        migrations.RunPython(bind_tokens, migrations.RunPython.noop),
    ]
