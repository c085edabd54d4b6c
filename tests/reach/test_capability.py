"""The signed action links: one job, one decision, until they expire, once; and the page's login cookie."""

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


def test_the_session_cookie_is_signed_and_expires() -> None:
    clock = Clock()
    signer = Signer(KEY, now=clock)
    cookie = signer.session_cookie()
    assert signer.session_valid(cookie)
    assert not Signer(b"x" * 32).session_valid(cookie)
    assert not signer.session_valid(cookie.replace(cookie[0], "9", 1))
    assert not signer.session_valid("garbage")
    clock.now += signer.session_ttl + 1
    assert not signer.session_valid(cookie)


def test_a_link_token_is_not_a_session_cookie() -> None:
    signer = Signer(KEY)
    assert not signer.session_valid(signer.link_token("job-abc", "approve"))
