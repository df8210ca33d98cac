"""Each temp table of the consumer import is named only by the module that creates it.

Each merge path stages the rounds ``consumers/load.py`` hands it in its own tables, and
fills a fresh partition from them itself. Nothing outside ``integrations/consumers`` names
any of them: the late match reads the relation the load hands it.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

INTEGRATIONS = Path(settings.BASE_DIR) / "integrations"
CREATED = re.compile(r"CREATE TEMP (?:TABLE|SEQUENCE|VIEW) (?:IF NOT EXISTS )?([a-z_]+)\b")


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
    # The pattern finds them, one module each.
    assert consumer_tables["consumer_registration_staging"] == {"consumers/merge_general.py"}
    assert all(len(made) == 1 for made in consumer_tables.values()), consumer_tables

    strays = {}
    for name, made in consumer_tables.items():
        naming = {m for m, text in sources.items() if re.search(rf"\b{name}\b", text)}
        if naming - made:
            strays[name] = sorted(naming - made)
    assert strays == {}
