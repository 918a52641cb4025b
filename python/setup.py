"""Build step of the binding: record where the installed libbraid is.

pyproject.toml holds the metadata; this only adds braid/_install.py with
the library that pkg-config's braid.pc points to at install time, so the
installed package loads it without LD_LIBRARY_PATH or BRAID_LIBRARY.
"""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py


def _pkg_config_library():
    # braid/_lib.py without importing the package (which loads the library).
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("braid_lib", os.path.join(here, "braid", "_lib.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.pkg_config_library()


class BuildPy(build_py):
    def run(self):
        super().run()
        path = _pkg_config_library() or ""
        if not path:
            self.announce("braid: pkg-config finds no braid.pc; libbraid is looked up at run time", level=3)
        out = os.path.join(self.build_lib, "braid", "_install.py")
        with open(out, "w", encoding="utf-8") as f:
            f.write('"""Written by setup.py at install time."""\n\nLIBRARY = %r\n' % path)


setup(cmdclass={"build_py": BuildPy})
