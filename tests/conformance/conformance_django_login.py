"""Create a user in the Django example's database and print a logged-in session id.

Run with DJANGO_SETTINGS_MODULE and DJANGO_DB set (after ``django-admin migrate``):
``python conformance_django_login.py USERNAME`` prints the ``sessionid`` cookie value.
"""

from __future__ import annotations

import sys

import django


def main(username: str) -> None:
    django.setup()
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.create_user(username, password="conformance-only")
    client = Client()
    client.force_login(user)
    print(client.cookies["sessionid"].value)


if __name__ == "__main__":
    main(sys.argv[1])
