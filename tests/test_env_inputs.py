"""Environment variables are inputs too (docs/inputs.md): a bad value is one UserError naming the
variable, before any work, never a traceback, a wait of 0 s or a wait forever (issue 49)."""

from __future__ import annotations

import math
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oelm.utils.env import env_count, env_seconds
from oelm.utils.errors import UserError
from train_utils import synthetic_lm_dir, tiny_config

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
TEXT = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
    st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e400", "  ", "0.0", "-0", "3", "2.5", "1_0"]),
)


@SETTINGS
@given(raw=TEXT, positive=st.booleans())
def test_any_seconds_value_is_a_finite_number_or_one_line_naming_the_variable(raw: str, positive: bool) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OELM_TEST_WAIT_S", raw)
        try:
            value = env_seconds("OELM_TEST_WAIT_S", 60, positive=positive)
        except UserError as err:
            text = str(err)
            assert "OELM_TEST_WAIT_S=" in text and "\n" not in text and "unset it" in text
            return
    assert math.isfinite(value) and (value > 0 if positive else value >= 0)
    assert value == (60 if not raw.strip() else float(raw))


@SETTINGS
@given(raw=TEXT)
def test_any_count_value_is_a_whole_number_or_one_line_naming_the_variable(raw: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OELM_THREADS", raw)
        try:
            value = env_count("OELM_THREADS", 0)
        except UserError as err:
            assert "OELM_THREADS=" in str(err)
            return
    assert value >= 0


def _launch(monkeypatch: pytest.MonkeyPatch, timeout: str) -> None:
    with socket.socket() as s:  # a free port: nobody would answer there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OELM_DIST_TIMEOUT_S": timeout,
    }.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("timeout", ["0", "-5", "soon", "nan"])
def test_a_zero_or_negative_distributed_timeout_is_refused_naming_it_before_any_work(
    timeout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from oelm.training.loop import train

    _launch(monkeypatch, timeout)
    cfg = tiny_config(synthetic_lm_dir(tmp_path / "data"), tmp_path / "run")
    start = time.monotonic()
    with pytest.raises(UserError, match=rf"OELM_DIST_TIMEOUT_S='{timeout}' is not a number of seconds > 0"):
        train(cfg)
    assert time.monotonic() - start < 10
    assert not (tmp_path / "run").exists()


def test_a_bad_data_wait_is_refused_naming_it_not_a_traceback(tmp_path: Path, monkeypatch) -> None:
    from oelm.experiments.prepare import ensure_run_data

    class Cfg:
        task, data = "lm", str(tmp_path / "data")

    monkeypatch.setenv("RANK", "1")
    for raw in ("an hour", "-1", "nan"):
        monkeypatch.setenv("OELM_DATA_WAIT_S", raw)
        with pytest.raises(UserError, match=rf"OELM_DATA_WAIT_S='{raw}' is not a number of seconds >= 0"):
            ensure_run_data(Cfg(), {"prepare": {"source": "tales"}})
