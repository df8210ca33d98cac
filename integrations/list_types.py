"""DROP's list types, defined once: the ``hash_type`` dropportal stores and hashes each as,
and the name DROP gives it in its file names (``<YYYYMMDD>_<DataBrokerId>_<DataType>.csv``)::

    from integrations.list_types import DATA_TYPE_OF, HASH_TYPES
    DATA_TYPE_OF["name_vin"]  # "NameVIN"

Pure Python: the protocol code (``drop/``), the models' choices and the selectors read it.
"""

from __future__ import annotations

from typing import Final

# hash_type -> DROP's data type, in the order the console and exports list them.
DATA_TYPE_OF: Final[dict[str, str]] = {
    "email": "Email",
    "phone": "Phone",
    "ndz": "NDZ",
    "name_vin": "NameVIN",
    "maid": "MAID",
    "ctvid": "CTVID",
}
HASH_TYPES: Final[tuple[str, ...]] = tuple(DATA_TYPE_OF)
# The data type of the file naming identifiers DROP withdrew: no list, and no status owed.
REMOVED: Final[str] = "Removed"


def file_name_pattern(data_type: str = "[A-Za-z]+") -> str:
    """A DROP file name, ``<YYYYMMDD>_<DataBrokerId>_<DataType>[_<Suffix>].csv``, as a regular
    expression Python's ``re`` and PostgreSQL both read (groups: date, broker, data type,
    suffix); ``data_type`` narrows it to one type (``REMOVED``)."""
    return rf"([0-9]{{8}})_([0-9]{{4}})_({data_type})(?:_([A-Za-z0-9]+))?\.csv"


# What staff read where a list type is chosen or shown: DROP's name, NDZ spelled out.
LABELS: Final[dict[str, str]] = {**DATA_TYPE_OF, "ndz": "NDZ (name, date of birth, ZIP)"}
