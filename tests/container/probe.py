"""Run inside the relay image (``python - < probe.py``): what it holds that it should not.

Prints one JSON object: compilers on the PATH or in the usual places, ``.git``
directories, this repository's non-product packages (tests, examples, bench,
devservers) importable, files of the installed ``outbox-relay`` outside its
product packages, and the build's ``/src`` left behind. Standard library only:
it runs on the image's Python.
"""

import importlib.metadata
import importlib.util
import json
import os
import shutil

COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "tcc", "cpp", "ld", "as")
PRODUCT = ("relay/", "producers/", "consumers/")
NOT_PRODUCT = ("tests", "examples", "bench", "devservers")
#: Not part of the image: the kernel's and the engine's own file systems.
SKIP = ("/proc", "/sys", "/dev")


def walk() -> tuple[list[str], list[str]]:
    """``.git`` directories, and compiler-looking programs (``x86_64-linux-gnu-gcc-12``, ``cc1``)."""
    gits, tools = [], []
    for top, dirs, files in os.walk("/", onerror=lambda error: None):
        if top.startswith(SKIP):
            dirs[:] = []
            continue
        gits += [os.path.join(top, name) for name in dirs + files if name == ".git"]
        tools += [
            os.path.join(top, name)
            for name in files
            if name in ("cc1", "cc1plus", "collect2") or name.endswith(("-gcc", "-g++")) or "-gcc-" in name
        ]
    return gits, tools


def main() -> None:
    """Print what was found."""
    gits, tools = walk()
    found = {
        "compilers": sorted({path for name in COMPILERS if (path := shutil.which(name))} | set(tools)),
        "git": sorted(gits),
        "importable": sorted(name for name in NOT_PRODUCT if importlib.util.find_spec(name) is not None),
        "outside_product": sorted(
            str(path)
            for path in importlib.metadata.files("outbox-relay") or []
            if not str(path).startswith(PRODUCT) and ".dist-info/" not in str(path) and not str(path).startswith("..")
        ),
        "src": os.path.exists("/src"),
        "uid": os.getuid(),
        "gid": os.getgid(),
    }
    print(json.dumps(found))


main()
