"""Zip archives read with bounded sizes: a program file and the archives inside it.

A zip member says in its header how large it is; a compressed one can say
1 GiB and take a few hundred kilobytes on disk, so reading it blindly makes
the loader inflate whatever the file asks for. Before any member is read,
:func:`checked_members` checks every header against the archive itself:
names are unique, no member is encrypted, each member's stored bytes lie
inside the archive and their stored sizes together fit in it (headers cannot
point at the same bytes to multiply them), a stored member is as large as it says, and compressed
members (``torchdefer.save_program`` writes none; ``torch.jit.save`` compresses its
code) inflate to at most ``INFLATED_LIMIT`` together. What is then read is
at most the archive's own size plus that limit, and zipfile stops at each
header's size and checks its CRC-32 (a damaged or cut member fails there).
"""

from __future__ import annotations

import io
import zipfile

from torchdefer.errors import ProgramFileError

__all__ = ["INFLATED_LIMIT", "checked_members", "checked_size", "nested_members"]

INFLATED_LIMIT = 64 << 20
"""Bytes all compressed members of one archive may inflate to (code, JSON; not weights)."""


def checked_members(zf: zipfile.ZipFile, size: int, name: str,
                    where: str = "") -> list[zipfile.ZipInfo]:
    """The headers of ``zf`` (an archive of ``size`` bytes), each checked against
    the archive; nothing is read.

    Args:
        zf: the open archive.
        size: its length in bytes.
        name: the file's name, for messages.
        where: the member holding this archive (``"weights.pt"``), if nested.

    Raises:
        ProgramFileError: naming the file and the member.

    Example:
        >>> import io, zipfile
        >>> buffer = io.BytesIO()
        >>> with zipfile.ZipFile(buffer, "w") as zf:
        ...     zf.writestr("a.txt", "hi")
        >>> [i.filename for i in checked_members(zipfile.ZipFile(buffer), 120, "f.zip")]
        ['a.txt']
    """
    infos = zf.infolist()
    prefix = f"{where}: " if where else ""
    seen: set[str] = set()
    stored = inflated = 0
    for info in infos:
        part = f"{name!r}: {prefix}member {info.filename!r}"
        if info.filename in seen:
            raise ProgramFileError(f"{part} appears twice in the archive; which one a reader "
                                   "takes is not defined, so the file is refused; save it again")
        seen.add(info.filename)
        if info.flag_bits & 0x1:
            raise ProgramFileError(f"{part} is encrypted; torchdefer reads plain archives only")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ProgramFileError(f"{part} uses compression method {info.compress_type}; only "
                                   "stored or deflated members are read; save the program again")
        if info.header_offset + info.compress_size > size:
            raise ProgramFileError(f"{part} says it takes {info.compress_size} bytes from offset "
                                   f"{info.header_offset}, past the end of the {size}-byte "
                                   "archive: it is truncated or damaged; save the program again")
        stored += info.compress_size
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise ProgramFileError(f"{part} is stored uncompressed in {info.compress_size} bytes "
                                   f"but says it holds {info.file_size}: the archive is damaged; "
                                   "save the program again")
        if info.compress_type == zipfile.ZIP_DEFLATED:
            inflated += info.file_size
            if inflated > INFLATED_LIMIT:
                raise ProgramFileError(
                    f"{part} is compressed and says it inflates to {info.file_size} bytes, "
                    f"which takes the compressed members past {INFLATED_LIMIT} bytes; refusing "
                    "to inflate it (torchdefer.save_program writes members uncompressed: save the "
                    "program again rather than recompressing the file)")
    if stored > size:
        raise ProgramFileError(f"{name!r}: {prefix}the members' headers claim {stored} bytes in "
                               f"a {size}-byte archive (headers sharing bytes): the archive is "
                               "damaged or crafted; save the program again")
    return infos


def checked_size(info: zipfile.ZipInfo, declared: object, name: str) -> None:
    """``info``'s member as large as the program's header (``torchdefer.json``)
    declares, checked before the member is read."""
    if not isinstance(declared, dict):
        raise ProgramFileError(f"{name!r}: torchdefer.json's member sizes are not a table; "
                               "save the program again")
    member = info.filename
    if member not in declared:
        raise ProgramFileError(f"{name!r}: member {member!r} is not one torchdefer.json "
                               "declares: the file was changed after it was saved; save the "
                               "program again")
    if declared[member] != info.file_size:
        raise ProgramFileError(f"{name!r}: member {member!r} holds {info.file_size} bytes, "
                               f"torchdefer.json declares {declared[member]!r}: the file was "
                               "changed after it was saved; save the program again")


def nested_members(data: bytes, name: str, member: str) -> None:
    """Check the headers of the archive stored as ``member`` (``torch.save``'s zip)."""
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return  # not a zip (a legacy torch.save pickle): torch.load says what it is
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        checked_members(zf, len(data), name, member)
