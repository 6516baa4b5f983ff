"""The shared type predicates: a bool is never a number, a count or a name."""

from __future__ import annotations

import math

import pytest

from wurk.core.validate import finite_float, is_count, is_number, is_text, is_whole


@pytest.mark.parametrize("value", [0, -3, 1.5, 10**400, math.inf, math.nan])
def test_ints_and_floats_are_numbers(value: object) -> None:
    assert is_number(value)


@pytest.mark.parametrize("value", [True, False, None, "1", b"1", [1], 1j])
def test_bools_strings_and_the_rest_are_not_numbers(value: object) -> None:
    assert not is_number(value)


@pytest.mark.parametrize(("value", "whole", "count"), [
    (0, True, True), (7, True, True), (-1, True, False), (True, False, False),
    (False, False, False), (2.0, False, False), ("3", False, False), (None, False, False)])
def test_whole_numbers_and_counts(value: object, whole: bool, count: bool) -> None:
    assert (is_whole(value), is_count(value)) == (whole, count)


@pytest.mark.parametrize(("value", "expected"), [
    (3, 3.0), (-2.5, -2.5), (0, 0.0), (True, None), ("1", None), (None, None),
    (math.inf, None), (-math.inf, None), (math.nan, None), (10**400, None)])
def test_finite_float_gives_a_finite_float_or_none(value: object, expected: float | None) -> None:
    assert finite_float(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("a", True), ("abc", True), ("abcd", False), ("", False), (None, False), (b"ab", False),
    (3, False)])
def test_text_is_a_non_empty_string_within_its_length(value: object, expected: bool) -> None:
    assert is_text(value, 3) is expected
