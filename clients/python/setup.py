"""Setuptools hook: build_py generates the gRPC stubs before packaging."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class BuildWithStubs(build_py):
    def run(self):
        import build_stubs

        build_stubs.generate()
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
