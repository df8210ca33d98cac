"""Change pages that post back the values they showed, beside the ones submitted.

Django builds a change form's initial values from the row as stored when the POST arrives,
so ``changed_data`` counts a field someone else changed after the page was opened (a 410
disabling an integration, another manager's new mode) as this person's change, and a save
puts the page's old value back. With a hidden initial the page sends what it showed, and
``changed_data`` names only what this person changed::

    fields_as_shown(form.fields, ["enabled"])   # then act on form.changed_data alone
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django import forms


def fields_as_shown(fields: Mapping[str, forms.Field], names: Iterable[str]) -> None:
    """Those of ``names`` in ``fields`` post the value the page showed, too."""
    for name in names:
        if name in fields:
            fields[name].show_hidden_initial = True
