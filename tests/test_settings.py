"""Settings: defaults from DESIGN.md, loaders (dict, env, precedence), validation, immutability."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlat_mw.errors import SettingsError
from lowlat_mw.settings import SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, Settings

MiB = 1024 * 1024
NO_ENV: dict[str, str] = {}
# Hypothesis builds its Unicode tables on first use: that one-off cost is not a slow test.
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------- defaults
DEFAULTS = [
    ("heartbeat_interval", 30.0),
    ("heartbeat_max_interval", 120.0),
    ("heartbeat_timeout", 10.0),
    ("idle_timeout", 600.0),
    ("max_frame_size", 1 * MiB),
    ("max_decompressed_size", 8 * MiB),
    ("max_streams", 8),
    ("compression", ("zstd", "lz4", "snappy")),
    ("allowed_origins", ()),
    ("subprotocols", (SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON)),
]


@pytest.mark.parametrize(("name", "expected"), DEFAULTS)
def test_defaults_match_design(name: str, expected: object) -> None:
    assert getattr(Settings(), name) == expected
    assert getattr(Settings.load(env=NO_ENV), name) == expected


def test_allowed_origins_never_default_to_wildcard() -> None:
    assert "*" not in Settings().allowed_origins


def test_names_lists_every_field_in_order() -> None:
    assert Settings.names() == tuple(f.name for f in dataclasses.fields(Settings))
    assert Settings.names()[0] == "path"


# ---------------------------------------------------------------------------------- dict loader
def test_load_from_dict() -> None:
    s = Settings.load(
        {"heartbeat_interval": 5, "max_streams": 2, "compression": ["lz4"], "expose_model_errors": True},
        env=NO_ENV,
    )
    assert s.heartbeat_interval == 5.0 and isinstance(s.heartbeat_interval, float)
    assert s.max_streams == 2
    assert s.compression == ("lz4",)
    assert s.expose_model_errors is True


def test_load_none_is_defaults() -> None:
    assert Settings.load(None, env=NO_ENV) == Settings()


def test_load_accepts_comma_separated_string_for_lists() -> None:
    s = Settings.load({"allowed_origins": " https://a.example , https://b.example ,"}, env=NO_ENV)
    assert s.allowed_origins == ("https://a.example", "https://b.example")


def test_load_passes_settings_object_through_with_overrides() -> None:
    base = Settings(max_streams=3)
    assert Settings.load({"settings": base}, env=NO_ENV) is base
    s = Settings.load({"settings": base, "idle_timeout": 9}, env=NO_ENV)
    assert s.max_streams == 3 and s.idle_timeout == 9.0


def test_unknown_dict_key_names_it_and_suggests() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.load({"heartbeat_intervl": 3}, env=NO_ENV)
    msg = str(info.value)
    assert "'heartbeat_intervl'" in msg
    assert "did you mean 'heartbeat_interval'" in msg


def test_unknown_key_error_names_the_source() -> None:
    with pytest.raises(SettingsError, match="LOWLAT_MW"):
        Settings.load({"max_stream": 3}, env=NO_ENV, source="LOWLAT_MW")


def test_unknown_key_without_close_match_has_no_suggestion() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.load({"zzzzzzzz": 1}, env=NO_ENV)
    assert "'zzzzzzzz'" in str(info.value)
    assert "did you mean" not in str(info.value)


def test_settings_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Settings.load({"nope": 1}, env=NO_ENV)


# ---------------------------------------------------------------------------------- env loader
ENV_CASES = [
    ("LOWLAT_HEARTBEAT_INTERVAL", "12.5", "heartbeat_interval", 12.5),
    ("LOWLAT_IDLE_TIMEOUT", " 60 ", "idle_timeout", 60.0),
    ("LOWLAT_MAX_STREAMS", "3", "max_streams", 3),
    ("LOWLAT_MAX_FRAME_SIZE", "65536", "max_frame_size", 65536),
    ("LOWLAT_COMPRESSION", "lz4, zstd", "compression", ("lz4", "zstd")),
    ("LOWLAT_COMPRESSION", "", "compression", ()),
    ("LOWLAT_ALLOWED_ORIGINS", "https://x.example", "allowed_origins", ("https://x.example",)),
    ("LOWLAT_SUBPROTOCOLS", "lowlat.v1.json", "subprotocols", (SUBPROTOCOL_JSON,)),
    ("LOWLAT_PATH", "/stream", "path", "/stream"),
    ("LOWLAT_SERVER_NAME", "edge-1", "server_name", "edge-1"),
    ("LOWLAT_EXPOSE_MODEL_ERRORS", "true", "expose_model_errors", True),
    ("LOWLAT_EXPOSE_MODEL_ERRORS", "1", "expose_model_errors", True),
    ("LOWLAT_EXPOSE_MODEL_ERRORS", "Yes", "expose_model_errors", True),
    ("LOWLAT_EXPOSE_MODEL_ERRORS", "on", "expose_model_errors", True),
    ("LOWLAT_EXPOSE_MODEL_ERRORS", "false", "expose_model_errors", False),
    ("LOWLAT_EXPOSE_MODEL_ERRORS", "0", "expose_model_errors", False),
    ("LOWLAT_EXPOSE_MODEL_ERRORS", "NO", "expose_model_errors", False),
    ("LOWLAT_EXPOSE_MODEL_ERRORS", "off", "expose_model_errors", False),
]


@pytest.mark.parametrize(("var", "raw", "name", "expected"), ENV_CASES)
def test_env_values_are_parsed_to_the_setting_type(var: str, raw: str, name: str, expected: object) -> None:
    s = Settings.load(env={var: raw})
    value = getattr(s, name)
    assert value == expected
    assert type(value) is type(expected)


def test_explicit_values_beat_env() -> None:
    env = {"LOWLAT_MAX_STREAMS": "3", "LOWLAT_IDLE_TIMEOUT": "60"}
    s = Settings.load({"max_streams": 5}, env=env)
    assert s.max_streams == 5  # explicit wins
    assert s.idle_timeout == 60.0  # env fills what was not given


def test_env_ignores_other_variables() -> None:
    env = {"PATH": "/usr/bin", "HOME": "/root", "lowlat_max_streams": "1", "XLOWLAT_MAX_STREAMS": "1"}
    assert Settings.load(env=env) == Settings()


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOWLAT_MAX_STREAMS", "4")
    assert Settings.load().max_streams == 4


def test_unknown_env_var_names_it_and_suggests() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.load(env={"LOWLAT_IDLE_TIMEOUTT": "3"})
    msg = str(info.value)
    assert "LOWLAT_IDLE_TIMEOUTT" in msg
    assert "did you mean 'idle_timeout'" in msg


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("LOWLAT_MAX_STREAMS", "many"),
        ("LOWLAT_MAX_STREAMS", "1.5"),
        ("LOWLAT_HEARTBEAT_INTERVAL", "soon"),
        ("LOWLAT_EXPOSE_MODEL_ERRORS", "maybe"),
        ("LOWLAT_EXPOSE_MODEL_ERRORS", ""),
    ],
)
def test_unparsable_env_value_names_the_variable(var: str, raw: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.load(env={var: raw})
    assert var in str(info.value)
    assert repr(raw.strip()) in str(info.value)


def test_env_values_are_validated_like_any_other() -> None:
    with pytest.raises(SettingsError, match="heartbeat_interval"):
        Settings.load(env={"LOWLAT_HEARTBEAT_INTERVAL": "-1"})


# ---------------------------------------------------------------------------------- validation
INVALID = [
    # (values, the setting the message must name)
    ({"heartbeat_interval": 0}, "heartbeat_interval"),
    ({"heartbeat_interval": -1.0}, "heartbeat_interval"),
    ({"heartbeat_interval": float("nan")}, "heartbeat_interval"),
    ({"heartbeat_timeout": 0}, "heartbeat_timeout"),
    ({"idle_timeout": -5}, "idle_timeout"),
    ({"handshake_timeout": 0}, "handshake_timeout"),
    ({"link_mbps": 0}, "link_mbps"),
    ({"heartbeat_interval": 60, "heartbeat_max_interval": 30}, "heartbeat_max_interval"),
    ({"max_frame_size": 0}, "max_frame_size"),
    ({"max_frame_size": 63}, "max_frame_size"),
    ({"max_frame_size": 2**32}, "max_frame_size"),
    ({"max_decompressed_size": -1}, "max_decompressed_size"),
    ({"max_streams": 0}, "max_streams"),
    ({"model_threads": 0}, "model_threads"),
    ({"compression_min_size": -1}, "compression_min_size"),
    ({"compression": ("zstd", "gzip")}, "compression"),
    ({"compression": "brotli"}, "compression"),
    ({"subprotocols": ()}, "subprotocols"),
    ({"subprotocols": ("lowlat.v2.proto",)}, "subprotocols"),
    ({"path": "ws"}, "path"),
    # wrong types
    ({"max_streams": 1.5}, "max_streams"),
    ({"max_streams": "8"}, "max_streams"),
    ({"max_streams": True}, "max_streams"),
    ({"heartbeat_interval": "30"}, "heartbeat_interval"),
    ({"heartbeat_interval": False}, "heartbeat_interval"),
    ({"heartbeat_interval": None}, "heartbeat_interval"),
    ({"expose_model_errors": 1}, "expose_model_errors"),
    ({"expose_model_errors": "true"}, "expose_model_errors"),
    ({"path": 5}, "path"),
    ({"server_name": b"x"}, "server_name"),
    ({"compression": 5}, "compression"),
    ({"compression": [1, 2]}, "compression"),
    ({"allowed_origins": b"https://a"}, "allowed_origins"),
    ({"idle_timeout": 10**400}, "idle_timeout"),  # too big for a float
]


@pytest.mark.parametrize(("values", "name"), INVALID)
def test_invalid_values_raise_naming_the_setting(values: dict[str, object], name: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.load(values, env=NO_ENV)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize(("values", "name"), INVALID)
def test_replace_validates_too(values: dict[str, object], name: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings().replace(**values)
    assert repr(name) in str(info.value)


def test_valid_edge_values() -> None:
    s = Settings.load(
        {"max_frame_size": 64, "max_streams": 2**32 - 1, "compression": (), "compression_min_size": 0,
         "heartbeat_interval": 1, "heartbeat_max_interval": 1, "allowed_origins": ["*"]},
        env=NO_ENV,
    )
    assert s.max_frame_size == 64 and s.compression == () and s.heartbeat_max_interval == 1.0


JSONISH = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
    st.lists(st.one_of(st.text(max_size=10), st.integers()), max_size=4), st.binary(max_size=8),
)


@FUZZ
@given(st.dictionaries(st.sampled_from(Settings.names()), JSONISH, max_size=5))
def test_loading_anything_gives_settings_or_settings_error(values: dict[str, object]) -> None:
    try:
        s = Settings.load(values, env=NO_ENV)
    except SettingsError:
        return
    assert isinstance(s, Settings)


@FUZZ
@given(st.sampled_from(Settings.names()), st.text(max_size=20))
def test_env_anything_gives_settings_or_settings_error(name: str, raw: str) -> None:
    try:
        Settings.load(env={"LOWLAT_" + name.upper(): raw})
    except SettingsError:
        pass


# ---------------------------------------------------------------------------------- frozen / replace
def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_streams = 3  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        s.new_attribute = 1  # type: ignore[attr-defined]


def test_settings_are_hashable_and_compare_by_value() -> None:
    assert Settings() == Settings.load(env=NO_ENV)
    assert hash(Settings()) == hash(Settings())
    assert Settings(max_streams=2) != Settings()


def test_replace_returns_validated_copy() -> None:
    s = Settings()
    t = s.replace(max_streams=2, compression=["snappy"], heartbeat_timeout=3)
    assert (t.max_streams, t.compression, t.heartbeat_timeout) == (2, ("snappy",), 3.0)
    assert s.max_streams == 8  # original untouched
    assert s.replace() == s


def test_replace_unknown_key_names_it() -> None:
    with pytest.raises(SettingsError, match="did you mean 'max_streams'"):
        Settings().replace(max_stream=2)


# ---------------------------------------------------------------------------------- framework configuration
def test_every_wrong_setting_is_reported_at_once() -> None:
    """Issue 17: a user with three mistakes learns of all three from one start-up, each with its hint."""
    with pytest.raises(SettingsError) as info:
        Settings.load({"idle_timout": 1, "max_streams": 1.5}, env={"LOWLAT_HEARTBEAT_INTERVL": "5"})
    msg = str(info.value)
    assert msg.startswith("3 settings are wrong:")
    assert "did you mean 'idle_timeout'" in msg and "did you mean 'heartbeat_interval'" in msg
    assert "'max_streams' must be an integer, got float 1.5" in msg
    assert len(info.value.problems) == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("build", ["load", "replace"])
def test_every_wrong_value_is_reported_at_once(build: str) -> None:
    """Issue 38: values out of range were reported one start-up at a time (after any wrong name or type)."""
    values = {"heartbeat_interval": "soon", "idle_timeout": -1, "max_streams": 0, "path": "ws", "rate_burst": 0}
    with pytest.raises(SettingsError) as info:
        Settings.load(values, env=NO_ENV) if build == "load" else Settings().replace(**values)
    problems = info.value.problems  # type: ignore[attr-defined]
    assert str(info.value).startswith("5 settings are wrong:"), info.value
    assert len(problems) == len(values), problems
    for name in values:
        assert sum(repr(name) in problem for problem in problems) == 1, (name, problems)


@pytest.mark.parametrize("where", ["app.config", "settings"])
def test_framework_config_hints_names_and_reports_everything(where: str) -> None:
    """settings.LOWLAT_MW / app.config["LOWLAT_MW"] get the same hints as keyword arguments, all at once."""
    from lowlat_mw.endpoint import settings_from_config

    config = {"LOWLAT_MW": {"idle_timout": 5, "heartbeat_interval": "soon"}, "LOWLAT_RATE_LIMT": 3,
              "LOWLAT_MAX_STREAMS": "many"}
    with pytest.raises(SettingsError) as info:
        settings_from_config(config, where=where)
    msg = str(info.value)
    label = f"{where}['LOWLAT_MW']" if where == "app.config" else f"{where}.LOWLAT_MW"
    assert msg.startswith("4 settings are wrong:"), msg
    assert f"unknown setting 'idle_timout' in {label} (did you mean 'idle_timeout'?)" in msg
    assert f"{label}['heartbeat_interval'] must be a number, got 'soon'" in msg
    assert "did you mean 'rate_limit'" in msg
    assert f"{where}['LOWLAT_MAX_STREAMS'] must be an integer, got 'many'" in msg


def test_framework_config_text_is_converted_to_the_setting_type() -> None:
    """Configuration is often text (a .env file, a config loader): "300" is 300 there; keyword arguments
    stay strict (a string for a number is a mistake in Python code)."""
    from lowlat_mw.endpoint import settings_from_config

    settings = settings_from_config({"LOWLAT_MW": {"idle_timeout": "300", "max_streams": " 4 ",
                                                   "expose_model_errors": "true", "compression": "zstd, lz4"},
                                     "LOWLAT_RATE_LIMIT": "0"}, where="settings")
    assert (settings.idle_timeout, settings.max_streams, settings.expose_model_errors) == (300.0, 4, True)
    assert settings.compression == ("zstd", "lz4") and settings.rate_limit == 0
    with pytest.raises(SettingsError, match="'idle_timeout' must be a number"):
        settings_from_config({}, {"idle_timeout": "300"}, where="settings")  # (the adapter's own arguments)


def test_authenticate_takes_a_callable_or_its_dotted_path_and_is_imported_when_the_app_is_built() -> None:
    """Issue 17: a function in app.config["LOWLAT_MW"] was refused ("must be a string"); a wrong dotted path
    failed only at the first handshake. Now either form works, and a wrong path fails when the endpoint is made."""
    from lowlat_mw.endpoint import Endpoint, settings_from_config
    from lowlat_mw.security import load_authenticator

    def admit(handshake: object) -> bool:
        return True

    settings = settings_from_config({"LOWLAT_MW": {"authenticate": admit}}, where="app.config")
    assert settings.authenticate is admit and load_authenticator(settings.authenticate) is admit
    assert Settings.load({}, env={"LOWLAT_AUTHENTICATE": "pkg.auth:check"}).authenticate == "pkg.auth:check"
    with pytest.raises(SettingsError, match="'authenticate' must be a callable or its dotted path, got int 5"):
        Settings.load({"authenticate": 5}, env=NO_ENV)
    Endpoint(lambda req: "x", settings)  # a callable: nothing to import
    with pytest.raises(ImportError, match="lowlat_no_such_auth"):
        Endpoint(lambda req: "x", Settings.load({"authenticate": "lowlat_no_such_auth:check"}, env=NO_ENV))
