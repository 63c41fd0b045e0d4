"""gate.commands.merge's pure parts: the --shard argument and the joined notes."""

import pytest

from gate.commands.merge import join, parse_shard
from gate.records import Environment, Measurements


def test_a_shard_argument_names_what_is_wrong_with_it() -> None:
    assert parse_shard("2/3") == (2, 3)
    with pytest.raises(ValueError, match="N, the number of shards, must be at least 1"):  # not "I must be between"
        parse_shard("1/0")
    with pytest.raises(ValueError, match="I must be between 1 and N"):
        parse_shard("3/2")


def test_a_note_every_shard_made_is_kept_once() -> None:
    env = Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0)
    a, b = Measurements(environment=env), Measurements(environment=env)
    a.notes, b.notes = ["a shard measures its part", "only a"], ["a shard measures its part", "only b"]
    assert join([a, b]).notes == ["a shard measures its part", "only a", "only b"]
