import django.db.models.deletion
import django.utils.timezone
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0004_api_token_membership'),
        ('endpoints', '0006_endpoint_port_from_host'),
        ('compliance', '0010_sla_terms_move_to_endpoints'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    # The SLA terms and closed windows, moved from compliance (issue 22) onto their existing tables.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='SLATerms',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('metric', models.CharField(choices=[('ttft_p50_ms', 'TTFT p50'), ('ttft_p95_ms', 'TTFT p95')], default='ttft_p50_ms', max_length=16)),
                        ('target_ms', models.FloatField()),
                        ('window', models.CharField(choices=[('monthly', 'Calendar month (UTC)')], default='monthly', max_length=16)),
                        ('source', models.CharField(choices=[('engine', 'Engine-observed'), ('client', 'Client-observed (router)')], default='engine', max_length=16)),
                        ('credit_tiers', models.JSONField(default=list)),
                        ('min_coverage_pct', models.FloatField(default=90.0)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('endpoint', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='sla_terms', to='endpoints.endpoint')),
                        ('organization', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.organization')),
                        ('updated_by', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'compliance_slaterms',
                    },
                ),
                migrations.CreateModel(
                    name='SLAWindowReport',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('window_start', models.DateTimeField()),
                        ('window_end', models.DateTimeField()),
                        ('result', models.JSONField()),
                        ('computed_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('organization', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.organization')),
                        ('terms', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='reports', to='endpoints.slaterms')),
                    ],
                    options={
                        'db_table': 'compliance_slawindowreport',
                        'ordering': ['-window_start'],
                        'constraints': [models.UniqueConstraint(fields=('terms', 'window_start'), name='sla_report_window_unique')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
