# SPDX-License-Identifier: Apache-2.0
"""Packaging hook: copies libbie.so into the package so that `pip install ./python` gives a
self-contained install. The library is taken from BIE_LIBRARY, or else from the build directory of
this checkout (build/libbie.so, as `make build` makes it). Without either, the package installs
without the library and finds it at import time (BIE_LIBRARY, or the system's library path)."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class build_py_with_lib(build_py):
    def run(self):
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        src = os.environ.get("BIE_LIBRARY") or os.path.join(here, "..", "build", "libbie.so")
        if os.path.isfile(src):
            dst = os.path.join(self.build_lib, "bie", "libbie.so")
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src, dst)
            print(f"bie: packaged {os.path.realpath(src)}")
        else:
            print("bie: no libbie.so to package (set BIE_LIBRARY or run `make build` first); "
                  "the package will look for it at import time")


setup(cmdclass={"build_py": build_py_with_lib})
