"""The admin's tests render whole pages as a deployment renders them.

Django's test set-up has every template render send ``template_rendered``, and the test
client keep each template with a copy of its context, for ``response.context`` and
``response.templates``: a page renders a hundred and more templates (widgets, rows,
includes), and that record was near a quarter of what a page cost. Most tests read the page,
not the record; a test that reads ``response.context`` asks for ``templates_recorded``
(without it ``response.context`` is None: such a test fails, it never passes unseen).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.template.base import Template
from django.test import utils as test_utils
from django.test.utils import _TestState


def _rendering(render: Callable[..., Any]) -> Iterator[None]:
    # Its own patch, not the test's ``monkeypatch``: a test's ``monkeypatch.undo()`` leaves it.
    before = getattr(Template, "_render")  # noqa: B009 (not in Django's stubs)
    setattr(Template, "_render", render)  # noqa: B010
    try:
        yield
    finally:
        setattr(Template, "_render", before)  # noqa: B010


@pytest.fixture(autouse=True)
def templates_unrecorded() -> Iterator[None]:
    saved = getattr(_TestState, "saved_data", None)
    # Django's test environment set up: its own render, as it was before the set-up.
    yield from _rendering(
        saved.template_render if saved is not None else getattr(Template, "_render")  # noqa: B009
    )


@pytest.fixture
def templates_recorded(templates_unrecorded: None) -> Iterator[None]:
    """Django's record of what a response rendered: ``response.context``."""
    yield from _rendering(test_utils.instrumented_test_render)  # type: ignore[attr-defined]
