"""What pyproject.toml can't say: `shardfix.pth` goes to the top of site-packages, beside the package, so that SHARDFIX
and warnings options naming shardfix work for programs that never import it (python/shardfix/_startup.py); in an
editable install (`pip install -e .`) too, where setuptools would otherwise install only its import hook."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = os.path.join("python", "shardfix.pth")


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, os.path.basename(PTH)), preserve_mode=0)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, os.path.basename(PTH))]


class EditableWheelWithPth(editable_wheel):
    """An editable install gets shardfix.pth as a regular one does, and a path entry for python/ that static type
    checkers (mypy, pyright) follow where they can't follow setuptools' import hook. The hook stays: it maps
    `shardfix.passes`, which lives outside python/."""

    def _select_strategy(self, name, tag, build_lib):
        return _WithPthFiles(super()._select_strategy(name, tag, build_lib))


class _WithPthFiles:
    def __init__(self, strategy):
        self._strategy = strategy

    def __call__(self, wheel, files, mapping):
        self._strategy(wheel, files, mapping)
        with open(os.path.join(HERE, PTH), "rb") as f:
            wheel.writestr("shardfix.pth", f.read())
        # read before shardfix.pth ("-" sorts before "."), after setuptools' "__editable__" hook
        wheel.writestr("shardfix-editable-path.pth", os.path.join(HERE, "python") + "\n")

    def __enter__(self):
        self._strategy.__enter__()
        return self

    def __exit__(self, *exc):
        return self._strategy.__exit__(*exc)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
