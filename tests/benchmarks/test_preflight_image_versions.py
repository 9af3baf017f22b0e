"""benchmarks/preflight_image_versions.py's bookkeeping without installing anything: what it counts from a JUnit file
(a failing or erroring test is named, a missing file is an error, never a pass), and the image's lock it installs."""


from benchmarks import preflight_image_versions as pf

JUNIT = """<testsuites><testsuite name="pytest">
<testcase classname="tests.a" name="test_ok"/>
<testcase classname="tests.a" name="test_bad"><failure message="x"/></testcase>
<testcase classname="tests.b" name="test_broken"><error message="y"/></testcase>
<testcase classname="tests.b" name="test_skip"><skipped message="z"/></testcase>
</testsuite></testsuites>"""


def test_junit_counts_name_what_failed(tmp_path):
    path = tmp_path / "r.xml"
    path.write_text(JUNIT)
    assert pf.junit_counts(path) == {"passed": 1, "failed": 1, "errors": 1, "skipped": 1,
                                     "failing": ["tests.a::test_bad", "tests.b::test_broken"]}


def test_a_missing_junit_file_is_an_error(tmp_path):
    counts = pf.junit_counts(tmp_path / "none.xml")
    assert counts["errors"] == 1 and counts["passed"] == 0 and "did not finish" in counts["failing"][0]


def test_the_lock_pins_the_image_versions():
    pins = dict(line.split("==") for line in pf.LOCK.read_text().splitlines() if "==" in line and line[0] != "#")
    assert pins["torch"] == "2.11.0" and pins["triton"] == "3.6.0" and pins["transformers"].startswith("5.17")
    assert set(pf.SUBSETS) == {"import", "kernels", "hf", "distributed"}
    assert all((pf.REPO / f).exists() for files in pf.SUBSETS.values() for f in files)
