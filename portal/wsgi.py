import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Whatever serves this application (gunicorn, uWSGI, mod_wsgi) is not a developer's own machine:
# DEBUG is off unless set, so a forgotten variable means a missing SECRET_KEY refusing to start,
# never debug pages and a public development key on the internet. `make run` (Django's
# development server, which does not come through here first) sets DEBUG=true itself.
os.environ.setdefault("DEBUG", "false")
application = get_wsgi_application()
