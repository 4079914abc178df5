"""The Tailguard portal (Django project). The Celery app is loaded with Django."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
