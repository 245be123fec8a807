"""WSGI entry point for gunicorn (tracing starts in gunicorn.conf.py's post_fork)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "app.settings")

application = get_wsgi_application()
