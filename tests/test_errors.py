import pytest

from dualtrain.errors import (
    BackendError,
    DtypeError,
    DualtrainError,
    ShapeError,
    bad_argument,
)


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [(ShapeError, ValueError), (DtypeError, TypeError), (BackendError, TypeError)],
)
def test_each_error_is_also_its_builtin(cls, builtin):
    with pytest.raises(builtin):
        raise cls("x")
    assert issubclass(cls, DualtrainError)


def test_bad_argument_names_argument_value_and_expectation():
    err = bad_argument("batch_size", 0, "a positive int")
    assert str(err) == "batch_size must be a positive int; got batch_size=0"
    assert isinstance(err, ValueError)
    assert isinstance(err, DualtrainError)
