"""Each temp table of the consumer import is named only by the module that creates it.

The one the merge paths share is the staging table: ``consumers/load.py`` makes it and
the merge modules it calls read it (their input), as does ``fresh_partition``'s fill,
which both first-set paths call. Nothing outside ``integrations/consumers``
names any of them: the late match reads the relation the load hands it.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

INTEGRATIONS = Path(settings.BASE_DIR) / "integrations"
CREATED = re.compile(r"CREATE TEMP (?:TABLE|SEQUENCE|VIEW) (?:IF NOT EXISTS )?([a-z_]+)\b")
STAGING_READERS = {
    "consumers/fresh_partition.py",
    "consumers/merge_general.py",
    "consumers/merge_streamed.py",
}


def modules() -> dict[str, str]:
    return {
        path.relative_to(INTEGRATIONS).as_posix(): path.read_text(encoding="utf-8")
        for path in INTEGRATIONS.rglob("*.py")
        if "migrations" not in path.parts
    }


def test_each_consumer_temp_table_is_named_only_where_it_is_created() -> None:
    sources = modules()
    creators: dict[str, set[str]] = {}
    for module, text in sources.items():
        for name in CREATED.findall(text):
            creators.setdefault(name, set()).add(module)
    consumer_tables = {name: made for name, made in creators.items() if "consumer" in name}
    assert "consumer_registration_staging" in consumer_tables  # the pattern finds them

    strays = {}
    for name, made in consumer_tables.items():
        allowed = made | (STAGING_READERS if name == "consumer_registration_staging" else set())
        naming = {m for m, text in sources.items() if re.search(rf"\b{name}\b", text)}
        if naming - allowed:
            strays[name] = sorted(naming - allowed)
    assert strays == {}
