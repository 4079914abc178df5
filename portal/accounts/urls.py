from django.urls import path

from portal.accounts import views

app_name = "accounts"

urlpatterns = [
    path("", views.home, name="home"),
    path("signup/", views.signup, name="signup"),
    path("login/", views.SignInView.as_view(), name="login"),
    path("logout/", views.SignOutView.as_view(), name="logout"),
    path("reauthenticate/", views.reauthenticate, name="reauth"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("organizations/new/", views.organization_create, name="organization_create"),
    path("organizations/switch/", views.organization_switch, name="organization_switch"),
    path("members/", views.members, name="members"),
    path("members/<int:membership_id>/remove/", views.member_remove, name="member_remove"),
    path("invitations/<uuid:invitation_id>/revoke/", views.invitation_revoke, name="invitation_revoke"),
    path("invitations/accept/<str:secret>/", views.invitation_accept, name="invitation_accept"),
    path("tokens/", views.api_tokens, name="api_tokens"),
    path("tokens/<uuid:token_id>/revoke/", views.api_token_revoke, name="api_token_revoke"),
]
