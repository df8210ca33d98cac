"""How the ledger names whoever acted through the admin."""

from django.http import HttpRequest


def staff_actor(request: HttpRequest) -> str:
    return f"staff:{request.user.get_username()}"
