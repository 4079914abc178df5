"""The REST toolkit every app's API module builds on: tenant scoping and role permissions, strict
parsers, field helpers and JSON-safe numbers. It imports no portal app but accounts, so each
app's `api.py` can use it while `portal.api` (the URL map and the shared views) sits above
every app."""
