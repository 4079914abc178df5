"""Endpoint runners: keep a configuration serving behind a stable address."""
