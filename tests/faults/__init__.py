"""Fault tests: each failure of `seedfast train` ends in one line and its exit code, nothing left running."""
