"""Zip members are read with sizes bounded by their headers and by what
``torchdefer.json`` declares; damaged members are named."""

import io
import json
import os
import struct
import tracemalloc
import zipfile
import zlib

import pytest
import torch
from crafting import _filled, _members, _write

import torchdefer
from torchdefer.descriptors import ProgramFileError
from torchdefer.descriptors._zip import INFLATED_LIMIT


def _deflated_zeros(size):
    """A raw deflate stream of ``size`` zero bytes (about 1 MiB per GiB) and its CRC-32."""
    compressor, chunk, crc = zlib.compressobj(1, zlib.DEFLATED, -15), bytes(16 << 20), 0
    parts = []
    for _ in range(size // len(chunk)):
        parts.append(compressor.compress(chunk))
        crc = zlib.crc32(chunk, crc)
    return b"".join(parts) + compressor.flush(), crc


def test_one_gib_zip_bomb_member_is_refused_before_anything_is_inflated(filled_file):
    members = _members(filled_file)
    del members["graph0.json"]
    _write(filled_file, members)
    data, crc = _deflated_zeros(1 << 30)
    info = zipfile.ZipInfo("graph0.json")
    info.compress_type, info.file_size, info.compress_size, info.CRC = zipfile.ZIP_DEFLATED, 1 << 30, len(data), crc
    with zipfile.ZipFile(filled_file, "a") as zf:  # the member as zipfile would write it, without inflating 1 GiB here
        with zf._lock:
            info.header_offset = zf.fp.tell()
            zf.fp.write(info.FileHeader())
            zf.fp.write(data)
            zf.start_dir = zf.fp.tell()
            zf.filelist.append(info)
            zf.NameToInfo[info.filename] = info
            zf._didModify = True
    assert os.path.getsize(filled_file) < 8 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ProgramFileError, match=(
                rf"{filled_file.name}': member 'graph0.json' is compressed and says it inflates to "
                rf"1073741824 bytes, which takes the compressed members past {INFLATED_LIMIT} bytes; refusing")):
            torchdefer.load_program(filled_file)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # the file's members only; the bomb was never read


def test_compressed_members_inflating_to_little_still_load(filled_file):
    members = _members(filled_file)
    _write(filled_file, members, compress=dict.fromkeys(members, zipfile.ZIP_DEFLATED))
    x = torch.arange(4.0)
    assert torch.equal(torchdefer.load_program(filled_file)(x), _filled(x))


def _patch_central(path, member, **fields):
    """Rewrite fields of ``member``'s central-directory record (a damaged or lying header)."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    with zipfile.ZipFile(path) as zf:
        at = zf.start_dir  # the outer archive's central directory, after every member
    while True:
        length = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46: at + 46 + length] == name:
            break
        at = data.index(b"PK\x01\x02", at + 4)
    offsets = {"compress_size": 20, "file_size": 24, "header_offset": 42}
    for field, value in fields.items():
        struct.pack_into("<I", data, at + offsets[field], value)
    path.write_bytes(bytes(data))


def test_stored_member_claiming_more_bytes_than_it_stores_is_damaged(filled_file):
    size = _members(filled_file)["weights.pt"].__len__()
    _patch_central(filled_file, "weights.pt", file_size=size + 1000)
    with pytest.raises(ProgramFileError, match=r"member 'weights.pt' is stored uncompressed in \d+ bytes but says it holds \d+: the archive is damaged"):
        torchdefer.load_program(filled_file)


def test_member_reaching_past_the_end_of_the_archive_is_truncated(filled_file):
    size = os.path.getsize(filled_file)
    _patch_central(filled_file, "weights.pt", file_size=size, compress_size=size)
    with pytest.raises(ProgramFileError, match=rf"member 'weights.pt' says it takes {size} bytes from offset \d+, past the end of the {size}-byte archive"):
        torchdefer.load_program(filled_file)


def test_member_cut_short_inside_the_archive_is_reported_with_its_name(filled_file):
    members = _members(filled_file)
    longer = len(members["graph0.json"]) + 10
    _patch_central(filled_file, "graph0.json", file_size=longer, compress_size=longer)
    with pytest.raises(ProgramFileError, match=rf"filled.tdp': member 'graph0.json' holds {longer} bytes, torchdefer.json declares {longer - 10}"):
        torchdefer.load_program(filled_file)
    # A file filled_file before headers declared sizes: zipfile names the member (its
    # CRC-32 check, or on Python 3.12.3+ its overlapping-entries check).
    header = json.loads(members["torchdefer.json"])
    del header["members"]
    _write(filled_file, {**members, "torchdefer.json": json.dumps(header).encode()}, declare=False)
    _patch_central(filled_file, "graph0.json", file_size=longer, compress_size=longer)
    with pytest.raises(ProgramFileError, match=r"filled.tdp': graph0.json is damaged or truncated \((Bad CRC-32 for file 'graph0.json'|Overlapped entries: 'graph0.json' \(possible zip bomb\))\)"):
        torchdefer.load_program(filled_file)


def test_member_twice_in_the_archive_is_refused(filled_file):
    members = _members(filled_file)
    with zipfile.ZipFile(filled_file, "a") as zf, pytest.warns(UserWarning, match="Duplicate name"):
        zf.writestr("weights.pt", members["weights.pt"])
    with pytest.raises(ProgramFileError, match="member 'weights.pt' appears twice in the archive"):
        torchdefer.load_program(filled_file)


def test_member_size_other_than_the_header_declares_is_refused(filled_file):
    members = _members(filled_file)
    members["graph0.json"] = members["graph0.json"] + b" "
    _write(filled_file, members, declare=False)
    with pytest.raises(ProgramFileError, match=r"member 'graph0.json' holds \d+ bytes, torchdefer.json declares \d+: the file was changed after it was saved"):
        torchdefer.load_program(filled_file)
    members["extra.bin"] = b"x"
    _write(filled_file, {**members, "graph0.json": members["graph0.json"][:-1]}, declare=False)
    with pytest.raises(ProgramFileError, match="member 'extra.bin' is not one torchdefer.json declares"):
        torchdefer.load_program(filled_file)


def test_compressed_record_inside_the_weights_archive_is_bounded_too(filled_file):
    members = _members(filled_file)
    inner = zipfile.ZipFile(io.BytesIO(members["weights.pt"]))
    records = {n: inner.read(n) for n in inner.namelist()}
    pickle_name = next(n for n in records if n.endswith("data.pkl"))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for n, d in records.items():
            zf.writestr(n, d, compress_type=zipfile.ZIP_STORED)
        zf.writestr("archive/data/bomb", bytes(INFLATED_LIMIT + 1), compress_type=zipfile.ZIP_DEFLATED)
    members["weights.pt"] = buffer.getvalue()
    _write(filled_file, members)
    with pytest.raises(ProgramFileError, match=rf"filled.tdp': weights.pt: member 'archive/data/bomb' is compressed and says it inflates to {INFLATED_LIMIT + 1} bytes"):
        torchdefer.load_program(filled_file)
    assert pickle_name  # the rest of the archive was torch's own


def test_fifo_named_like_a_program_is_refused_without_blocking(tmp_path):
    path = tmp_path / "model.tdp"
    os.mkfifo(path)
    with pytest.raises(ProgramFileError, match="model.tdp' is not a regular file"):
        torchdefer.load_program(path)


def test_missing_file_raises_what_open_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.tdp"):
        torchdefer.load_program(tmp_path / "nothing.tdp")
    (tmp_path / "folder.tdp").mkdir()
    with pytest.raises(ProgramFileError, match="folder.tdp' is not a regular file"):
        torchdefer.load_program(tmp_path / "folder.tdp")
