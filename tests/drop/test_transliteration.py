"""The transliteration table is data (integrations/drop/transliteration.json): a mistake in it
stops the import instead of hashing names differently from DROP."""

from __future__ import annotations

import json

import pytest

from integrations.drop.transliteration import TRANSLITERATION, transliteration_table


def _file(*groups: dict[str, str]) -> str:
    return json.dumps({"groups": [{"letters": "test", "map": group} for group in groups]})


def test_the_file_gives_every_group_as_one_table() -> None:
    assert transliteration_table(_file({"ß": "ss"}, {"ж": "zh", "αυ": "av"})) == {
        "ß": "ss",
        "ж": "zh",
        "αυ": "av",
    }
    assert TRANSLITERATION["щ"] == "shch"
    assert TRANSLITERATION["ъ"] == ""


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        (_file({"ж": "zh"}, {"ж": "j"}), "'ж' is in two groups"),
        ('{"groups": [{"letters": "x", "map": {"ж": "zh", "ж": "j"}}]}', "given twice"),
        (_file({"Ж": "zh"}), "lowercase and composed"),
        (_file({"e\u0301": "e"}), "lowercase and composed"),  # decomposed é
        (_file({"ж": "ž"}), "its value ASCII"),
    ],
)
def test_a_mistake_in_the_file_is_refused(text: str, refused: str) -> None:
    with pytest.raises(ValueError, match=refused):
        transliteration_table(text)
