"""The audit's components, as an evidence pack lays them out in ``components.json``.

An auditor tests the deletion system part by part; a pack holds, per part, the records it
rests on, the tests run on them at export and their result. No Django and no database, like
``pack``: the offline verifier reads the same keys::

    {"format": "dropportal-components/1",
     "components": {"list_selection": {"title": ..., "result": "pass" | "fail",
                                       "records": {...}, "files": [...],
                                       "tests": [{"name": ..., "result": ..., "detail": ...}],
                                       "proves": ..., "cannot_prove": ...}, ...}}

    problems = component_problems(document, pack_members)   # [] when it holds together
    problems = vector_problems("hashing", component, name, vectors_document)
"""

from __future__ import annotations

from typing import Any

FORMAT = "dropportal-components/1"
FILE = "components.json"
PASS, FAIL = "pass", "fail"

# In the audit's order.
TITLES = {
    "list_selection": "List selection",
    "drop_access": "DROP access",
    "standardization": "Standardization",
    "hashing": "Hashing",
    "matching": "Matching",
    "actioning": "Actioning",
    "status_reporting": "Status reporting",
    "suppression_list": "Suppression list",
    "service_providers": "Service providers and contractors",
}
KEYS = tuple(TITLES)
# A component's file of test vectors (standardization, hashing): each ``input``,
# ``expected`` and ``computed`` value and whether they are ``equal``.
VECTORS_SUFFIX = "_vectors.json"
EQUAL, DIFFERS = "equal", "differs"
# The matching component's file per cycle: the rematch's counts by reason (``explained``,
# ``unexplained``), its ``result`` and a few ``examples`` per reason, each explained one
# citing the ledger ``event`` (kind, id) that explains it.
REMATCH_FORMAT = "dropportal-rematch/1"
MATCHING_DIR = "components/matching/"


def component_problems(document: Any, members: set[str]) -> list[str]:
    """What does not hold in a ``components.json``: every component present, each result
    the one its tests give, every file it names in the pack."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return [f"{FILE} is not a {FORMAT} document"]
    components = document.get("components")
    if not isinstance(components, dict):
        return [f"{FILE} has no components"]
    problems = [f"{FILE}: component {key} is missing" for key in KEYS if key not in components]
    problems += [f"{FILE}: {key} is not a component" for key in components if key not in TITLES]
    for key, component in components.items():
        if not isinstance(component, dict):
            problems.append(f"{FILE}: {key} is not an object")
            continue
        tests = component.get("tests")
        if not isinstance(tests, list) or not tests:
            problems.append(f"{FILE}: {key} holds no tests")
            continue
        results = [test.get("result") if isinstance(test, dict) else None for test in tests]
        if any(result not in (PASS, FAIL) for result in results):
            problems.append(f"{FILE}: {key} has a test without a pass or fail result")
        expected = PASS if all(result == PASS for result in results) else FAIL
        if component.get("result") != expected:
            problems.append(
                f"{FILE}: {key} says {component.get('result')!r} but its tests give {expected!r}"
            )
        files = component.get("files") or []
        if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
            problems.append(f"{FILE}: {key}'s files are not a list of names")
            continue
        problems += [
            f"{FILE}: {key} names {name}, which is not in the pack"
            for name in files
            if name not in members
        ]
    return problems


def vector_problems(key: str, component: dict[str, Any], name: str, document: Any) -> list[str]:
    """What does not hold in a component's vectors file: each vector's result is what its
    expected and computed values give (compared here, not taken from the file), and a
    component that says pass has no vector that differs. A pass is re-checked, not trusted."""
    vectors = document.get("vectors") if isinstance(document, dict) else None
    if not isinstance(vectors, list) or not all(isinstance(v, dict) for v in vectors):
        return [f"{name} holds no list of vectors"]
    problems = []
    differ = 0
    for number, vector in enumerate(vectors, start=1):
        equal = (
            isinstance(vector.get("expected"), str) and vector.get("computed") == vector["expected"]
        )
        differ += not equal
        if vector.get("result") != (EQUAL if equal else DIFFERS):
            problems.append(
                f"{name}: vector {number} ({vector.get('step')} {vector.get('field')}) is "
                f"marked {vector.get('result')!r} but its computed value is "
                + ("the expected one" if equal else "not the expected one")
            )
    if component.get("result") == PASS and (differ or not vectors):
        problems.append(
            f"{FILE}: {key} says 'pass' but {name} has "
            + (f"{differ} vector(s) that differ" if vectors else "no vector")
        )
    return problems


def rematch_problems(name: str, document: Any) -> tuple[list[str], dict[int, str]]:
    """What does not hold in a matching file on its own: its result is the one its counts
    give (pass only with nothing unexplained), and each example is counted under its reason,
    an explained one citing a ledger event. Also the events it cites (id: kind), for the
    caller to find in the ledger."""
    if not isinstance(document, dict) or document.get("format") != REMATCH_FORMAT:
        return [f"{name} is not a {REMATCH_FORMAT} document"], {}
    counts: dict[str, dict[str, Any]] = {}
    for side in ("explained", "unexplained"):
        count = document.get(side)
        if not isinstance(count, dict) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in count.values()
        ):
            return [f"{name}: {side} is not a count per reason"], {}
        counts[side] = count
    expected = PASS if not counts["unexplained"] else FAIL
    problems = []
    if document.get("result") != expected:
        problems.append(
            f"{name} says {document.get('result')!r} but its unexplained differences give "
            f"{expected!r}"
        )
    examples = document.get("examples")
    if not isinstance(examples, dict):
        return [*problems, f"{name}: examples is not an object"], {}
    cited: dict[int, str] = {}
    for reason, listed in examples.items():
        if not isinstance(listed, list) or not all(isinstance(e, dict) for e in listed):
            problems.append(f"{name}: the examples of {reason} are not a list of objects")
            continue
        for example in listed:
            explained = example.get("explained") is True
            side = "explained" if explained else "unexplained"
            if example.get("reason") != reason or len(listed) > counts[side].get(reason, 0):
                problems.append(
                    f"{name}: an example of {reason} (work item "
                    f"{example.get('work_item_id')}) is not counted {side} under {reason}"
                )
                continue
            if not explained:
                continue
            event = example.get("event")
            event_id = event.get("id") if isinstance(event, dict) else None
            if not isinstance(event_id, int) or isinstance(event_id, bool):
                problems.append(
                    f"{name}: the explained {reason} of work item "
                    f"{example.get('work_item_id')} cites no ledger event"
                )
                continue
            cited[event_id] = str(event.get("kind"))
    return problems, cited
