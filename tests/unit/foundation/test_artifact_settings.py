"""The artifact store's settings: the filesystem by default, S3 only when it can work, each refusal
naming its variable, and the S3 client given what was configured."""

from __future__ import annotations

import pytest

from longrun.config import Settings
from longrun.errors import ConfigError
from longrun.s3_artifacts import S3Location, client_config

S3 = {"LONGRUN_ARTIFACT_STORE": "s3", "LONGRUN_S3_BUCKET": "artifacts"}


def test_the_filesystem_is_the_default_and_s3_needs_only_a_bucket() -> None:
    assert Settings.from_env({}).artifact_store == "filesystem"
    settings = Settings.from_env(S3)
    assert (settings.s3_bucket, settings.s3_region, settings.s3_endpoint, settings.s3_encryption) == (
        "artifacts", "us-east-1", "", "")


@pytest.mark.parametrize(("env", "variable", "says"), [
    ({"LONGRUN_ARTIFACT_STORE": "s3"}, "LONGRUN_S3_BUCKET", "missing; expected a bucket name"),
    ({"LONGRUN_ARTIFACT_STORE": "gcs"}, "LONGRUN_ARTIFACT_STORE", "expected filesystem or s3"),
    ({**S3, "LONGRUN_S3_ACCESS_KEY_ID": "AKIA"}, "LONGRUN_S3_SECRET_ACCESS_KEY", "exactly when"),
    ({**S3, "LONGRUN_S3_ENCRYPTION": "aws:kms"}, "LONGRUN_S3_KMS_KEY_ID", "is aws:kms"),
    ({**S3, "LONGRUN_S3_KMS_KEY_ID": "alias/x"}, "LONGRUN_S3_KMS_KEY_ID", "it is empty"),
    ({**S3, "LONGRUN_S3_ENCRYPTION": "sse-c"}, "LONGRUN_S3_ENCRYPTION", "expected empty, AES256 or aws:kms"),
    ({**S3, "LONGRUN_S3_ENDPOINT": "minio:9000"}, "LONGRUN_S3_ENDPOINT", "expected an http(s) URL"),
])
def test_a_store_that_cannot_work_is_refused_naming_the_variable(env: dict[str, str], variable: str,
                                                                  says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    problems = dict(caught.value.problems)
    assert says in problems[variable], problems


def test_the_secret_key_may_come_from_a_mounted_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "secret").write_text("s3cr3t\n")
    settings = Settings.from_env({**S3, "LONGRUN_S3_ACCESS_KEY_ID": "AKIA",
                                  "LONGRUN_S3_SECRET_ACCESS_KEY_FILE": str(tmp_path / "secret")})
    assert (settings.s3_access_key_id, settings.s3_secret_access_key) == ("AKIA", "s3cr3t")


def test_the_client_asks_for_the_configured_encryption_and_addresses_a_self_hosted_service_by_path() -> None:
    kms = S3Location(bucket="b", region="eu-west-1", encryption="aws:kms", kms_key_id="alias/longrun")
    assert client_config(kms) == {"region": "eu-west-1", "server_side_encryption": "aws:kms",
                                  "sse_kms_key_id": "alias/longrun"}
    minio = S3Location(bucket="b", region="us-east-1", endpoint="http://minio:9000", access_key_id="k",
                       secret_access_key="s", encryption="AES256")
    assert client_config(minio) == {"region": "us-east-1", "endpoint": "http://minio:9000",
                                    "virtual_hosted_style_request": False, "access_key_id": "k",
                                    "secret_access_key": "s", "server_side_encryption": "AES256"}
