"""The signed action links: one job, one decision, until they expire, once; and the page's login sessions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tray_app.reach.capability import Refused, Signer, ensure_key, signer_for

KEY = b"k" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_link_grants_its_decision_on_its_job_once() -> None:
    signer = Signer(KEY)
    token = signer.link_token("job-abc", "approve")
    action = signer.use(token)
    assert (action.job_id, action.decision) == ("job-abc", "approve")
    with pytest.raises(Refused, match="used already"):
        signer.use(token)


def test_checking_does_not_use_a_link_up() -> None:
    signer = Signer(KEY)
    token = signer.link_token("job-abc", "reject")
    assert signer.check(token).decision == "reject"
    assert signer.use(token).decision == "reject"


@pytest.mark.parametrize(
    "change",
    [
        lambda parts: ["job-other", *parts[1:]],  # another job's id
        lambda parts: [parts[0], "reject", *parts[2:]],  # the other decision
        lambda parts: [*parts[:2], str(int(parts[2]) + 3600), *parts[3:]],  # a later expiry
        lambda parts: [*parts[:3], "another-nonce", parts[4]],  # a fresh nonce to get round single use
        lambda parts: [*parts[:4], parts[4][:-2] + ("AA" if parts[4][-2:] != "AA" else "BB")],
    ],
)
def test_a_changed_link_is_refused(change: object) -> None:
    signer = Signer(KEY)
    parts = signer.link_token("job-abc", "approve").split(".")
    with pytest.raises(Refused, match="changed"):
        signer.use(".".join(change(parts)))  # type: ignore[operator]


def test_a_link_made_with_another_key_is_refused() -> None:
    token = Signer(b"x" * 32).link_token("job-abc", "approve")
    with pytest.raises(Refused):
        Signer(KEY).use(token)


@pytest.mark.parametrize("token", ["", "job-abc", "a.b.c.d.e", "job-abc.approve.12.n.sig.extra"])
def test_garbage_is_refused(token: str) -> None:
    with pytest.raises(Refused):
        Signer(KEY).check(token)


def test_an_expired_link_is_refused() -> None:
    clock = Clock()
    signer = Signer(KEY, now=clock)
    token = signer.link_token("job-abc", "approve", ttl=60)
    clock.now += 61
    with pytest.raises(Refused, match="expired"):
        signer.use(token)


def test_a_used_link_stays_used_after_a_restart(tmp_path: Path) -> None:
    token = signer_for(tmp_path).link_token("job-abc", "approve")
    signer_for(tmp_path).use(token)
    with pytest.raises(Refused, match="used already"):
        signer_for(tmp_path).use(token)  # a new service on the same data folder


def test_the_key_is_made_once_and_private(tmp_path: Path) -> None:
    key = ensure_key(tmp_path)
    assert ensure_key(tmp_path) == key and len(key) == 32
    assert (tmp_path / "action-key").stat().st_mode & 0o777 == 0o600


def test_a_session_is_kept_here_and_ends_when_idle_or_too_old() -> None:
    clock = Clock()
    signer = Signer(KEY, now=clock, owner="admin")
    cookie = signer.start_session()
    assert signer.session_valid(cookie)
    assert not Signer(KEY, owner="admin").session_valid(cookie)  # no other service knows it
    assert not signer.session_valid(cookie[::-1]) and not signer.session_valid("garbage")
    clock.now += signer.sessions.idle - 1
    assert signer.session_valid(cookie)  # used: not idle
    clock.now += signer.sessions.idle + 1
    assert not signer.session_valid(cookie)  # unused for longer than IDLE
    again, started = signer.start_session(), clock.now
    while clock.now + signer.sessions.idle / 2 - started <= signer.session_ttl:
        clock.now += signer.sessions.idle / 2
        assert signer.session_valid(again)
    clock.now += signer.sessions.idle / 2
    assert not signer.session_valid(again)  # in use all along, but older than TTL


def test_an_ended_session_stays_ended_also_after_a_restart(tmp_path: Path) -> None:
    signer = signer_for(tmp_path)
    kept, ended = signer.start_session(), signer.start_session()
    signer.end_session(ended)
    assert not signer.session_valid(ended)
    restarted = signer_for(tmp_path)
    assert restarted.session_valid(kept) and not restarted.session_valid(ended)
    stored = (tmp_path / "sessions.json").read_text(encoding="utf-8")
    assert kept not in stored  # digests only: the file gives no cookie
    assert (tmp_path / "sessions.json").stat().st_mode & 0o777 == 0o600


def test_a_new_admin_token_ends_every_session(tmp_path: Path) -> None:
    cookie = signer_for(tmp_path).start_session()
    (tmp_path / "admin-token").unlink()  # the owner makes a new token: the next start writes one
    assert not signer_for(tmp_path).session_valid(cookie)
    assert "sessions" in (tmp_path / "sessions.json").read_text(encoding="utf-8")
    assert '"owner"' not in (tmp_path / "sessions.json").read_text(encoding="utf-8")  # gone from the file


def test_the_sessions_are_bounded() -> None:
    signer = Signer(KEY)
    first = signer.start_session()
    for _ in range(100):
        signer.start_session()
    assert len(signer.sessions) == 32 and not signer.session_valid(first)


@pytest.mark.parametrize("cookie", ["é", "1.a.\xe9", "\ud800", "x" * 10_000, ""])
def test_any_text_is_no_session_and_no_error(cookie: str) -> None:
    signer = Signer(KEY)
    assert not signer.session_valid(cookie)
    signer.end_session(cookie)


@pytest.mark.parametrize("signature", ["é", "\ud800", "\u00e9" * 43])
def test_any_text_in_a_link_is_refused_not_an_error(signature: str) -> None:
    signer = Signer(KEY)
    parts = signer.link_token("job-abc", "approve").split(".")
    with pytest.raises(Refused):
        signer.check(".".join([*parts[:4], signature]))
    with pytest.raises(Refused):
        signer.check("jöb.approve.1.n." + signature)


def test_a_link_token_is_not_a_session_cookie() -> None:
    signer = Signer(KEY)
    assert not signer.session_valid(signer.link_token("job-abc", "approve"))
