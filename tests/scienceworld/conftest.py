"""ScienceWorld's tests run against the real simulator: the `scienceworld` wheel's jar in a real JVM. Without the
package or a Java runtime they skip, naming what is missing (`make install` brings both)."""

import importlib.util
import shutil

import pytest

_MISSING = [what for what, there in (
    ("the `scienceworld` package (pip install scienceworld==1.2.3)", importlib.util.find_spec("scienceworld")),
    ("a Java runtime (`java`; apt-get install openjdk-17-jre-headless)", shutil.which("java")),
) if not there]
if _MISSING:
    pytest.skip("ScienceWorld needs " + " and ".join(_MISSING), allow_module_level=True)
