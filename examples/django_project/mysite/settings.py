"""Settings of the sample project: one app (``orders``), SQLite, wurk.

``DJANGO_DB`` names the SQLite file (default ``db.sqlite3`` here) and
``REDIS_URL`` the Redis, so the tests can give each run its own.
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "sample-project-only"  # an example, never deployed
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "mysite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "wurk.contrib.django",
    "orders",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DJANGO_DB", str(BASE_DIR / "db.sqlite3")),
        # Several worker processes write at once: wait for the lock, not fail.
        "OPTIONS": {"timeout": 20},
    },
}

# Every wurk setting may go here; REDIS_URL and WURK_* variables sit under it.
WURK = {
    "redis_url": os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
    "queues": ["orders", "default"],
    "concurrency": 4,
    "heartbeat_interval": 1,
    "poll_interval_average": 1,
    "shutdown_timeout": 5,
}
# Pushes inside transaction.atomic wait for the commit (True is the default).
WURK_ON_COMMIT = True
