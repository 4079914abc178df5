"""`{{ uri|qr_svg }}`: a QR code drawn on the server as inline SVG, for authenticator apps.

Drawn here rather than by a script in the page or a third-party image service: the key inside an
`otpauth://` URI is a secret, so it must not leave the server or depend on JavaScript.
"""

from __future__ import annotations

import segno
from django import template
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


@register.filter
def qr_svg(value: str | None, title: str = "QR code") -> SafeString:
    if not value:
        return SafeString("")
    # Error correction M (15%) is what authenticator apps read reliably from a screen; the
    # four-module white border is the quiet zone scanners need, also on a dark page.
    code = segno.make(value, error="m", micro=False)
    svg = code.svg_inline(
        scale=5, border=4, dark="#000", light="#fff", svgid="totp-qr", svgclass="qr", title=title
    )
    # Safe by construction: segno escapes the title, and the rest is markup and path data it drew.
    return mark_safe(svg)  # noqa: S308
