"""Forms check the shape of input; services decide whether it is allowed."""

from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from portal.accounts.models import Role


class SignupForm(forms.Form):
    email = forms.EmailField(max_length=254)
    full_name = forms.CharField(max_length=200, required=False, label="Full name")
    password = forms.CharField(widget=forms.PasswordInput, strip=False, max_length=128)


class EmailAuthenticationForm(AuthenticationForm):
    username = forms.EmailField(
        label="Email", max_length=254, widget=forms.EmailInput(attrs={"autofocus": True})
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
