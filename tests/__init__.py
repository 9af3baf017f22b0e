"""The test suite, a package: shared helpers are imported by full name (`from tests.scoring.scoring_helpers import`)."""
