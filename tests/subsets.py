"""Parametrized cases split between the suite and `make test-extended`: the suite (and
CI) checks a few, chosen to cover the property's kinds; the others are marked
`extended`."""

import pytest


def ci_subset(names, in_ci: set[str]) -> list:
    """`names` as parameters, those outside `in_ci` marked `extended`."""
    unknown = in_ci - set(names)
    assert not unknown, f"no such case: {sorted(unknown)}"
    return [pytest.param(name, marks=[] if name in in_ci else [pytest.mark.extended]) for name in names]
