"""Committed base models of the arithmetic demo, checked by sha256 before use.

The demo's bootstrap lands on a different base on every CPU (its supervised run is chaotic and
torch's CPU kernels round differently by instruction set), and how fast RL learns from a base
differs between bases of equal accuracy. So the demo and its learning test start from one
committed base, made by scripts/make_demo_base.py; the bootstrap stays for other settings.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CHECKSUMS = "SHA256SUMS"
DEMO_BASE = Path(__file__).parent / "demo"


class CorruptBaseError(RuntimeError):
    """A committed base's files do not match its SHA256SUMS (a bad checkout, a Git LFS
    pointer, an edit)."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_checksums(folder: Path) -> None:
    """Writes `SHA256SUMS` (`sha256sum` format) over every other file in `folder`."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS)
    lines = [f"{_sha256(p)}  {p.name}\n" for p in files]
    (folder / CHECKSUMS).write_text("".join(lines))


def verified_base(folder: Path) -> Path:
    """`folder`, once every file its SHA256SUMS names has that digest; else CorruptBaseError."""
    listing = folder / CHECKSUMS
    if not listing.is_file():
        raise CorruptBaseError(f"{listing} is missing")
    for line in listing.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        path = folder / name
        if not path.is_file() or _sha256(path) != digest:
            raise CorruptBaseError(f"{path} does not match its sha256 in {listing}")
    return folder
