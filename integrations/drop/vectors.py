"""DROP's official test vectors for standardization and hashing, and running them through the
deployed code (``integrations.drop.standardize``).

The worked examples DROP published (docs/contracts.md §12) live here, in the package, so that
the code that is deployed can prove them at any time: an evidence pack runs them at export
and holds inputs, expected and computed values (``standardization`` and ``hashing``)::

    for result in standardization_results(): result.equal, result.as_json()
    for result in hashing_results(): ...

Pure Python, no Django, like ``standardize``. Each function is looked up on the module at
run time: what runs is what is deployed (and what a test replaces).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from integrations.drop import standardize

# (field, as given, standardized, its hash): DROP's table of worked examples, then the parts
# of its NDZ example and its second phone example.
FIELD_VECTORS: Final = (
    ("first_name", "Juan Pablo", "juanpablo", "91hIbrbzNeqHs3o81O5yNrXUj7wDd2shvZ6THKi9qz8="),
    ("last_name", "Martinez", "martinez", "2wRPGbwBNxhShjRczx8GfS2c4cjvs4NJskeWloUNtp8="),
    ("dob", "July 4, 1776", "17760704", "skXYXxBER6HQTZ3rXSZH1wVGLQ054mS5rbR/bwvzy4I="),
    ("zip", "91790-3771", "91790", "2FPZucR4x7U8KlM+SFAX4LPGhwNz/PIZUCSUdDh0o/s="),
    ("zip", "M1B 1A1", "m1b1a", "n8L9q8mVeT6Xt9/EeUNiTukGDrkbPJ3DvOEx14uElxk="),
    ("zip", "00712345", "71234", "aeNUYKh7Xw5sqpxSbSP9eOHsj6iXewbUyavv89DIuhQ="),
    (
        "email",
        "Anna.Smith@Domain.com",
        "anna.smith@domain.com",
        "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE=",
    ),
    ("phone", "+1(415)555-9317", "4155559317", "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="),
    ("phone", "+84(90)123 4567", "4901234567", "ptzVkgbv9DonwvPCHmXmJ2SEOaolSh37z3ZzY/Gmm+U="),
    (
        "vin",
        "1HGCM82633A004352",
        "1hgcm82633a004352",
        "iNswy1m+0VSt8jAfFrvaiQ1R/0HAbgSwNGkwqo6QBss=",
    ),
    (
        "maid",
        "a3f1c2d4-5678-90ab-cdef-1234567890ab",
        "a3f1c2d4567890abcdef1234567890ab",
        "250KY6lOgzYUB3EHrkbDCE2kMEZQE69SF38muhoDudI=",
    ),
    (
        "ctvid",
        "SmartTV_9F8E7D6C",
        "smarttv9f8e7d6c",
        "d9fxuTIrKksBXYDlaWsvQbcyUUfCbUx7v78gd+KP+tc=",
    ),
    ("first_name", "Danielle", "danielle", "5dUD1FgiKcTJq+JQ5JZUdlyIXrSbtJ338YYbt5/HNG4="),
    ("last_name", "Johnson", "johnson", "K+TjOqPiH2/3rRRPj9WCKKHM47UDQLSAX/DGNIDuxIg="),
    ("dob", "1985-07-04", "19850704", "IWi7qxOAbBJe0fNciDj76Eg84gmj40rB7aNMK/VnFOI="),
)
# Names DROP settled by example (standardized value only, no hash published).
NAME_EXAMPLES: Final = (
    ("José", "jose"),
    ("Müller", "muller"),
    ("Иван", "ivan"),
    ("Mary-Jane", "maryjane"),
    ("O'Brien", "obrien"),
    ("  van  der  Berg ", "vanderberg"),
)
# (list type, as given, the list's hash): the whole way from a record to what DROP sends.
LIST_VECTORS: Final[tuple[tuple[str, str | dict[str, str], str], ...]] = (
    ("email", "Anna.Smith@Domain.com", "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="),
    ("phone", "+1(415)555-9317", "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="),
    ("phone", "+84(90)123 4567", "ptzVkgbv9DonwvPCHmXmJ2SEOaolSh37z3ZzY/Gmm+U="),
    (
        "maid",
        "a3f1c2d4-5678-90ab-cdef-1234567890ab",
        "250KY6lOgzYUB3EHrkbDCE2kMEZQE69SF38muhoDudI=",
    ),
    ("ctvid", "SmartTV_9F8E7D6C", "d9fxuTIrKksBXYDlaWsvQbcyUUfCbUx7v78gd+KP+tc="),
    (
        "ndz",
        {"first_name": "Danielle", "last_name": "Johnson", "dob": "1985-07-04", "zip": "91790"},
        "PQOfn1RffEKmqMmNAzDKKaoZCwxWbQZkQzPWmQo9REA=",
    ),
    (
        "name_vin",
        {"first_name": "Eve", "last_name": "Genesis", "vin": "1HGCM82633A004352"},
        "rtnDuXIe63jXYQQXW5r07GJ7lSsrib8+46QuKFwkOmk=",
    ),
)

_STANDARDIZERS: Final[dict[str, str]] = {
    "first_name": "standardize_name",
    "last_name": "standardize_name",
    "dob": "standardize_dob",
    "zip": "standardize_zip",
    "email": "standardize_email",
    "phone": "standardize_phone",
    "vin": "standardize_vin",
    "maid": "standardize_maid",
    "ctvid": "standardize_ctvid",
}


@dataclass(frozen=True)
class VectorResult:
    step: str  # "standardize", "hash", or "register" (the consumer registration's hashing)
    field: str  # the field, or the list type
    given: Any
    expected: str
    computed: str

    @property
    def equal(self) -> bool:
        return self.computed == self.expected

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "field": self.field,
            "input": self.given,
            "expected": self.expected,
            "computed": self.computed,
            # The words the offline verifier reads (evidence/components.py EQUAL, DIFFERS).
            "result": "equal" if self.equal else "differs",
        }


def _computed(run: Callable[..., str], *args: Any) -> str:
    try:
        return run(*args)
    except standardize.InvalidIdentifier as exc:
        return f"refused: {exc}"


def _standardized(field: str, given: str) -> str:
    function = getattr(standardize, _STANDARDIZERS[field])
    if _STANDARDIZERS[field] == "standardize_name":
        return str(function(given, field))
    return str(function(given))


def _hashed(standardized: str) -> str:
    return standardize.hash_value(standardized)


def _list_hashed(list_type: str, given: str | dict[str, str]) -> str:
    return standardize.list_type_hash(list_type, given)


def standardization_results() -> list[VectorResult]:
    """Every official value standardized by the deployed rules, against DROP's."""
    cases = [(field, given, standardized) for field, given, standardized, _ in FIELD_VECTORS]
    cases += [("first_name", given, standardized) for given, standardized in NAME_EXAMPLES]
    return [
        VectorResult(
            "standardize", field, given, standardized, _computed(_standardized, field, given)
        )
        for field, given, standardized in cases
    ]


def hashing_results() -> list[VectorResult]:
    """DROP's standardized values hashed by the deployed code, then each list's example from
    the record to its hash (composites included), against DROP's hashes."""
    results = [
        VectorResult("hash", field, standardized, expected, _computed(_hashed, standardized))
        for field, _, standardized, expected in FIELD_VECTORS
    ]
    results += [
        VectorResult("hash", list_type, given, expected, _computed(_list_hashed, list_type, given))
        for list_type, given, expected in LIST_VECTORS
    ]
    return results
