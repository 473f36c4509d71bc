"""The test doubles keep up with what they stand for."""

import inspect

import pytest

from gearhorn.stomp.backend import Backend
from tests.fakes import FakeBroker

pytestmark = pytest.mark.timeout(10)


def _methods(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(cls).items()
            if callable(member) and not name.startswith("_")}


def test_the_fake_broker_has_every_backend_method_with_its_parameters():
    wanted, fake = _methods(Backend), _methods(FakeBroker)
    assert sorted(set(wanted) - set(fake)) == []
    for name, signature in wanted.items():
        assert list(fake[name].parameters) == list(signature.parameters), name
