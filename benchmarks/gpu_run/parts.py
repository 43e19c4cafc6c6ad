"""Files in numbered parts with checksums, and back: what crosses to and from the GPU machine.

A device call carries at most 64 MiB with the working tree and brings back at most 8 files of 16 MiB, so a
model travels as parts spread over calls and trained weights come back as parts. ``split`` writes a tar of
the given paths as ``NAME.partNN`` files of at most ``--part-mib`` and ``NAME.parts.json`` (each part's
and the whole's SHA-256, and the paths inside); ``join`` checks every checksum before it unpacks, so a part
that is missing, cut short or corrupted is named instead of half a model being used. Standard library only:
it runs on the GPU machine before anything is installed.

    python benchmarks/gpu_run/parts.py split .gpu-model --name model --part-mib 11 --out DIR
    python benchmarks/gpu_run/parts.py join DIR [DIR ...] --name model --into runs/gpu-model
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

MIB = 2**20


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split(paths: list[Path], name: str, part_mib: float, out: Path) -> list[Path]:
    """Tar ``paths`` (each under its own name) into parts of at most ``part_mib`` MiB in ``out``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in paths:
            tar.add(path, arcname=path.name)
    whole = buffer.getvalue()
    size = max(1, int(part_mib * MIB))
    out.mkdir(parents=True, exist_ok=True)
    written, parts = [], []
    for number, start in enumerate(range(0, len(whole), size)):
        chunk = whole[start : start + size]
        part = out / f"{name}.part{number:02d}"
        part.write_bytes(chunk)
        written.append(part)
        parts.append({"file": part.name, "bytes": len(chunk), "sha256": sha256(chunk)})
    manifest = {
        "name": name,
        "bytes": len(whole),
        "sha256": sha256(whole),
        "parts": parts,
        "contents": [path.name for path in paths],
    }
    (out / f"{name}.parts.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return written


def find(folders: list[Path], filename: str) -> Path | None:
    return next((folder / filename for folder in folders if (folder / filename).is_file()), None)


def join(folders: list[Path], name: str, into: Path) -> dict:
    """Check and unpack the parts of ``name`` found in any of ``folders`` into ``into``; the manifest."""
    manifest_path = find(folders, f"{name}.parts.json")
    if manifest_path is None:
        raise SystemExit(f"no {name}.parts.json in {', '.join(map(str, folders))}")
    manifest = json.loads(manifest_path.read_text())
    chunks = []
    for part in manifest["parts"]:
        path = find(folders, part["file"])
        if path is None:
            raise SystemExit(f"{part['file']} is missing (looked in {', '.join(map(str, folders))})")
        chunk = path.read_bytes()
        if len(chunk) != part["bytes"] or sha256(chunk) != part["sha256"]:
            raise SystemExit(f"{path}: checksum mismatch ({len(chunk)} bytes; expected {part['bytes']})")
        chunks.append(chunk)
    whole = b"".join(chunks)
    if sha256(whole) != manifest["sha256"]:
        raise SystemExit(f"{name}: the joined parts do not match the whole's checksum")
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(whole), mode="r") as tar:
        tar.extractall(into, filter="data")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    to_parts = commands.add_parser("split", help="paths -> NAME.partNN + NAME.parts.json")
    to_parts.add_argument("paths", nargs="+", type=Path)
    to_parts.add_argument("--name", required=True)
    to_parts.add_argument("--part-mib", type=float, default=15.0)
    to_parts.add_argument("--out", type=Path, required=True)
    from_parts = commands.add_parser("join", help="check and unpack NAME's parts")
    from_parts.add_argument("folders", nargs="+", type=Path)
    from_parts.add_argument("--name", required=True)
    from_parts.add_argument("--into", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "split":
        for part in split(args.paths, args.name, args.part_mib, args.out):
            print(f"{part} {part.stat().st_size / MIB:.1f} MiB")
    else:
        manifest = join(args.folders, args.name, args.into)
        print(f"{args.name}: {len(manifest['parts'])} parts checked, {manifest['contents']} in {args.into}")


if __name__ == "__main__":
    main(sys.argv[1:])
