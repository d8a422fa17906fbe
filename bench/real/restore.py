"""Restore the real-world suite byte-exact from git mirrors of its repositories.

    python bench/real/restore.py [--mirrors DIR] [--dest DIR] [--only ID ...]

Each manifest entry names a repository, a commit, a path and the git blob of the file at that
commit. A mirror of `owner/name` is a git directory at `DIR/owner+name/repo` (or `DIR/owner+name`),
as the search tool's `fetch github:owner/name` leaves it. The file is taken by its blob hash and
checked against `path` at `commit`, so what lands in `--dest` is exactly what was labelled.
Exit status 1 when any entry could not be restored (each one named with the reason).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.toml"
MANIFEST_PARTS = HERE / "manifest.d"
DEFAULT_DEST = HERE / "src"


def manifest_files() -> list[Path]:
    """manifest.toml, then each domain's part in manifest.d/, in name order."""
    return [MANIFEST, *sorted(MANIFEST_PARTS.glob("*.toml"))]


def load_manifest() -> list[dict]:
    entries: list[dict] = []
    for path in manifest_files():
        with path.open("rb") as handle:
            entries += tomllib.load(handle).get("script", [])
    return entries


def restored_path(entry: dict, dest: Path = DEFAULT_DEST) -> Path:
    return dest / entry["id"] / Path(entry["path"]).name


def _git_dir(mirrors: Path, repo: str) -> Path | None:
    base = mirrors / repo.replace("/", "+")
    for candidate in (base / "repo", base):
        if (candidate / "HEAD").is_file():
            return candidate
    return None


def _git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True).stdout


def restore_one(entry: dict, mirrors: Path, dest: Path, target: Path | None = None) -> str | None:
    """Write one script (to `target`, by default its place under `dest`); return why it could not be, or None."""
    git_dir = _git_dir(mirrors, entry["repo"])
    if git_dir is None:
        return f"no mirror of {entry['repo']} under {mirrors} (fetch github:{entry['repo']})"
    try:
        at_commit = _git(git_dir, "rev-parse", f"{entry['commit']}:{entry['path']}").decode().strip()
        data = _git(git_dir, "cat-file", "blob", entry["blob"])
    except subprocess.CalledProcessError as error:
        return f"{entry['repo']}@{entry['commit'][:12]}: {error.stderr.decode().strip()}"
    if at_commit != entry["blob"]:
        return f"{entry['path']} at {entry['commit'][:12]} is blob {at_commit}, not {entry['blob']}"
    target = target or restored_path(entry, dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    parser.add_argument("--only", nargs="*", default=None, help="restore only these ids")
    args = parser.parse_args(argv)
    entries = [e for e in load_manifest() if args.only is None or e["id"] in args.only]
    failures = 0
    for entry in entries:
        problem = restore_one(entry, args.mirrors, args.dest)
        if problem:
            failures += 1
            print(f"{entry['id']}: {problem}", file=sys.stderr)
    print(f"restored {len(entries) - failures} of {len(entries)} scripts into {args.dest}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
