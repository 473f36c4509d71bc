"""The test doubles keep up with what they stand for."""

import dataclasses
import inspect
import typing

import pytest

from gearhorn.stomp.sessions.backend import Backend
from tests.fakes import FakeBroker

pytestmark = pytest.mark.timeout(10)


def _methods(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(cls).items()
            if callable(member) and not name.startswith("_")}


def _parts() -> dict[str, type]:
    hints = typing.get_type_hints(Backend)
    return {part.name: hints[part.name] for part in dataclasses.fields(Backend)}


def test_the_backend_has_parts_and_each_part_methods():
    assert len(_parts()) >= 5
    for name, protocol in _parts().items():
        assert _methods(protocol), name


@pytest.mark.parametrize("part", sorted(_parts()))
def test_the_fake_broker_plays_each_part_with_its_parameters(part):
    wanted, fake = _methods(_parts()[part]), _methods(FakeBroker)
    assert sorted(set(wanted) - set(fake)) == []
    for name, signature in wanted.items():
        assert list(fake[name].parameters) == list(signature.parameters), name
