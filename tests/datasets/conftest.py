"""Fixtures of the data-set tests: the stand-in CQR data files (`cqr_dir`)."""

import importlib.util
import os

import pytest


def _load_cqr_standin():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cqr_standin.py")
    spec = importlib.util.spec_from_file_location("cqr_standin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CQR_STANDIN = _load_cqr_standin()


@pytest.fixture(scope="session")
def cqr_dir(tmp_path_factory):
    """The six CQR files in the formats of the published ones (`cqr_standin.py`):
    `(folder, what each data set must read as)`."""
    folder = tmp_path_factory.mktemp("cqr")
    return str(folder), CQR_STANDIN.write(folder)
