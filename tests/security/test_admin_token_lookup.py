"""Where a local client finds the admin token: the environment, a running system service's copy (for a
member of the group `failsoft`), else this user's own data folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tray_app.reach import admin_token


@pytest.fixture
def own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv(admin_token.ENV_VARIABLE, raising=False)
    monkeypatch.setenv("FAILSOFT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(admin_token, "SYSTEM_COPY", tmp_path / "run" / "failsoft" / "admin-token")
    return admin_token.ensure()


def test_without_a_system_service_the_users_own_token(own: str) -> None:
    assert admin_token.for_client() == own


def test_a_running_system_services_copy_comes_first(own: str) -> None:
    admin_token.SYSTEM_COPY.parent.mkdir(parents=True)
    admin_token.SYSTEM_COPY.write_text("system-token\n", encoding="ascii")
    assert admin_token.for_client() == "system-token"
    admin_token.SYSTEM_COPY.unlink()  # the service stopped: systemd removed its runtime folder
    assert admin_token.for_client() == own


def test_the_environment_and_a_named_data_folder_win(
    own: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin_token.SYSTEM_COPY.parent.mkdir(parents=True)
    admin_token.SYSTEM_COPY.write_text("system-token\n", encoding="ascii")
    elsewhere = tmp_path / "elsewhere"
    theirs = admin_token.ensure(elsewhere)
    assert admin_token.for_client(elsewhere) == theirs != own
    monkeypatch.setenv(admin_token.ENV_VARIABLE, "from-env")
    assert admin_token.for_client() == admin_token.for_client(elsewhere) == "from-env"
