"""conftest.py — shared fixtures of the Python suites (tests/python).

The suites test the installed `attn` package (tests/python/run.sh builds the tree's
package into a temporary folder and puts it first on PYTHONPATH); the header line says
which one was imported.
"""
import numpy as np
import pytest

import attn


def pytest_report_header(config):
    return "attn %s from %s, kernel %s" % (attn.__version__, attn.__file__, attn.kernel_name())


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)

