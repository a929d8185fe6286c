"""The API key table, its token buckets and the ``security`` config section: pure, with a hand-driven clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from tetriserve.common.config import ClusterConfig
from tetriserve.common.security_config import API_KEY_ENV, ApiKeySpec, SecurityConfig, parse_keys_file, parse_rate
from tetriserve.frontdoor.key_table import AuthOutcome, AuthStats, KeyEntry, KeyTable, TokenBucket, bearer_token
from tetriserve.frontdoor.security import FrontDoorSecurity, TlsFiles, is_loopback


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def table(*entries: KeyEntry, clock: Clock | None = None) -> KeyTable:
    return KeyTable(entries, clock=clock or Clock())


# ---- the key table -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("BEARER abc", "abc"), ("Basic abc", None), ("Bearer", None),
     ("Bearer ", None), ("", None), (None, None), ("abc", None)],
)  # fmt: skip
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_missing_wrong_and_right_keys() -> None:
    t = table(KeyEntry.of("sk-one", "one"), KeyEntry.of("sk-two", "two"))
    assert t.check(None).outcome is AuthOutcome.MISSING
    assert t.check("Basic sk-one").outcome is AuthOutcome.MISSING
    assert t.check("Bearer sk-three").outcome is AuthOutcome.INVALID
    assert t.check("Bearer sk-on").outcome is AuthOutcome.INVALID  # a prefix is not the key
    assert t.check("Bearer sk-one-").outcome is AuthOutcome.INVALID
    ok = t.check("Bearer sk-two")
    assert ok.allowed and ok.key_name == "two"
    assert t.identify("sk-one") is not None and t.identify("SK-ONE") is None


def test_messages_never_show_the_key() -> None:
    t = table(KeyEntry.of("sk-secret", "team-a", rate_per_s=1.0, burst=1))
    results = [t.check(h) for h in (None, "Bearer sk-wrong", "Bearer sk-secret", "Bearer sk-secret")]
    assert [r.outcome for r in results] == [
        AuthOutcome.MISSING, AuthOutcome.INVALID, AuthOutcome.ALLOWED, AuthOutcome.RATE_LIMITED
    ]  # fmt: skip
    assert all("sk-secret" not in r.message() and "sk-wrong" not in r.message() for r in results)
    assert "team-a" in results[-1].message()
    assert t.stats() == AuthStats(allowed=1, missing=1, invalid=1, rate_limited=1)


def test_table_keeps_only_digests() -> None:
    entry = KeyEntry.of("sk-secret", "a")
    assert b"sk-secret" not in entry.digest and len(entry.digest) == 32
    assert "sk-secret" not in repr(entry)


def test_quota_bucket_refills_with_the_clock() -> None:
    clock = Clock()
    t = table(KeyEntry.of("sk-a", "a", rate_per_s=2.0, burst=3), KeyEntry.of("sk-b", "b"), clock=clock)
    assert [t.check("Bearer sk-a").allowed for _ in range(3)] == [True, True, True]  # the burst
    refused = t.check("Bearer sk-a")
    assert refused.outcome is AuthOutcome.RATE_LIMITED and refused.retry_after_s == pytest.approx(0.5)
    assert refused.retry_after_whole_s == 1
    assert all(t.check("Bearer sk-b").allowed for _ in range(100))  # no quota: unlimited, and separate
    clock.now += 0.5
    assert t.check("Bearer sk-a").allowed  # one token back
    assert not t.check("Bearer sk-a").allowed
    clock.now += 60
    assert [t.check("Bearer sk-a").allowed for _ in range(4)] == [True, True, True, False]  # capped at burst


def test_refused_and_wrong_requests_take_no_token() -> None:
    clock = Clock()
    t = table(KeyEntry.of("sk-a", "a", rate_per_s=1.0, burst=1), clock=clock)
    assert t.check("Bearer sk-a").allowed
    for _ in range(5):
        assert t.check("Bearer sk-a").outcome is AuthOutcome.RATE_LIMITED
        assert t.check("Bearer sk-x").outcome is AuthOutcome.INVALID
    clock.now += 1.0
    assert t.check("Bearer sk-a").allowed


def test_bucket_default_burst_and_clock_going_back() -> None:
    bucket = TokenBucket(rate_per_s=0.5, burst=1, now=10.0)
    assert bucket.take(10.0) == 0.0
    assert bucket.take(9.0) == pytest.approx(2.0)  # an earlier reading refills nothing
    t = table(KeyEntry.of("k", "k", rate_per_s=2.5))  # burst: the rate rounded up
    assert [t.check("Bearer k").allowed for _ in range(4)] == [True, True, True, False]
    assert t.limited_count == 1 and len(t) == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"key": ""}, "must not be empty"), ({"key": "k", "rate_per_s": 0.0}, "rate_per_s"),
     ({"key": "k", "rate_per_s": float("inf")}, "rate_per_s"), ({"key": "k", "burst": 0}, "burst")],
)  # fmt: skip
def test_bad_entries(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        KeyEntry.of(name="x", **kwargs)  # type: ignore[arg-type]


def test_table_needs_keys_with_unique_names() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        KeyTable([])
    with pytest.raises(ValueError, match="unique"):
        KeyTable([KeyEntry.of("a", "x"), KeyEntry.of("b", "x")])


# ---- the config section and the keys file -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "per_s"), [("5", 5.0), ("5/s", 5.0), ("300/m", 5.0), ("300/min", 5.0), ("7200/h", 2.0)]
)
def test_parse_rate(text: str, per_s: float) -> None:
    assert parse_rate(text) == pytest.approx(per_s)


@pytest.mark.parametrize("text", ["", "x/s", "5/d", "0/s", "-1", "nan"])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


def test_keys_file() -> None:
    specs = parse_keys_file(
        "# team keys\n\nsk-alpha\nsk-beta  rate=5/s burst=10 name=team-b   # the batch team\nsk-#hash rate=60/m\n"
    )
    assert [s.key.get_secret_value() for s in specs] == ["sk-alpha", "sk-beta", "sk-#hash"]
    assert (specs[1].rate_per_s, specs[1].burst, specs[1].name) == (5.0, 10, "team-b")
    assert specs[2].rate_per_s == pytest.approx(1.0) and specs[0].rate_per_s is None


@pytest.mark.parametrize(
    ("text", "match"),
    [("k rate", "line 1: expected NAME=VALUE"), ("a\nk colour=red", "line 2: unknown option 'colour'"),
     ("k burst=0", "line 1: burst"), ("k rate=fast", "line 1: rate"), ("k,j", "line 1")],
)  # fmt: skip
def test_keys_file_errors_name_the_line(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_keys_file(text, "keys.txt")


def test_security_section_in_cluster_config(tmp_path: Path) -> None:
    config_file = tmp_path / "cluster.yaml"
    config_file.write_text(
        "security:\n  api_keys:\n    - sk-plain\n    - {key: sk-q, rate_per_s: 2, name: q}\n  rate_per_s: 10\n"
    )
    config = ClusterConfig.load(config_file)
    sec = config.security
    assert [s.key.get_secret_value() for s in sec.api_keys] == ["sk-plain", "sk-q"]
    assert "sk-plain" not in repr(config) and "sk-plain" not in str(config.model_dump())
    assert sec.dashboard_host == "127.0.0.1" and not sec.metrics_require_key and not sec.tls
    flags = ClusterConfig.load(config_file, {"security.api_keys": ["sk-flag"], "security.metrics_require_key": True})
    assert [s.key.get_secret_value() for s in flags.security.api_keys] == ["sk-flag"]  # a flag replaces the list
    assert ClusterConfig().security.api_keys == ()


@pytest.mark.parametrize(
    ("data", "match"),
    [({"tls_cert": "c.pem"}, "tls_cert and security.tls_key"), ({"api_keys": ["has space"]}, "non-empty"),
     ({"api_keys": [{"key": "k", "rate_per_s": -1}]}, "greater than 0"), ({"api_key": ["k"]}, "api_key")],
)  # fmt: skip
def test_security_section_rejects(data: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        SecurityConfig.model_validate(data)


def test_all_keys_from_config_file_and_environment(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("sk-file rate=1/s\nsk-config\n")
    sec = SecurityConfig(api_keys=(ApiKeySpec(key=SecretStr("sk-config")),), api_keys_file=str(keys_file))
    specs = sec.all_keys({API_KEY_ENV: "sk-env1, sk-env2,,"})
    assert [s.key.get_secret_value() for s in specs] == ["sk-config", "sk-file", "sk-env1", "sk-env2"]
    assert SecurityConfig().all_keys({}) == ()
    with pytest.raises(ValueError, match="api_keys_file: cannot read"):
        SecurityConfig(api_keys_file=str(tmp_path / "missing")).all_keys({})


# ---- FrontDoorSecurity ----------------------------------------------------------------------------------


def test_front_door_security_from_config() -> None:
    sec = SecurityConfig(api_keys=("sk-a", {"key": "sk-b", "name": "b", "burst": 4}), rate_per_s=3.0)  # type: ignore[arg-type]
    fds = FrontDoorSecurity.from_config(sec, environ={API_KEY_ENV: "sk-env"})
    assert fds.keys is not None and fds.keys.names == ("key-1", "b", "key-3")
    assert fds.keys.limited_count == 3  # the default quota applies to every key without its own
    assert fds.describe() == "API key required (3 keys, 3 with a quota); TLS off"
    assert fds.path_is_open("/health") and fds.path_is_open("/ready") and fds.path_is_open("/metrics")
    assert not fds.path_is_open("/v1/models") and not fds.path_is_open("/tokenize") and not fds.path_is_open("/")
    assert fds.method_is_open("/tetriserve.v1.TetriServe/Health")
    assert not fds.method_is_open("/tetriserve.v1.TetriServe/Generate")
    locked = FrontDoorSecurity.from_config(SecurityConfig(api_keys=("k",), metrics_require_key=True), environ={})  # type: ignore[arg-type]
    assert not locked.path_is_open("/metrics") and not locked.path_is_open("/metrics/")


def test_open_doors_without_keys(caplog: pytest.LogCaptureFixture) -> None:
    fds = FrontDoorSecurity.from_config(SecurityConfig(), environ={})
    assert fds.keys is None and fds.path_is_open("/v1/completions") and fds.method_is_open("/x/Y")
    assert fds.describe() == "open (no API key configured); TLS off" and fds.scheme == "http"
    with caplog.at_level(logging.WARNING):
        fds.warn_if_exposed("127.0.0.1")
        fds.warn_if_exposed("localhost")
        assert not caplog.records
        fds.warn_if_exposed("0.0.0.0")
    assert "no API key is configured" in caplog.text


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("example.com", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_tls_files_are_checked(tmp_path: Path) -> None:
    from tests.tls_support import self_signed

    with pytest.raises(ValueError, match=r"security\.tls_cert"):
        TlsFiles.of(tmp_path / "nope.pem", tmp_path / "nope.key")
    pair = self_signed(tmp_path)
    (tmp_path / "other").mkdir()
    other = self_signed(tmp_path / "other")
    with pytest.raises(ValueError, match="cannot load"):
        TlsFiles.of(pair.cert, other.key)  # a key that is not the certificate's
    files = TlsFiles.of(pair.cert, pair.key)
    assert files.pems() == (pair.key.read_bytes(), pair.cert.read_bytes())
    sec = SecurityConfig(tls_cert=str(pair.cert), tls_key=str(pair.key))
    assert FrontDoorSecurity.from_config(sec, environ={}).scheme == "https"


def test_serve_flags_become_the_security_section() -> None:
    from tetriserve.cli.config_flags import config_overrides
    from tetriserve.cli.main import _parser

    args = _parser().parse_args(
        ["serve", "--api-key", "sk-a,sk-b", "--api-key", "sk-c", "--key-rate", "5", "--tls-cert", "c.pem",
         "--tls-key", "k.pem", "--dashboard-host", "0.0.0.0", "--metrics-require-key"]
    )  # fmt: skip
    sec = ClusterConfig.load(None, config_overrides(args)).security
    assert [s.key.get_secret_value() for s in sec.api_keys] == ["sk-a", "sk-b", "sk-c"]
    assert (sec.rate_per_s, sec.tls_cert, sec.tls_key, sec.dashboard_host) == (5.0, "c.pem", "k.pem", "0.0.0.0")
    assert sec.metrics_require_key
    bare = ClusterConfig.load(None, config_overrides(_parser().parse_args(["serve"]))).security
    assert bare == SecurityConfig()
    client = _parser().parse_args(["status", "--api-key", "k", "--tls-ca", "ca.pem"])
    assert (client.api_key, client.tls_ca, client.tls) == ("k", "ca.pem", False)


def test_a_joining_front_doors_security_flags_override_only_what_they_name() -> None:
    """`tetriserve frontdoor --key-rate 5` keeps the service's keys (and TLS): a quota given there does not open
    the doors; `--api-key` replaces the keys, as on `serve`."""
    served = SecurityConfig(api_keys=["sk-service-0123456789"], rate_per_s=1.0, metrics_require_key=True)
    quota = served.updated({"rate_per_s": 5.0})
    assert [s.key.get_secret_value() for s in quota.api_keys] == ["sk-service-0123456789"]
    assert (quota.rate_per_s, quota.metrics_require_key) == (5.0, True)
    replaced = served.updated({"api_keys": ["sk-door-0123456789ab"]})
    assert [s.key.get_secret_value() for s in replaced.api_keys] == ["sk-door-0123456789ab"]
    with pytest.raises(ValueError, match=r"tls_cert and security\.tls_key"):
        served.updated({"tls_cert": "c.pem"})  # the whole is checked: a certificate without its key
