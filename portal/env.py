"""Strict, typed readers of environment variables for `portal.settings`.

Every reader fails at start-up with the variable's name and the offending value, so a typo in a
deployment never becomes a silently different configuration.
"""

from __future__ import annotations

import builtins
import ipaddress
import os
from collections.abc import Mapping
from typing import overload

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class Env:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ

    def _raw(self, name: str) -> str | None:
        value = self._environ.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def is_set(self, name: str) -> bool:
        return self._raw(name) is not None

    @overload
    def str(self, name: builtins.str, default: builtins.str) -> builtins.str: ...
    @overload
    def str(self, name: builtins.str, default: None = None) -> builtins.str | None: ...
    def str(self, name: builtins.str, default: builtins.str | None = None) -> builtins.str | None:
        value = self._raw(name)
        return default if value is None else value

    def required_str(self, name: builtins.str) -> builtins.str:
        value = self._raw(name)
        if value is None:
            raise ImproperlyConfigured(f"environment variable {name} is required")
        return value

    def bool(self, name: builtins.str, default: bool) -> bool:
        value = self._raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ImproperlyConfigured(
            f"environment variable {name}={value!r} is not a boolean (use true or false)"
        )

    def int(self, name: builtins.str, default: int, *, minimum: int | None = None) -> int:
        value = self._raw(name)
        if value is None:
            return default
        try:
            parsed = int(value)
        except ValueError:
            raise ImproperlyConfigured(f"environment variable {name}={value!r} is not an integer") from None
        if minimum is not None and parsed < minimum:
            raise ImproperlyConfigured(f"environment variable {name}={parsed} must be at least {minimum}")
        return parsed

    def list(self, name: builtins.str, default: builtins.list[builtins.str]) -> builtins.list[builtins.str]:
        value = self._raw(name)
        if value is None:
            return list(default)
        items = [item.strip() for item in value.split(",")]
        if any(not item for item in items):
            raise ImproperlyConfigured(f"environment variable {name}={value!r} has an empty item")
        return items

    def networks(
        self, name: builtins.str, default: builtins.list[builtins.str]
    ) -> builtins.list[builtins.str]:
        """A comma-separated list of IP networks (CIDRs, or single addresses), normalised."""
        parsed = []
        for item in self.list(name, default):
            try:
                parsed.append(str(ipaddress.ip_network(item, strict=False)))
            except ValueError:
                raise ImproperlyConfigured(
                    f"environment variable {name}: {item!r} is not an IP network such as 10.0.0.0/8"
                ) from None
        return parsed

    def choice(
        self, name: builtins.str, default: builtins.str, choices: builtins.list[builtins.str]
    ) -> builtins.str:
        value = self._raw(name)
        if value is None:
            return default
        if value not in choices:
            raise ImproperlyConfigured(
                f"environment variable {name}={value!r} must be one of: {', '.join(choices)}"
            )
        return value
