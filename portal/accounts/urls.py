from django.contrib.auth import views as auth_views
from django.urls import path

from portal.accounts import views
from portal.accounts.forms import EmailAuthenticationForm

app_name = "accounts"

urlpatterns = [
    path("", views.home, name="home"),
    path("signup/", views.signup, name="signup"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="accounts/login.html",
            authentication_form=EmailAuthenticationForm,
            redirect_authenticated_user=True,
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("organizations/new/", views.organization_create, name="organization_create"),
    path("organizations/switch/", views.organization_switch, name="organization_switch"),
    path("members/", views.members, name="members"),
    path("invitations/<uuid:invitation_id>/revoke/", views.invitation_revoke, name="invitation_revoke"),
    path("invitations/accept/<str:secret>/", views.invitation_accept, name="invitation_accept"),
    path("tokens/", views.api_tokens, name="api_tokens"),
    path("tokens/<uuid:token_id>/revoke/", views.api_token_revoke, name="api_token_revoke"),
]
