"""Suite-wide settings: under CI (CI=true) property tests draw the same examples on every run, so a red CI
is a regression, never a new random draw; locally they keep exploring."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
