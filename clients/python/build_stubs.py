"""Generate the gRPC stubs for fusebox_client from the repository's proto.

Run by setup.py (build_py) on every build/install, and by the test suite when
the stubs are missing. Nothing generated is committed: the output goes to
fusebox_client/_gen/, which is git-ignored.

The proto is copied under a path that mirrors the Python package, so the
generated `_grpc` module imports `fusebox_client._gen.fusebox_pb2` and the
package needs no sys.path tricks. The proto package (fusebox.v1) and so the
wire names are unchanged.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.normpath(os.path.join(HERE, "..", "..", "proto", "fusebox", "v1", "fusebox.proto"))
OUT = os.path.join(HERE, "fusebox_client", "_gen")


def generate(proto: str = PROTO, out_root: str = HERE) -> None:
    import grpc_tools
    from grpc_tools import protoc  # build-time dependency only

    if not os.path.exists(proto):
        raise SystemExit(f"fusebox proto not found at {proto}")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    gen_dir = os.path.join(out_root, "fusebox_client", "_gen")
    os.makedirs(gen_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        staged = os.path.join(tmp, "fusebox_client", "_gen")
        os.makedirs(staged)
        shutil.copy(proto, os.path.join(staged, "fusebox.proto"))
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{tmp}",
                f"-I{well_known}",
                f"--python_out={out_root}",
                f"--pyi_out={out_root}",
                f"--grpc_python_out={out_root}",
                os.path.join(staged, "fusebox.proto"),
            ]
        )
    if rc != 0:
        raise SystemExit(f"grpc_tools.protoc failed with {rc}")
    init = os.path.join(gen_dir, "__init__.py")
    if not os.path.exists(init):
        with open(init, "w") as f:
            f.write('"""Generated from proto/fusebox/v1/fusebox.proto; not committed."""\n')


if __name__ == "__main__":
    generate(*sys.argv[1:])
