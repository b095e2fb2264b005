from __future__ import annotations

import os
from pathlib import Path

import pytest

from fulfilment.settings import SettingsError, load_settings, variables


def refusal() -> str:
    """The text of the ``SettingsError`` that :func:`load_settings` raises here."""
    with pytest.raises(SettingsError) as raised:
        load_settings()
    return str(raised.value)


@pytest.fixture(autouse=True)
def no_fulfilment_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("FULFILMENT_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env from the working tree


def test_defaults_nest_and_point_at_the_local_services() -> None:
    settings = load_settings()
    assert settings.broker.amqp_url.get_secret_value() == "amqp://guest:guest@localhost:5672/"
    assert settings.database.url.get_secret_value().startswith("postgresql+asyncpg://")
    assert (
        settings.deadlines.retry_budget_seconds
        < settings.deadlines.handler_deadline_seconds
        < settings.deadlines.graceful_timeout_seconds
        < settings.deadlines.orchestrator_grace_period_seconds
    )


def test_a_deadline_longer_than_the_graceful_timeout_stops_the_start_naming_both_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FULFILMENT_HANDLER_DEADLINE_SECONDS", "25")
    message = refusal()
    assert "FULFILMENT_HANDLER_DEADLINE_SECONDS=25" in message
    assert "FULFILMENT_GRACEFUL_TIMEOUT_SECONDS=20" in message


def test_a_handler_deadline_beyond_the_broker_consumer_timeout_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FULFILMENT_BROKER_CONSUMER_TIMEOUT_SECONDS", "5")
    with pytest.raises(SettingsError, match="FULFILMENT_BROKER_CONSUMER_TIMEOUT_SECONDS=5"):
        load_settings()


def test_a_value_that_is_not_a_number_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "many")
    with pytest.raises(SettingsError, match=r"^FULFILMENT_PREFETCH_COUNT: "):
        load_settings()


def test_a_database_url_with_the_plain_scheme_runs_on_asyncpg(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FULFILMENT_DATABASE_URL", "postgresql://u:p@db:5432/shop")
    settings = load_settings()
    assert settings.database.url.get_secret_value() == "postgresql+asyncpg://u:p@db:5432/shop"


def test_a_database_url_keeps_its_libpq_tls_parameters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("a CA")
    url = f"postgresql://u:p@db:5432/shop?sslmode=verify-full&sslrootcert={ca}"
    monkeypatch.setenv("FULFILMENT_DATABASE_URL", url)
    settings = load_settings()
    assert settings.database.url.get_secret_value() == "postgresql+asyncpg" + url.removeprefix(
        "postgresql"
    )


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("sslmode=verify_full", "has sslmode='verify_full'; it must be one of disable, allow,"),
        ("ssl=require", "takes TLS as libpq does: use sslmode=verify-full (or require)"),
        (
            "sslmod=require",
            (
                "has sslmod=, which is no connection parameter and would reach the server as a"
                " setting: did you mean sslmode=?"
            ),
        ),
        ("sslrootcrt=/ca.crt", "has sslrootcrt=, which is no connection parameter"),
        ("SSLMODE=require", "has SSLMODE=, which is no connection parameter"),
    ],
)
def test_a_tls_parameter_no_connection_could_use_stops_the_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, query: str, said: str
) -> None:
    monkeypatch.setenv("FULFILMENT_DATABASE_URL", f"postgresql://u:p@db:5432/shop?{query}")
    message = refusal()
    assert message.startswith(f"FULFILMENT_DATABASE_URL: {said}")
    assert ":p@" not in message


@pytest.mark.parametrize(
    "query",
    [
        "application_name=orders&timezone=UTC&search_path=public",
        "statement_timeout=5000&lock_timeout=1000&idle_in_transaction_session_timeout=0",
        "client_encoding=UTF8&options=-c%20work_mem%3D8MB&pg_stat_statements.track=all",
        "target_session_attrs=read-write&sslmode=require&sslcrl=/crl.pem&sslpassword=x",
    ],
)
def test_server_settings_and_connection_parameters_in_a_database_url_are_accepted(
    monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    monkeypatch.setenv("FULFILMENT_DATABASE_URL", f"postgresql://u:p@db:5432/shop?{query}")
    assert load_settings().database.url.get_secret_value().endswith(f"?{query}")


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1", "::", "::1"])  # noqa: S104 - a value
def test_an_ip_address_is_accepted_as_the_http_host(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("FULFILMENT_HTTP_HOST", host)
    assert load_settings().http.http_host == host


@pytest.mark.parametrize("host", ["not-an-ip", "localhost", "0.0.0.0:8080", ""])
def test_an_http_host_that_is_not_an_ip_address_stops_the_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("FULFILMENT_HTTP_HOST", host)
    message = refusal()
    assert message == (
        f"FULFILMENT_HTTP_HOST: {host!r} is not an IP address: use 0.0.0.0 (every interface)"
        " or 127.0.0.1"
    )


def test_a_broker_url_of_another_scheme_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FULFILMENT_AMQP_URL", "http://localhost:15672/")
    with pytest.raises(SettingsError, match=r"FULFILMENT_AMQP_URL: .*amqp://"):
        load_settings()


def test_a_broker_url_keeps_the_tls_parameters_aiormq_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = (
        "amqps://u:p@rabbitmq.example.internal:5671/shop?cafile=/etc/ca.crt"
        "&certfile=/etc/client.crt&keyfile=/etc/client.key&no_verify_ssl=0&heartbeat=30"
    )
    monkeypatch.setenv("FULFILMENT_AMQP_URL", url)
    assert load_settings().broker.amqp_url.get_secret_value() == url


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "amqps://u:p@mq:5671/?ca_certs=/etc/ca.crt",
            (
                "has ca_certs=, which the AMQP client does not read: TLS is asked for with amqps://"
                " and set with cafile, capath, cadata, certfile, keyfile, no_verify_ssl"
                " (use cafile here)"
            ),
        ),
        ("amqps://u:p@mq:5671/?cacertfile=/etc/ca.crt", "has cacertfile=, which the AMQP"),
        ("amqps://u:p@mq:5671/?verify=verify_peer", "has verify=, which the AMQP client"),
        ("amqp://u:p@mq:5672/?sslmode=require", "has sslmode=, which the AMQP client"),
        (
            "amqp://u:p@mq:5672/?cafile=/etc/ca.crt",
            "has cafile= but amqp:// connects without TLS: use amqps://",
        ),
        (
            "amqps://u:p@mq:5671/?no_verify_ssl=false",
            (
                "has no_verify_ssl='false'; it must be 0 (check the server's certificate and host"
                " name, the default) or 1 (do not)"
            ),
        ),
        (
            "amqps://u:p@mq:5671/?keyfile=/etc/client.key",
            "has keyfile= without certfile=: the client certificate needs both",
        ),
        ("amqps://u:p@mq:5671/?cadata=not*base64", "has cadata= that is not base64"),
    ],
)
def test_a_broker_tls_parameter_the_client_would_ignore_stops_the_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, url: str, said: str
) -> None:
    monkeypatch.setenv("FULFILMENT_AMQP_URL", url)
    message = refusal()
    assert message.startswith(f"FULFILMENT_AMQP_URL: {said}")
    assert ":p@" not in message


def test_secrets_do_not_show_in_the_settings_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FULFILMENT_AMQP_URL", "amqp://user:hunter2@broker:5672/")
    assert "hunter2" not in repr(load_settings())


def test_a_misspelt_variable_stops_the_start_and_names_the_likely_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FULFILMENT_PREFTCH_COUNT", "3")
    message = refusal()
    assert message == (
        "FULFILMENT_PREFTCH_COUNT: not a setting of this service "
        "(did you mean FULFILMENT_PREFETCH_COUNT?)"
    )


def test_the_test_suite_s_own_variables_are_not_taken_for_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FULFILMENT_TEST_AMQP_URL", "amqp://elsewhere/")
    assert load_settings().worker.prefetch_count == 64


def test_a_misspelt_key_in_the_env_file_stops_the_start_naming_the_file_and_line(
    tmp_path: Path,
) -> None:
    (tmp_path / ".env").write_text(
        "fulfilment_prefetch_cont=2\nFULFILMENT_PREFETCH_COUNT=8\nfulfilment_prefetch_cont=3\n"
    )
    message = refusal()
    # The last line that sets it, the one that would take effect.
    assert message == (
        ".env:3: FULFILMENT_PREFETCH_CONT: not a setting of this service "
        "(did you mean FULFILMENT_PREFETCH_COUNT?)"
    )


@pytest.mark.parametrize(
    ("line", "named", "hint"),
    [
        (
            'FULFILMENT_DATABASE_URL="postgresql://postgres@db:5432/elsewhere',
            "FULFILMENT_DATABASE_URL",
            " (an unclosed quote?)",
        ),
        (
            "export FULFILMENT_PREFETCH_COUNT='8",
            "FULFILMENT_PREFETCH_COUNT",
            " (an unclosed quote?)",
        ),
        # No quote on the line: no guess about one.
        ("fulfilment prefetch count 8", "the line", ""),
    ],
)
def test_an_unreadable_env_file_line_stops_the_start_naming_its_line_not_its_value(
    tmp_path: Path, line: str, named: str, hint: str
) -> None:
    # python-dotenv would skip the line with a warning, and the default database be used.
    (tmp_path / ".env").write_text(f"FULFILMENT_PREFETCH_COUNT=8\n# the target\n{line}\n")
    message = refusal()
    assert message == (f".env:3: {named} cannot be read as NAME=VALUE{hint}: fix or remove it")
    assert "elsewhere" not in message


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            b"FULFILMENT_PREFETCH_COUNT\n",
            ".env:1: FULFILMENT_PREFETCH_COUNT has no =VALUE: give it one or remove it",
        ),
        (
            (
                b'FULFILMENT_DATABASE_URL="postgresql://postgres@db/elsewhere\n'
                b'FULFILMENT_LOG_LEVEL=INFO"\n'
            ),
            (
                ".env:1: FULFILMENT_DATABASE_URL's quoted value runs onto the next lines (a quote"
                " closed on a later line?): no setting takes a line break"
            ),
        ),
        (
            b"\xff\xfeFULFILMENT_PREFETCH_COUNT=8\n",
            ".env:1: not UTF-8 (invalid start byte at byte 1 of the line)",
        ),
        (
            b"# the broker\nFULFILMENT_PREFETCH_COUNT=8\nFULFILMENT_CONSUMER_NAME=caf\xe9\n",
            ".env:3: not UTF-8 (invalid continuation byte at byte 29 of the line)",
        ),
    ],
    ids=[
        "no value",
        "quote closed on a later line",
        "not UTF-8, first line",
        "not UTF-8, third line",
    ],
)
def test_an_env_file_line_read_otherwise_than_it_seems_stops_the_start_naming_the_line(
    tmp_path: Path, data: bytes, said: str
) -> None:
    (tmp_path / ".env").write_bytes(data)
    message = refusal()
    assert message == said
    assert "elsewhere" not in message


@pytest.mark.parametrize(
    ("variable", "url", "port"),
    [
        ("FULFILMENT_AMQP_URL", "amqp://guest:secret@127.0.0.1:notaport/", "notaport"),
        ("FULFILMENT_AMQP_URL", "amqp://guest:secret@127.0.0.1:99999/", "99999"),
        ("FULFILMENT_DATABASE_URL", "postgresql://postgres:secret@db:notaport/x", "notaport"),
        ("FULFILMENT_DATABASE_URL", "postgresql://postgres:secret@db1:5432,db2:0/x", "0"),
        ("FULFILMENT_WAREHOUSE_URL", "https://wms.example:44x3/api/v1", "44x3"),
    ],
)
def test_a_url_whose_port_is_no_port_stops_the_start_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, url: str, port: str
) -> None:
    monkeypatch.setenv(variable, url)
    message = refusal()
    assert message == (
        f"{variable}: names the port {port!r}: a port is a whole number from 1 to 65535"
    )
    assert "secret" not in message


def test_a_database_url_may_list_several_hosts_with_their_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FULFILMENT_DATABASE_URL", "postgresql://u@[::1]:5432,db2,db3:5433/x")
    url = load_settings().database.url.get_secret_value()
    assert url == "postgresql+asyncpg://u@[::1]:5432,db2,db3:5433/x"


def test_the_env_file_s_settings_are_read_and_other_keys_left_alone(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "FULFILMENT_PREFETCH_COUNT=8\nFULFILMENT_TEST_AMQP_URL=amqp://elsewhere/\nPGHOST=db\n"
    )
    assert load_settings().worker.prefetch_count == 8


@pytest.mark.parametrize(("value", "problem"), [("2", "must be odd"), ("0", "greater than")])
def test_an_even_or_empty_quorum_group_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    monkeypatch.setenv("FULFILMENT_QUORUM_INITIAL_GROUP_SIZE", value)
    with pytest.raises(SettingsError, match=rf"^FULFILMENT_QUORUM_INITIAL_GROUP_SIZE: .*{problem}"):
        load_settings()


def test_the_quorum_group_defaults_to_a_three_node_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().broker.quorum_initial_group_size == 3
    monkeypatch.setenv("FULFILMENT_QUORUM_INITIAL_GROUP_SIZE", "5")
    assert load_settings().broker.quorum_initial_group_size == 5


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FULFILMENT_RELAY_BATCH_SIZE", "0"),
        ("FULFILMENT_RELAY_POLL_SECONDS", "-1"),
        ("FULFILMENT_RELAY_BATCH_WINDOW_SECONDS", "2"),
        ("FULFILMENT_RELAY_BATCH_WINDOW_SECONDS", "nan"),
        ("FULFILMENT_RELAY_HTTP_PORT", "70000"),
        ("FULFILMENT_OUTBOX_RETENTION_SECONDS", "soon"),
    ],
)
def test_a_bad_relay_or_outbox_setting_stops_the_start_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        load_settings()


def test_crash_injection_is_no_setting_of_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FULFILMENT_FAULT_INJECTION", "before_publish:0.5,after_publish:1")
    with pytest.raises(SettingsError, match="FULFILMENT_FAULT_INJECTION: not a setting"):
        load_settings()


def test_a_runtime_role_that_is_not_a_plain_role_name_stops_the_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FULFILMENT_DATABASE_RUNTIME_ROLE", 'worker"; DROP TABLE x; --')

    with pytest.raises(
        SettingsError, match=r"^FULFILMENT_DATABASE_RUNTIME_ROLE: .*not a role name"
    ):
        load_settings()


def test_the_runtime_role_is_unset_by_default_and_read_when_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().database.runtime_role == ""
    monkeypatch.setenv("FULFILMENT_DATABASE_RUNTIME_ROLE", "fulfilment_runtime")
    assert load_settings().database.runtime_role == "fulfilment_runtime"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FULFILMENT_DEAD_LETTER_TTL_SECONDS", "2592000"),  # as long as the retention
        ("FULFILMENT_OUTBOX_RETENTION_SECONDS", "3000000"),
    ],
)
def test_a_processed_id_retention_not_longer_than_a_message_can_come_back_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    message = refusal()
    assert message == (
        f"{variable}={int(value)} must be less than "
        "FULFILMENT_PROCESSED_ID_RETENTION_SECONDS=2592000"
    )


def test_the_retention_defaults_outlive_the_dead_letter_queue_and_the_outbox() -> None:
    settings = load_settings()
    assert settings.retention.processed_id_retention_seconds == 30 * 86_400
    assert settings.retention.dead_letter_ttl_seconds == 14 * 86_400
    assert (
        settings.retention.outbox_retention_seconds
        < settings.retention.processed_id_retention_seconds
    )
    assert settings.retention.replay_limit == 3


def test_a_bad_value_from_the_env_file_names_the_line_that_sets_it(tmp_path: Path) -> None:
    # The last of two lines of a name is the one read.
    (tmp_path / ".env").write_text(
        "# ours\nFULFILMENT_LOG_LEVEL=INFO\n"
        "FULFILMENT_PREFETCH_COUNT=8\nFULFILMENT_PREFETCH_COUNT=abc\n"
    )
    message = refusal()
    assert message == (
        ".env:4: FULFILMENT_PREFETCH_COUNT: Input should be a valid integer,"
        " unable to parse string as an integer"
    )


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("FULFILMENT_PREFETCH_COUNT=abc", "FULFILMENT_PREFETCH_COUNT: Input should be"),
        ("FULFILMENT_PREFTCH_COUNT=8", "FULFILMENT_PREFTCH_COUNT: not a setting"),
        ('FULFILMENT_DATABASE_URL="postgresql://db/x', "FULFILMENT_DATABASE_URL cannot be"),
    ],
    ids=["bad value", "no setting", "unreadable"],
)
def test_blank_lines_before_an_env_file_line_do_not_shift_its_number(
    tmp_path: Path, line: str, said: str
) -> None:
    # python-dotenv numbers a binding from the first blank line above it.
    (tmp_path / ".env").write_text(f"# ours\nFULFILMENT_LOG_LEVEL=INFO\n\n  \n{line}\n")
    assert refusal().startswith(f".env:5: {said}")


def test_a_bad_value_from_the_environment_is_not_blamed_on_the_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The environment wins over .env, so its value is the bad one.
    (tmp_path / ".env").write_text("FULFILMENT_PREFETCH_COUNT=8\n")
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "abc")
    message = refusal()
    assert message.startswith("FULFILMENT_PREFETCH_COUNT: Input should be a valid")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres@db:5432",
        "postgresql://postgres@db:5432/",
        "postgresql://postgres@/?host=db1:5432&host=db2:5432",
    ],
)
def test_a_database_url_without_a_database_name_stops_the_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    # asyncpg would connect to the database named as the user: postgres, the server's own.
    monkeypatch.setenv("FULFILMENT_DATABASE_URL", url)
    assert refusal().startswith("FULFILMENT_DATABASE_URL: names no database")


def test_a_database_named_by_its_dbname_parameter_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FULFILMENT_DATABASE_URL", "postgresql://u@/?host=db:5432&dbname=shop")
    assert load_settings().database.url.get_secret_value().endswith("dbname=shop")


def test_an_env_file_that_is_a_folder_stops_the_start_in_one_line(tmp_path: Path) -> None:
    (tmp_path / ".env").mkdir()
    assert refusal() == ".env: is a folder, not a file of NAME=VALUE lines: remove or rename it"


def test_a_bad_env_file_value_the_environment_overrides_is_still_refused_at_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The environment's value is the one used, but the file would break the start without it.
    (tmp_path / ".env").write_text("# ours\nFULFILMENT_PREFETCH_COUNT=abc\n")
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "8")
    assert refusal() == (
        ".env:2: FULFILMENT_PREFETCH_COUNT: Input should be a valid integer, unable to parse"
        " string as an integer (the environment's value overrides this line, but fix or remove"
        " it)"
    )


def test_a_good_env_file_value_the_environment_overrides_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_text("FULFILMENT_PREFETCH_COUNT=16\n")
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "8")
    assert load_settings().worker.prefetch_count == 8


@pytest.mark.parametrize(
    ("variables", "said"),
    [
        (
            {"FULFILMENT_DATABASE_STATEMENT_TIMEOUT_SECONDS": "6"},
            (
                "FULFILMENT_DATABASE_STATEMENT_TIMEOUT_SECONDS=6 must be less than"
                " FULFILMENT_RETRY_BUDGET_SECONDS=5"
            ),
        ),
        (
            {"FULFILMENT_DATABASE_LOCK_TIMEOUT_SECONDS": "3"},
            (
                "FULFILMENT_DATABASE_LOCK_TIMEOUT_SECONDS=3 must be less than"
                " FULFILMENT_DATABASE_STATEMENT_TIMEOUT_SECONDS=3"
            ),
        ),
        (
            {"FULFILMENT_WAREHOUSE_TIMEOUT_SECONDS": "90000"},
            (
                "FULFILMENT_WAREHOUSE_TIMEOUT_SECONDS=90000 must be less than"
                " FULFILMENT_WAREHOUSE_KEY_RETENTION_SECONDS=86400"
            ),
        ),
        (
            {"FULFILMENT_WAREHOUSE_CA_FILE": "/ca.pem"},
            "FULFILMENT_WAREHOUSE_CA_FILE is set but FULFILMENT_WAREHOUSE_URL is not an https://",
        ),
    ],
    ids=["statement within retry budget", "lock within statement", "request within key", "ca"],
)
def test_a_rule_across_settings_of_two_groups_or_one_names_both_variables(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], said: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert refusal().startswith(said)


def test_problems_of_several_groups_are_said_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FULFILMENT_PREFETCH_COUNT", "many")
    monkeypatch.setenv("FULFILMENT_RELAY_BATCH_SIZE", "0")
    lines = refusal().splitlines()
    assert [line.partition(":")[0] for line in lines] == [
        "FULFILMENT_PREFETCH_COUNT",
        "FULFILMENT_RELAY_BATCH_SIZE",
    ]


def test_every_variable_keeps_its_plain_name() -> None:
    names = [name for _, _, name in variables()]
    assert len(names) == len(set(names)) == 51
    assert {"FULFILMENT_AMQP_URL", "FULFILMENT_DATABASE_URL", "FULFILMENT_RELAY_HTTP_PORT"} <= set(
        names
    )


KEY_24 = "whsec_dGhlIGZpcnN0IGtleSBvZiAyNCBieXRl"
KEY_26 = "whsec_dGhlIHNlY29uZCBrZXksIG9mIDI2IGJ5dGU="


def test_the_webhook_secrets_are_read_as_a_list_of_whsec_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS", f"{KEY_24} {KEY_26}")
    secrets = load_settings().warehouse.webhook_secrets

    assert secrets.get_secret_value().split() == [KEY_24, KEY_26]
    assert KEY_24 not in repr(secrets)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("c2VjcmV0", "secret 1 does not start with 'whsec_'"),
        (f"{KEY_24} whsec_not*base64", "secret 2 is not whsec_<base64>"),
        ("whsec_", "secret 1 is empty"),
        (
            "whsec_c2VjcmV0 whsec_c2VjcmV0",
            "secret 1 is 6 bytes, fewer than the 24 random bytes Standard Webhooks asks for",
        ),
        (
            f"{KEY_24} whsec_c2VjcmV0",
            "secret 2 is 6 bytes, fewer than the 24 random bytes Standard Webhooks asks for",
        ),
        (f"{KEY_24},whsec_c2VjcmV0", "secrets are separated by spaces, not commas"),
        (f"{KEY_24}, {KEY_26}", "secrets are separated by spaces, not commas"),
    ],
)
def test_webhook_secrets_not_whsec_base64_of_24_bytes_apart_are_refused_without_quoting(
    monkeypatch: pytest.MonkeyPatch, value: str, said: str
) -> None:
    monkeypatch.setenv("FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS", value)
    message = refusal()

    assert message.startswith(f"FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS: {said}")
    assert "c2VjcmV0" not in message
    assert "not*base64" not in message
    assert KEY_24.removeprefix("whsec_") not in message


def test_the_intake_defaults_are_the_product_s() -> None:
    webhooks = load_settings().webhooks

    assert (webhooks.port, webhooks.http_port) == (8083, 8084)
    assert webhooks.tolerance_seconds == 300
    assert webhooks.max_body_bytes == 1024 * 1024


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("FULFILMENT_WEBHOOKS_TOLERANCE_SECONDS", "2.5", "FULFILMENT_WEBHOOKS_TOLERANCE_SECONDS:"),
        ("FULFILMENT_WEBHOOKS_MAX_BODY_BYTES", "10", "FULFILMENT_WEBHOOKS_MAX_BODY_BYTES:"),
        ("FULFILMENT_WEBHOOKS_HTTP_PORT", "8083", "FULFILMENT_WEBHOOKS_PORT and"),
    ],
)
def test_an_intake_setting_out_of_range_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, said: str
) -> None:
    monkeypatch.setenv(name, value)

    assert refusal().startswith(said)


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf", "86401"])
def test_a_bad_drift_interval_stops_the_start_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS", value)
    with pytest.raises(SettingsError, match=r"^FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS"):
        load_settings()


@pytest.mark.parametrize(("value", "seconds"), [(None, 900.0), ("0", 0.0), ("60", 60.0)])
def test_the_drift_interval_is_15_minutes_unless_set_and_0_is_taken(
    monkeypatch: pytest.MonkeyPatch, value: str | None, seconds: float
) -> None:
    if value is not None:
        monkeypatch.setenv("FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS", value)
    assert load_settings().warehouse.drift_interval_seconds == seconds
