"""The local CPU has one name everywhere: `local-cpu` (tuning's and the pools' name); the
catalog called it `cpu-local`. Price overrides stored under the old name move to the new one."""

from django.db import migrations

OLD, NEW = "cpu-local", "local-cpu"


def _rename(apps, schema_editor, old: str, new: str) -> None:  # type: ignore[no-untyped-def]
    override = apps.get_model("catalog", "HardwarePriceOverride")
    if override.objects.filter(hardware_name=new).exists():
        # Both names priced (cannot happen through the service, which only took catalog names):
        # the row under the name that stays wins.
        override.objects.filter(hardware_name=old).delete()
    else:
        override.objects.filter(hardware_name=old).update(hardware_name=new)


def forwards(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    _rename(apps, schema_editor, OLD, NEW)


def backwards(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    _rename(apps, schema_editor, NEW, OLD)


class Migration(migrations.Migration):
    dependencies = [("catalog", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
