"""Regenerate the Python stubs of every `.proto` under `protos/`.

    python -m shared.proto.generate           # rewrite shared/proto/pagoda/...
    python -m shared.proto.generate --check   # exit 1 if the committed stubs are stale

protoc names imports after the proto package (`from pagoda.worker.v1 import
...`), but the stubs live inside `shared.proto`, so those imports are
rewritten to `from shared.proto.pagoda.worker.v1 import ...`. Only
`grpcio-tools` is needed (the `dev` extra).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "protos"
STUBS_ROOT = Path(__file__).resolve().parent
PACKAGE = "shared.proto"
# Top-level proto packages whose stubs live here; each becomes shared/proto/<name>/.
PROTO_PACKAGES = ("pagoda",)
_IMPORT = re.compile(rf"^(from|import) ({'|'.join(PROTO_PACKAGES)})([. ])", re.MULTILINE)
# Version stamps of the generating tools. They say which runtime the stubs need,
# not what the protos say, so a newer grpcio-tools alone does not make stubs stale.
_VERSION_STAMPS = (
    re.compile(r"(# Protobuf Python Version: ).*"),
    re.compile(r"(Domain\.PUBLIC,\n)(\s*\d+,\n){3}"),
    re.compile(r"(GRPC_GENERATED_VERSION = ).*"),
)


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs of every proto under `out_dir`; return the files written."""
    from grpc_tools import protoc

    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    protos = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(protos)}")
    written = []
    for name in PROTO_PACKAGES:
        for path in sorted((out_dir / name).rglob("*.py*")):
            text = _IMPORT.sub(rf"\1 {PACKAGE}.\2\3", path.read_text())
            path.write_text(text)
            written.append(path)
        # Every folder on the way down is a package.
        for folder in [out_dir / name, *(p for p in (out_dir / name).rglob("*") if p.is_dir())]:
            init = folder / "__init__.py"
            init.write_text("")
            written.append(init)
    return sorted(written)


def stale_stubs(stubs_root: Path = STUBS_ROOT) -> list[str]:
    """Paths (relative to `stubs_root`) whose committed content differs from a fresh run."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.relative_to(tmp) for p in generate(Path(tmp))}
        committed = {
            p.relative_to(stubs_root)
            for name in PROTO_PACKAGES
            for p in (stubs_root / name).rglob("*.py*")
            if "__pycache__" not in p.parts
        }
        stale = [str(p) for p in sorted(fresh ^ committed)]
        for rel in sorted(fresh & committed):
            if _unstamped(Path(tmp) / rel) != _unstamped(stubs_root / rel):
                stale.append(str(rel))
        return stale


def _unstamped(path: Path) -> str:
    text = path.read_text()
    for stamp in _VERSION_STAMPS:
        text = stamp.sub(r"\1", text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="Only report stale stubs.")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_stubs()
        for path in stale:
            print(f"stale: shared/proto/{path}", file=sys.stderr)
        return 1 if stale else 0
    for name in PROTO_PACKAGES:
        shutil.rmtree(STUBS_ROOT / name, ignore_errors=True)
    for path in generate(STUBS_ROOT):
        print(path.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
