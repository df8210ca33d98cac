"""What the DROP client raises: every exception is a ``DropApiError``, whose message never
holds the API key (the client redacts it before raising)."""

from __future__ import annotations


class DropApiError(Exception):
    """DROP answered in a way the caller must act on; ``status`` is the HTTP status if any."""

    default_message = "DROP API error"
    # True when the answer is about this one request (its files, the state it meets), so a
    # caller with other requests to send goes on; False when it is about DROP, the network
    # or our access as a whole, which every other request would meet too.
    about_this_request = False

    def __init__(self, message: str | None = None, *, status: int | None = None) -> None:
        self.message = message or self.default_message
        self.status = status
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.message} (HTTP {self.status})" if self.status else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, message={self.message!r})"


class DropAuthError(DropApiError):
    """401/403: the key is wrong, or the broker is not eligible or selected no list.

    Retrying cannot help: stop and alert staff.
    """

    default_message = "DROP refused the API key or the broker is not eligible"


class DropConflict(DropApiError):
    """409: on download, the previous download still has work items without a status
    (report first); on upload, no download waits for responses; on amend, not possible now."""

    default_message = "DROP reports a conflict with the current cycle"
    about_this_request = True


class DropPending(DropApiError):
    """202 kept coming: DROP is still building the package after ``max_wait_seconds``."""

    default_message = "DROP is still preparing the package"


class DropUnavailable(DropApiError):
    """DROP or the network kept failing (5xx, timeouts, cut bodies) after bounded retries."""

    default_message = "DROP is unavailable"


class DropThrottled(DropUnavailable):
    """429 kept coming within ``max_wait_seconds``."""

    default_message = "DROP is throttling this broker"


class DropBadRequest(DropApiError):
    """400 without DROP's per-file answer: the request itself was malformed."""

    default_message = "DROP rejected the request"
    about_this_request = True


class DropProtocolError(DropApiError):
    """DROP answered something its API does not describe (unknown status, bad body)."""

    default_message = "DROP sent an unexpected response"
    about_this_request = True
