from django.urls import path

from portal.api import views

app_name = "api"

urlpatterns = [
    path("auth/signup/", views.SignupView.as_view(), name="signup"),
    path("me/", views.MeView.as_view(), name="me"),
    path("me/active-organization/", views.ActiveOrganizationView.as_view(), name="active_organization"),
    path("organizations/", views.OrganizationListCreateView.as_view(), name="organizations"),
    path("members/", views.MemberListView.as_view(), name="members"),
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
