"""The first of an evidence pack's checks: every byte of the archive outside the members'
data is what the writer makes (``pack.member_info``'s fixed metadata, no byte between
members, the directory and end records exactly as ``zipfile`` writes them)::

    stored = check_structure(raw, archive)   # {member name: (data offset, stored length)}

No Django and no database, like the rest of the verifier. ``PackInvalid`` names the first
thing in a pack that does not hold, here and in ``checks``.
"""

from __future__ import annotations

import io
import struct
import zipfile
from typing import IO

from integrations.evidence import pack

_EOCD = struct.Struct("<4s4H2LH")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
_LIMIT_32 = 0xFFFFFFFF
_LIMIT_16 = 0xFFFF


class PackInvalid(Exception):
    """The first thing in the pack that does not hold."""


def _dos_time(date_time: tuple[int, ...]) -> tuple[int, int]:
    year, month, day, hour, minute, second = date_time
    return (hour << 11) | (minute << 5) | (second // 2), ((year - 1980) << 9) | (month << 5) | day


def _zip64_extra(info: zipfile.ZipInfo) -> bytes:
    """The one extra field the writer's directory entry has: ZIP64's, for a member past
    ``zipfile.ZIP64_LIMIT`` (2 GiB: sizes) or starting past it (offset), as ``zipfile``
    writes it; none otherwise. Any other field (a Unicode path that unzip shows in place of
    the name, bytes of no meaning) is not the writer's."""
    values = []
    if max(info.compress_size, info.file_size) > zipfile.ZIP64_LIMIT:
        values += [info.file_size, info.compress_size]
    if info.header_offset > zipfile.ZIP64_LIMIT:
        values.append(info.header_offset)
    return struct.pack(f"<HH{len(values)}Q", 1, 8 * len(values), *values) if values else b""


def _central_entry(info: zipfile.ZipInfo) -> bytes:
    """The directory entry the writer makes for ``info`` (zipfile's own rules)."""
    sizes = (info.compress_size, info.file_size)
    if max(sizes) > zipfile.ZIP64_LIMIT:
        sizes = (_LIMIT_32, _LIMIT_32)
    offset = _LIMIT_32 if info.header_offset > zipfile.ZIP64_LIMIT else info.header_offset
    name = info.filename.encode("ascii")
    dos_time, dos_date = _dos_time(info.date_time)
    return (
        _CENTRAL.pack(
            b"PK\x01\x02",
            info.create_version,
            info.create_system,
            info.extract_version,
            info.reserved,
            info.flag_bits,
            info.compress_type,
            dos_time,
            dos_date,
            info.CRC,
            *sizes,
            len(name),
            len(_zip64_extra(info)),
            len(info.comment),
            0,
            info.internal_attr,
            info.external_attr,
            offset,
        )
        + name
        + _zip64_extra(info)
        + info.comment
    )


def _end_records(count: int, directory_size: int, directory_start: int) -> bytes:
    """The end of the archive as the writer makes it (with ZIP64 records when it is large)."""
    records = b""
    if count > zipfile.ZIP_FILECOUNT_LIMIT or max(directory_size, directory_start) > (
        zipfile.ZIP64_LIMIT
    ):
        zip64_end = directory_start + directory_size
        records += _EOCD64.pack(
            b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, directory_size, directory_start
        )
        records += _EOCD64_LOCATOR.pack(b"PK\x06\x07", 0, zip64_end, 1)
    return records + _EOCD.pack(
        b"PK\x05\x06", 0, 0, min(count, _LIMIT_16), min(count, _LIMIT_16),
        min(directory_size, _LIMIT_32), min(directory_start, _LIMIT_32), 0,
    )  # fmt: skip


def check_structure(raw: IO[bytes], archive: zipfile.ZipFile) -> dict[str, tuple[int, int]]:
    """Every byte of the archive outside the members' data is what the writer makes of the
    directory's entries, and those carry the fixed values it uses; returns where each
    member's stored data lies (its bytes are held to the manifest's digests)."""
    raw.seek(0, io.SEEK_END)
    size = raw.tell()
    position = 0
    data: dict[str, tuple[int, int]] = {}
    entries = sorted(archive.infolist(), key=lambda i: i.header_offset)
    for info in entries:
        where = f"archive member {info.filename!r}"
        if info.filename in data:
            raise PackInvalid(f"{where} appears twice")
        stored = info.filename in (pack.MANIFEST, pack.SIGNATURE)
        expected = (
            info.date_time == pack.FIXED_DATE_TIME,
            info.compress_type == (zipfile.ZIP_STORED if stored else pack.COMPRESSION),
            info.external_attr == pack.MEMBER_MODE,
            info.create_system == pack.CREATE_SYSTEM,
            info.create_version == info.extract_version == zipfile.ZIP64_VERSION,
            info.internal_attr == 0,
            info.volume == 0,
            info.reserved == 0,
            info.flag_bits == 0,
            info.comment == b"",
            info.extra == _zip64_extra(info),
            info.filename.isascii(),
        )
        if not all(expected):
            raise PackInvalid(f"{where}: its directory entry is not as the writer leaves it")
        if info.header_offset != position:
            raise PackInvalid(f"{where}: bytes outside any member before it (offset {position})")
        header_info = zipfile.ZipInfo(info.filename, date_time=info.date_time)
        for name in ("compress_type", "flag_bits", "CRC", "compress_size", "file_size"):
            setattr(header_info, name, getattr(info, name))
        header_info.extract_version = info.extract_version
        header = header_info.FileHeader(zip64=True)
        raw.seek(position)
        if raw.read(len(header)) != header:
            raise PackInvalid(f"{where}: its local header does not match its directory entry")
        data[info.filename] = (position + len(header), info.compress_size)
        position += len(header) + info.compress_size
    directory = b"".join(_central_entry(info) for info in archive.infolist())
    expected_end = directory + _end_records(len(entries), len(directory), position)
    raw.seek(position)
    if size - position != len(expected_end) or raw.read(len(expected_end)) != expected_end:
        raise PackInvalid("the archive's directory or end record is not as the writer leaves it")
    return data
