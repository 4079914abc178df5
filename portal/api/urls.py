from django.urls import path

from portal.api import views

app_name = "api"

urlpatterns = [
    path("auth/signup/", views.SignupView.as_view(), name="signup"),
    path("me/", views.MeView.as_view(), name="me"),
    path("me/reauthenticate/", views.ReauthenticateView.as_view(), name="reauthenticate"),
    path("me/active-organization/", views.ActiveOrganizationView.as_view(), name="active_organization"),
    path("organizations/", views.OrganizationListCreateView.as_view(), name="organizations"),
    path("members/", views.MemberListView.as_view(), name="members"),
    path("members/<int:pk>/", views.MemberDetailView.as_view(), name="member_detail"),
    path("invitations/", views.InvitationListCreateView.as_view(), name="invitations"),
    path("invitations/accept/", views.InvitationAcceptView.as_view(), name="invitation_accept"),
    path("invitations/<uuid:pk>/", views.InvitationDetailView.as_view(), name="invitation_detail"),
    path("traffic-samples/", views.TrafficSampleListCreateView.as_view(), name="traffic_samples"),
    path("traffic-samples/<uuid:pk>/", views.TrafficSampleDetailView.as_view(), name="traffic_sample_detail"),
    path("models/", views.ServedModelListCreateView.as_view(), name="models"),
    path("tuning-jobs/", views.TuningJobListCreateView.as_view(), name="tuning_jobs"),
    path("tuning-jobs/<uuid:pk>/", views.TuningJobDetailView.as_view(), name="tuning_job_detail"),
    path("tuning-jobs/<uuid:pk>/cancel/", views.TuningJobCancelView.as_view(), name="tuning_job_cancel"),
    path("tokens/", views.ApiTokenListCreateView.as_view(), name="tokens"),
    path("tokens/<uuid:pk>/", views.ApiTokenDetailView.as_view(), name="token_detail"),
]

# Compliance (issue 8): residency, retention, BAAs, the audit trail and its export, deletion.
from portal.api import compliance as compliance_api  # noqa: E402

urlpatterns += [
    path("compliance/residency/", compliance_api.ResidencyView.as_view(), name="compliance_residency"),
    path("compliance/retention/", compliance_api.RetentionView.as_view(), name="compliance_retention"),
    path("compliance/baas/", compliance_api.BAAListCreateView.as_view(), name="compliance_baas"),
    path("compliance/baas/<uuid:pk>/", compliance_api.BAADetailView.as_view(), name="compliance_baa_detail"),
    path(
        "compliance/audit-events/",
        compliance_api.AuditEventListView.as_view(),
        name="compliance_audit_events",
    ),
    path(
        "compliance/audit-export/", compliance_api.AuditExportView.as_view(), name="compliance_audit_export"
    ),
    path(
        "compliance/delete-organization/",
        compliance_api.OrganizationDataDeleteView.as_view(),
        name="compliance_organization_delete",
    ),
    path(
        "compliance/endpoints/<uuid:pk>/sla/",
        compliance_api.EndpointSLAView.as_view(),
        name="compliance_endpoint_sla",
    ),
]

# Billing (issue 10): account, usage, usage reports, Stripe Checkout and customer portal.
urlpatterns += [
    path("billing/", views.BillingAccountView.as_view(), name="billing_account"),
    path("billing/usage/", views.BillingUsageView.as_view(), name="billing_usage"),
    path("billing/usage-reports/", views.UsageReportListView.as_view(), name="billing_usage_reports"),
    path(
        "billing/usage-reports/<uuid:pk>/", views.UsageReportDetailView.as_view(), name="billing_usage_report"
    ),
    path("billing/checkout/", views.BillingCheckoutView.as_view(), name="billing_checkout"),
    path("billing/portal/", views.BillingPortalView.as_view(), name="billing_portal"),
]

# Hardware pools (issue 20): the pools an organization may choose, its own pools, their hosts.
from portal.pools import api as pools_api  # noqa: E402

urlpatterns += [
    path("pools/", pools_api.PoolListCreateView.as_view(), name="pools"),
    path("pools/<slug:name>/", pools_api.PoolDetailView.as_view(), name="pool_detail"),
    path("pools/<slug:name>/hosts/", pools_api.PoolHostListView.as_view(), name="pool_hosts"),
]

# SLA agreements measured at the edge, alerts and the evidence pack (issue 23).
from portal.alerts import api as alerts_api  # noqa: E402
from portal.sla import api as sla_api  # noqa: E402

urlpatterns += [
    path("sla/agreements/", sla_api.AgreementListView.as_view(), name="sla_agreements"),
    path("sla/agreements/<uuid:pk>/sign/", sla_api.AgreementSignView.as_view(), name="sla_agreement_sign"),
    path("sla/endpoints/<uuid:pk>/proposals/", sla_api.EndpointProposalView.as_view(), name="sla_proposals"),
    path("sla/endpoints/<uuid:pk>/report/", sla_api.EndpointReportView.as_view(), name="sla_report"),
    path("compliance/evidence-pack/", sla_api.EvidencePackView.as_view(), name="compliance_evidence_pack"),
    path("alerts/", alerts_api.AlertListView.as_view(), name="alerts"),
    path("alerts/channels/", alerts_api.ChannelListCreateView.as_view(), name="alert_channels"),
    path("alerts/channels/<uuid:pk>/", alerts_api.ChannelDetailView.as_view(), name="alert_channel_detail"),
]

# Endpoints and benchmark reports (issue 22, step 4): what the portal's pages do, for programs.
from portal.benchmarks import api as benchmarks_api  # noqa: E402
from portal.endpoints import api as endpoints_api  # noqa: E402

urlpatterns += [
    path("endpoints/", endpoints_api.EndpointListView.as_view(), name="endpoints"),
    path("endpoints/<uuid:pk>/", endpoints_api.EndpointDetailView.as_view(), name="endpoint_detail"),
    path("tuning-jobs/<uuid:pk>/deploy/", endpoints_api.JobDeployView.as_view(), name="tuning_job_deploy"),
    path(
        "endpoints/<uuid:pk>/promote/", endpoints_api.EndpointPromoteView.as_view(), name="endpoint_promote"
    ),
    path("endpoints/<uuid:pk>/start/", endpoints_api.EndpointStartView.as_view(), name="endpoint_start"),
    path("endpoints/<uuid:pk>/stop/", endpoints_api.EndpointStopView.as_view(), name="endpoint_stop"),
    path(
        "endpoints/<uuid:pk>/metrics/", endpoints_api.EndpointMetricsView.as_view(), name="endpoint_metrics"
    ),
    path("endpoints/<uuid:pk>/policy/", endpoints_api.EndpointPolicyView.as_view(), name="endpoint_policy"),
    path("benchmark-reports/", benchmarks_api.ReportListCreateView.as_view(), name="benchmark_reports"),
    path(
        "benchmark-reports/<uuid:pk>/",
        benchmarks_api.ReportDetailView.as_view(),
        name="benchmark_report_detail",
    ),
    path(
        "benchmark-reports/<uuid:pk>/result/",
        benchmarks_api.ReportResultView.as_view(),
        name="benchmark_report_result",
    ),
    path(
        "benchmark-reports/<uuid:pk>/share-links/",
        benchmarks_api.ShareLinkListCreateView.as_view(),
        name="benchmark_share_links",
    ),
    path(
        "benchmark-reports/<uuid:pk>/share-links/<uuid:link_id>/",
        benchmarks_api.ShareLinkDetailView.as_view(),
        name="benchmark_share_link_detail",
    ),
]
