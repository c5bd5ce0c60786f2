"""pytest fixtures: the daemon is started by go test ./examples
(TestPython/pytest), which passes its address in COORDTEST_ADDR."""

import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import coordinatord  # noqa: E402


@pytest.fixture(scope="session")
def addr():
    a = os.environ.get("COORDTEST_ADDR")
    if not a:
        pytest.fail("COORDTEST_ADDR is not set: run these tests with go test -run TestPython ./examples, "
                    "or start coordinatord and set COORDTEST_ADDR=host:port")
    return a


@pytest.fixture
def client(addr):
    with coordinatord.Client(addr) as c:
        yield c


@pytest.fixture
def name(request):
    """A lock name of its own for each test."""
    return "pytest/%s/%s" % (request.node.name, uuid.uuid4().hex[:8])
