"""The temperature checks of seedfast/sampling_params.py: a sampler's (>= 0, 0 greedy) and a scoring pass's (> 0),
each finite, each refusing what would make every token equally likely (inf) or every number NaN."""

from __future__ import annotations

import math

import pytest

from seedfast.sampling_params import SamplingParams, check_scoring_temperature


@pytest.mark.parametrize("temperature", [math.inf, math.nan, -0.5, True, "1.0"])
def test_a_sampler_refuses_a_temperature_that_is_not_a_finite_number_at_least_zero(temperature):
    with pytest.raises(ValueError, match=r"^temperature must be a finite number >= 0 \(0 = greedy\), got "):
        SamplingParams(max_new_tokens=4, temperature=temperature)


def test_a_sampler_takes_greedy_and_positive_temperatures():
    assert SamplingParams(max_new_tokens=4, temperature=0).temperature == 0
    assert SamplingParams(max_new_tokens=4, temperature=0.7).temperature == 0.7


@pytest.mark.parametrize(("temperature", "shown"), [(0.0, "0.0"), (math.inf, "inf"), (math.nan, "nan"), (-1, "-1"),
                                                    (True, "True")])
def test_scoring_refuses_a_temperature_that_is_not_finite_and_positive_naming_the_caller(temperature, shown):
    with pytest.raises(ValueError, match=rf"^fused_loss: temperature must be finite and > 0, got {shown}$"):
        check_scoring_temperature(temperature, "fused_loss")


def test_scoring_takes_a_positive_temperature_as_a_float():
    assert check_scoring_temperature(2) == 2.0 and isinstance(check_scoring_temperature(2), float)
