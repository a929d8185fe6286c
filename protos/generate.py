"""Regenerate the checked-in Python stubs from ``protos/*.proto``.

Usage::

    python -m protos.generate            # rewrite protos/*_pb2*.py{,i} in place
    python -m protos.generate --out DIR  # write DIR/protos/... instead (used by the staleness test)

The repository root is the include path, so the generated gRPC module imports
its messages as ``from protos import tetriserve_pb2`` and works as a package.
"""

from __future__ import annotations

import argparse
import logging
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

    out_root = Path(out_root)
    (out_root / "protos").mkdir(parents=True, exist_ok=True)
    sources = [str(p.relative_to(REPO_ROOT)) for p in proto_files()]
    if not sources:
        raise ValueError(f"no .proto files found in {PROTO_DIR}")
    args = [
        "grpc_tools.protoc",
        f"--proto_path={REPO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *sources,
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code} for {sources}")
    written = sorted(
        p for p in (out_root / "protos").iterdir() if p.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))
    )
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
