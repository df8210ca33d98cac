"""DROP's official vectors as the package holds them for the evidence pack: the same as the
tests' own copy of DROP's table (``test_standardize``), and all reproduced by the code."""

from __future__ import annotations

from integrations.drop import vectors
from tests.drop.test_standardize import NAME_VIN_HASH, NDZ_HASH, OFFICIAL_FIELDS


def test_the_package_holds_every_official_example() -> None:
    held = {
        (given, standardized, hashed) for _, given, standardized, hashed in vectors.FIELD_VECTORS
    }
    assert held == {
        (given, standardized, hashed) for _, given, standardized, hashed in OFFICIAL_FIELDS
    }
    lists = {list_type: hashed for list_type, _, hashed in vectors.LIST_VECTORS}
    assert (lists["ndz"], lists["name_vin"]) == (NDZ_HASH, NAME_VIN_HASH)


def test_the_deployed_code_reproduces_every_vector() -> None:
    results = vectors.standardization_results() + vectors.hashing_results()
    assert [r.as_json() for r in results if not r.equal] == []
    assert len(results) == 2 * len(vectors.FIELD_VECTORS) + len(vectors.NAME_EXAMPLES) + len(
        vectors.LIST_VECTORS
    )


def test_a_refused_value_is_computed_as_its_refusal() -> None:
    result = vectors._computed(vectors._standardized, "vin", "too short")
    assert result == "refused: vin: VIN must be 17 letters or digits after standardizing"
