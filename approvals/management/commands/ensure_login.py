from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Make sure someone can log in: if there is no user at all, create an admin "
        "with a random password and print the username and password once."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username: str, **options) -> None:
        User = get_user_model()
        if User.objects.exists():
            if options["verbosity"] >= 2:
                self.stdout.write("Users exist; nothing to do.")
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(
            self.style.SUCCESS(
                "Created the first login (shown only this once; change it in the admin):\n"
                f"  username: {username}\n  password: {password}"
            )
        )
