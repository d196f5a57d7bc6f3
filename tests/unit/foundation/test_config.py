"""Settings: typed, read once, every problem reported at once by variable name."""

from __future__ import annotations

import pytest

from longrun.authoring import Registry
from longrun.config import Settings
from longrun.errors import ConfigError
from longrun.workflows import model_adapter


def test_defaults_point_at_the_local_services() -> None:
    settings = Settings.from_env({})
    assert settings.database_url == "postgresql+psycopg://postgres@127.0.0.1:5432/longrun"
    assert settings.amqp_url == "amqp://guest:guest@127.0.0.1:5672/"
    assert settings.partitions == 8
    assert settings.crash_points == ()


def test_values_are_parsed_into_their_types() -> None:
    settings = Settings.from_env({
        "LONGRUN_DATABASE_URL": "postgresql://u@db:5432/x", "LONGRUN_PARTITIONS": "16",
        "LONGRUN_PARTITION_LEASE_TTL": "2.5", "LONGRUN_LOG_LEVEL": "debug",
        "LONGRUN_OPERATOR_TOKENS": "a, b", "LONGRUN_CRASH_POINTS": "x:2,y"})
    assert settings.database_url == "postgresql+psycopg://u@db:5432/x"
    assert settings.partitions == 16
    assert settings.partition_lease_ttl == 2.5
    assert settings.log_level == "DEBUG"
    assert settings.operator_tokens == ("a", "b")
    assert settings.crash_points == ("x:2", "y")


def test_every_bad_value_is_reported_together_naming_the_variable_and_what_was_expected() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"LONGRUN_PARTITIONS": "zero", "LONGRUN_AMQP_URL": "http://x",
                           "LONGRUN_HEALTH_PORT": "70000", "LONGRUN_LOG_LEVEL": "LOUD"})
    problems = dict(caught.value.problems)
    assert problems == {
        "LONGRUN_PARTITIONS": "got 'zero'; expected an integer >= 1",
        "LONGRUN_AMQP_URL": "got a value that is not one (not shown: it is a secret); expected an amqp:// or "
                            "amqps:// URL (a cluster: amqp://user:pass@node1:5672,node2:5672/vhost)",
        "LONGRUN_HEALTH_PORT": "got '70000'; expected a port 0-65535 (0 = off)",
        "LONGRUN_LOG_LEVEL": "got 'LOUD'; expected one of DEBUG, INFO, WARNING, ERROR",
    }
    assert "4 problem(s)" in str(caught.value)


def test_every_variable_is_documented() -> None:
    names = Settings.variables()
    assert all(name.startswith("LONGRUN_") for name in names)
    secrets = {name for name in names if name.endswith("_FILE")}
    assert len(names) - len(secrets) == len(Settings.__dataclass_fields__)
    assert secrets == {f"LONGRUN_{n}_FILE" for n in (
        "DATABASE_URL", "AMQP_URL", "OPERATOR_TOKENS", "OIDC_CLIENT_SECRET", "WEBHOOK_SECRET", "WEBHOOK_SECRETS",
        "CONSOLE_SECRET", "MODEL_API_KEY", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY", "RABBITMQ_MANAGEMENT_URL")}


def test_the_default_retry_policy_and_breaker_come_from_their_variables() -> None:
    settings = Settings.from_env({"LONGRUN_RETRY_INITIAL_INTERVAL": "0.5", "LONGRUN_RETRY_BACKOFF_COEFFICIENT": "3",
                                  "LONGRUN_RETRY_MAXIMUM_INTERVAL": "60", "LONGRUN_RETRY_MAXIMUM_ATTEMPTS": "7",
                                  "LONGRUN_BREAKER_THRESHOLD": "2", "LONGRUN_BREAKER_WINDOW": "20",
                                  "LONGRUN_BREAKER_COOL_DOWN": "4"})
    policy = settings.retry_policy()
    assert (policy.initial_interval, policy.backoff_coefficient, policy.maximum_interval,
            policy.maximum_attempts) == (0.5, 3.0, 60.0, 7)
    breaker = settings.breaker()
    assert (breaker.threshold, breaker.window, breaker.cool_down) == (2, 20.0, 4.0)


def test_a_retry_cap_below_the_first_delay_is_refused_naming_both_variables() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"LONGRUN_RETRY_INITIAL_INTERVAL": "10", "LONGRUN_RETRY_MAXIMUM_INTERVAL": "5"})
    assert refused.value.problems == [("LONGRUN_RETRY_MAXIMUM_INTERVAL",
                                       "got 5.0; expected at least LONGRUN_RETRY_INITIAL_INTERVAL (10.0)")]
    with pytest.raises(ConfigError, match="LONGRUN_RETRY_BACKOFF_COEFFICIENT: got '0.5'; expected a number >= 1"):
        Settings.from_env({"LONGRUN_RETRY_BACKOFF_COEFFICIENT": "0.5"})


def test_the_standard_opentelemetry_variables_win_over_longrun_s_and_a_bad_one_is_named() -> None:
    assert Settings.from_env({}).otel_exporter == "none"
    assert Settings.from_env({"LONGRUN_OTEL_EXPORTER": "console"}).otel_exporter == "console"
    both = {"LONGRUN_OTEL_EXPORTER": "console", "OTEL_TRACES_EXPORTER": "otlp"}
    assert Settings.from_env(both).otel_exporter == "otlp"
    assert Settings.from_env({"LONGRUN_OTEL_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}).otel_exporter == "none"
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"OTEL_TRACES_EXPORTER": "zipkin", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                           "LONGRUN_LOG_FORMAT": "xml"})
    assert dict(caught.value.problems) == {
        "OTEL_TRACES_EXPORTER": "got 'zipkin'; expected none, console or otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "got 'grpc'; expected http/protobuf (spans go over OTLP/HTTP)",
        "LONGRUN_LOG_FORMAT": "got 'xml'; expected auto, json or text",
    }


def test_an_oidc_issuer_needs_its_audience_and_jwks_and_the_webhook_port_differs_from_the_gateway_s() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"LONGRUN_OIDC_ISSUER": "https://id.example.test", "LONGRUN_GATEWAY_PORT": "8080",
                           "LONGRUN_WEBHOOK_PORT": "8080"})
    assert sorted(name for name, _ in refused.value.problems) == [
        "LONGRUN_OIDC_AUDIENCE", "LONGRUN_OIDC_JWKS_URL", "LONGRUN_WEBHOOK_PORT"]
    with pytest.raises(ConfigError, match="LONGRUN_OIDC_JWKS_URL: got 'ftp://keys'"):
        Settings.from_env({"LONGRUN_OIDC_JWKS_URL": "ftp://keys"})
    configured = Settings.from_env({"LONGRUN_OIDC_ISSUER": "https://id.example.test", "LONGRUN_OIDC_AUDIENCE": "api",
                                    "LONGRUN_OIDC_JWKS_URL": "https://id.example.test/jwks",
                                    "LONGRUN_WEBHOOK_SECRETS": "forge=s1=x, github=s2"})
    assert configured.oidc_roles_claim == "roles" and configured.webhook_secrets == (("forge", "s1=x"),
                                                                                      ("github", "s2"))


def test_a_secret_comes_from_the_file_its_file_variable_names(tmp_path) -> None:  # type: ignore[no-untyped-def]
    secret = tmp_path / "console"
    secret.write_text("s3cr3t-from-a-mounted-file-of-32-bytes-or-more\n")
    settings = Settings.from_env({"LONGRUN_CONSOLE_SECRET_FILE": str(secret)})
    assert settings.console_secret == "s3cr3t-from-a-mounted-file-of-32-bytes-or-more"


def test_a_secret_from_both_a_file_and_its_variable_or_an_unreadable_file_is_refused_naming_which(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    kept = tmp_path / "tokens"
    kept.write_text("tok-one")
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"LONGRUN_OPERATOR_TOKENS_FILE": str(kept), "LONGRUN_OPERATOR_TOKENS": "tok-two",
                           "LONGRUN_WEBHOOK_SECRET_FILE": str(tmp_path / "absent")})
    problems = dict(caught.value.problems)
    assert problems["LONGRUN_OPERATOR_TOKENS_FILE"] == "set together with LONGRUN_OPERATOR_TOKENS; expected one of them"
    assert problems["LONGRUN_WEBHOOK_SECRET_FILE"].startswith(f"cannot read {tmp_path / 'absent'} (")
    assert "tok-one" not in str(caught.value) and "tok-two" not in str(caught.value)


def test_a_bad_secret_is_named_without_its_value() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"LONGRUN_WEBHOOK_SECRETS": "forge-without-equals-sign-hunter2",
                           "LONGRUN_DATABASE_URL": "mysql://root:hunter2@db/longrun"})
    assert set(dict(caught.value.problems)) == {"LONGRUN_WEBHOOK_SECRETS", "LONGRUN_DATABASE_URL"}
    assert "hunter2" not in str(caught.value)


PRICES = ('{"gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}, '
          '"m": {"input_per_mtok": 0, "output_per_mtok": 1}}')


def test_model_prices_are_read_per_model_and_a_malformed_table_is_named() -> None:
    settings = Settings.from_env({"LONGRUN_MODEL_PRICES": PRICES})
    assert settings.model_prices["gpt-4o-mini"].usage(1_000_000, 2_000_000).cost_usd == pytest.approx(0.15 + 1.2)
    for bad in ('{"m": {"input_per_mtok": -1, "output_per_mtok": 1}}', '{"m": {"input_per_mtok": 1}}',
                '{"m": {"input_per_mtok": "1", "output_per_mtok": 1}}', '[1]', 'not json'):
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({"LONGRUN_MODEL_PRICES": bad})
        assert [name for name, _ in caught.value.problems] == ["LONGRUN_MODEL_PRICES"]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_provider_needs_its_model_s_name_key_and_price_and_the_worker_refuses_to_start_naming_each(
        provider: str) -> None:
    assert Settings.from_env({}).model_problems() == []
    bare = Settings.from_env({"LONGRUN_MODEL": provider})
    assert dict(bare.model_problems()) == {
        "LONGRUN_MODEL_NAME": f"missing; expected it with LONGRUN_MODEL={provider}",
        "LONGRUN_MODEL_API_KEY": f"missing; expected it with LONGRUN_MODEL={provider}"}
    unpriced = Settings.from_env({"LONGRUN_MODEL": provider, "LONGRUN_MODEL_NAME": "unlisted",
                                  "LONGRUN_MODEL_API_KEY": "sk-x", "LONGRUN_MODEL_PRICES": PRICES})
    with pytest.raises(ConfigError) as caught:
        model_adapter(unpriced, Registry([]))
    assert [name for name, _ in caught.value.problems] == ["LONGRUN_MODEL_PRICES"]
    assert "'unlisted'" in str(caught.value)
    priced = Settings.from_env({"LONGRUN_MODEL": provider, "LONGRUN_MODEL_NAME": "m", "LONGRUN_MODEL_API_KEY": "sk-x",
                                "LONGRUN_MODEL_PRICES": PRICES})
    assert type(model_adapter(priced, Registry([]))).__name__ == {"openai": "OpenAIModel",
                                                                  "anthropic": "AnthropicModel"}[provider]


def test_only_a_known_protection_can_be_switched_off() -> None:
    assert Settings.from_env({}).protections_off == ()
    assert Settings.from_env({"LONGRUN_PROTECTIONS_OFF": "publisher-confirms"}).protections_off == (
        "publisher-confirms",)
    with pytest.raises(ConfigError, match="LONGRUN_PROTECTIONS_OFF: got 'confirms'; expected comma-separated "
                                          "protections: publisher-confirms"):
        Settings.from_env({"LONGRUN_PROTECTIONS_OFF": "confirms"})
