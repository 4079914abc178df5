"""Forms check the shape of input; services decide whether it is allowed."""

from __future__ import annotations

import math

from django import forms
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from portal.accounts.models import Role
from portal.accounts.ports import RETRY_AFTER_ATTR


class SignupForm(forms.Form):
    email = forms.EmailField(max_length=254)
    full_name = forms.CharField(max_length=200, required=False, label="Full name")
    password = forms.CharField(widget=forms.PasswordInput, strip=False, max_length=128)


class EmailAuthenticationForm(AuthenticationForm):
    username = forms.EmailField(
        label="Email", max_length=254, widget=forms.EmailInput(attrs={"autofocus": True})
    )

    def get_invalid_login_error(self) -> ValidationError:
        # The throttle's wait, when it refused the attempt without checking the password.
        wait_s = getattr(self.request, RETRY_AFTER_ATTR, None)
        if wait_s is None:
            return super().get_invalid_login_error()
        return ValidationError(
            "Too many failed sign-ins. Try again in %(seconds)d seconds.",
            code="throttled",
            params={"seconds": max(1, math.ceil(wait_s))},
        )


class OrganizationForm(forms.Form):
    name = forms.CharField(max_length=120)


class InvitationForm(forms.Form):
    email = forms.EmailField(max_length=254)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100)


class OrganizationSwitchForm(forms.Form):
    organization = forms.UUIDField()


class ReauthForm(forms.Form):
    password = forms.CharField(
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password", "autofocus": True}),
        strip=False,
        max_length=128,
    )
    # Required by the service once the person has an authenticator; the page shows it then.
    code = forms.CharField(
        required=False,
        max_length=32,
        label="Two-factor code (or a recovery code)",
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric"}),
    )
