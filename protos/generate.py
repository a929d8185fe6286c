"""Regenerate the checked-in Python stubs from ``protos/*.proto``.

Usage::

    python -m tetriserve.protos.generate            # rewrite protos/*_pb2*.py{,i} in place
    python -m tetriserve.protos.generate --out DIR  # write DIR/protos/... instead (used by the staleness test)

The protos are compiled from a staging copy laid out as they install
(``tetriserve/protos/*.proto``), so the generated gRPC module imports its
messages as ``from tetriserve.protos import tetriserve_pb2``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent


def proto_files() -> list[Path]:
    """The ``.proto`` files under ``protos/``, sorted."""
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path = REPO_ROOT) -> list[Path]:
    """Run ``grpc_tools.protoc`` on every proto; return the files written under ``out_root/protos``."""
    from grpc_tools import protoc  # imported lazily: a build tool, not a runtime dependency

    out_dir = Path(out_root) / "protos"
    out_dir.mkdir(parents=True, exist_ok=True)
    protos = proto_files()
    if not protos:
        raise ValueError(f"no .proto files found in {PROTO_DIR}")
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "tetriserve" / "protos"
        staged.mkdir(parents=True)
        for proto in protos:
            shutil.copy(proto, staged / proto.name)
        sources = [f"tetriserve/protos/{p.name}" for p in protos]
        args = ["grpc_tools.protoc", f"--proto_path={tmp}", f"--python_out={tmp}", f"--pyi_out={tmp}"]
        code = protoc.main([*args, f"--grpc_python_out={tmp}", *sources])
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code} for {sources}")
        written = []
        for path in sorted(staged.iterdir()):
            if path.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")):
                written.append(Path(shutil.copy(path, out_dir / path.name)))
    logger.info("generated %s", [str(p) for p in written])
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="Root to write protos/... under.")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)


if __name__ == "__main__":
    main()
