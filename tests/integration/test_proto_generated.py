"""The committed generated code is exactly what the proto generates."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "src"


def test_generated_code_is_up_to_date(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        check=True,
    )
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert fresh, "protoc generated nothing"
    committed = sorted(
        p.relative_to(GENERATED)
        for p in (GENERATED / "tba" / "v1").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert committed == fresh, "run `make proto`: generated files differ in name"
    for rel in fresh:
        assert (tmp_path / rel).read_bytes() == (GENERATED / rel).read_bytes(), (
            f"{rel} is stale: run `make proto`"
        )
