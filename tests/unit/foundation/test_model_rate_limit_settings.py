"""The model provider's rate limits as settings: "10 requests per minute to the model per tenant" is
a bucket per tenant that lets one call go at once and the next one every 6.7 s, never more than ten
in any minute; a token limit's bucket holds a quarter of it; a bad value names its variable."""

from __future__ import annotations

import pytest

from longrun.config import Settings
from longrun.domain.rate_limit import Charge, Per, Unit, empty, reserve
from longrun.errors import ConfigError

PER_TENANT = {"LONGRUN_MODEL_REQUESTS_PER_PERIOD": "10", "LONGRUN_MODEL_RATE_PER": "tenant"}


def test_no_model_limit_is_set_by_default() -> None:
    assert Settings.from_env({}).model_rate_limits() == ()


def test_ten_requests_per_minute_per_tenant_go_one_then_one_every_six_point_seven_seconds() -> None:
    (limit,) = Settings.from_env(PER_TENANT).model_rate_limits()
    assert (limit.name, limit.per, limit.period, limit.unit) == ("model-requests", Per.TENANT, 60.0, Unit.REQUESTS)
    assert limit.bucket("acme") != limit.bucket("globex")
    bucket, times = empty(limit.bucket("acme"), limit, 0.0), []
    for _ in range(30):
        placed = reserve([Charge(bucket, limit, 1)], 0.0)
        (bucket,) = placed.buckets
        times.append(placed.go_at)
    assert times[:3] == pytest.approx([0.0, 60 / 9, 120 / 9])
    assert max(sum(1 for t in times if start <= t < start + 60) for start in times) <= 10


def test_a_token_limit_s_bucket_holds_a_quarter_of_it_and_both_limits_count_together() -> None:
    requests, tokens = Settings.from_env({**PER_TENANT, "LONGRUN_MODEL_TOKENS_PER_PERIOD": "40000",
                                          "LONGRUN_MODEL_RATE_PERIOD": "6s"}).model_rate_limits()
    assert (tokens.name, tokens.unit, tokens.burst, tokens.amount + tokens.burst, tokens.period) == (
        "model-tokens", Unit.TOKENS, 10_000, 40_000, 6.0)
    assert requests.amount + requests.burst == 10


@pytest.mark.parametrize(("variable", "raw"), [("LONGRUN_MODEL_REQUESTS_PER_PERIOD", "1"),
                                               ("LONGRUN_MODEL_TOKENS_PER_PERIOD", "-5"),
                                               ("LONGRUN_MODEL_RATE_PER", "user")])
def test_a_bad_value_names_its_variable(variable: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env({variable: raw})
