"""The one thing pyproject.toml can't say: `shardfix.pth` goes to the top of site-packages, beside the package, so that
SHARDFIX=... enables the plugin for scripts that never import shardfix (python/shardfix/_startup.py)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = os.path.join("python", "shardfix.pth")


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, os.path.basename(PTH)), preserve_mode=0)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, os.path.basename(PTH))]


setup(cmdclass={"build_py": BuildPyWithPth})
