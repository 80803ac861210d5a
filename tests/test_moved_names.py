"""Names that moved in the seams release still answer at their old homes, with a warning."""

from __future__ import annotations

import pytest

import dualtrain
from dualtrain import checkpoint, errors


@pytest.mark.parametrize("name", ["TimeMachine", "OptimizerState", "Restored", "CheckpointError"])
def test_checkpoint_names_moved_out_of_aerolog_still_import_with_a_warning(name):
    from dualtrain import aerolog

    with pytest.warns(DeprecationWarning, match=f"dualtrain.aerolog.{name} moved to"):
        old = getattr(aerolog, name)
    assert old is getattr(checkpoint, name)


def test_aerolog_refuses_names_it_never_had():
    from dualtrain import aerolog

    with pytest.raises(AttributeError, match="Checkpoint"):
        aerolog.Checkpoint  # noqa: B018


def test_errors_live_in_errors_and_are_reexported_where_they_were():
    from dualtrain.craft import NotRealizedError
    from dualtrain.craft.binding import NotRealizedError as FromBinding

    assert NotRealizedError is FromBinding is errors.NotRealizedError
    assert dualtrain.CheckpointError is checkpoint.CheckpointError is errors.CheckpointError
    assert issubclass(errors.CheckpointError, ValueError)
    assert issubclass(errors.NotRealizedError, RuntimeError)


def test_demo_is_a_package_with_its_table_helper():
    from dualtrain.demo import loss_table, make_data, run
    from dualtrain.demo.table import loss_table as table

    assert loss_table is table
    assert callable(run) and callable(make_data)
