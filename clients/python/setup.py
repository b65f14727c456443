"""Setuptools hook: the gRPC stubs are generated from
../../proto/fusebox/v1/fusebox.proto with grpcio-tools before anything is
packaged (metadata, wheel, editable install). An sdist carries the generated
fusebox_client/_gen/, so it builds without the proto."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import build_stubs  # noqa: E402


def stubs() -> None:
    if os.path.exists(build_stubs.PROTO):
        build_stubs.generate()
    elif not os.path.exists(os.path.join(build_stubs.OUT, "fusebox_pb2_grpc.py")):
        raise SystemExit(f"neither {build_stubs.PROTO} nor generated stubs found")


class BuildWithStubs(build_py):
    def run(self):
        stubs()
        super().run()


stubs()
setup(cmdclass={"build_py": BuildWithStubs})
