"""Ids and seeds: random, never repeated, from one draw of the OS's random source per block."""

from __future__ import annotations

import os
import uuid

import pytest

from tray_app.jobs import ids
from tray_app.jobs.registry import new_id


def test_the_pool_hands_out_what_the_os_gave_in_order_and_draws_again_when_it_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    draws: list[bytes] = []
    real = os.urandom

    def urandom(count: int) -> bytes:
        draws.append(real(count))
        return draws[-1]

    monkeypatch.setattr(ids.os, "urandom", urandom)
    pool = ids.RandomPool(block_bytes=64)
    taken = [pool.take(12) for _ in range(5)]  # 60 of the 64 bytes
    assert len(draws) == 1 and b"".join(taken) == draws[0][:60]
    sixth = pool.take(12)  # 4 left is not enough: a new block, nothing of the old one reused
    assert len(draws) == 2 and sixth == draws[1][:12]
    assert pool.take(100) == draws[2] and len(draws[2]) == 100  # a request larger than a block


def test_ids_and_seeds_have_their_shapes_and_do_not_repeat() -> None:
    job_ids = {new_id("job") for _ in range(2000)}
    assert len(job_ids) == 2000
    assert all(len(job_id) == len("job-") + 24 and int(job_id[4:], 16) >= 0 for job_id in job_ids)
    request_ids = [ids.new_request_id() for _ in range(2000)]
    assert len(set(request_ids)) == 2000
    for request_id in request_ids:
        parsed = uuid.UUID(request_id)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, request_id)
    seeds = [ids.random_seed() for _ in range(2000)]
    assert all(0 <= seed < 2**31 for seed in seeds) and len(set(seeds)) > 1990
    assert max(seeds) > 2**30  # the top bit of the 31 is used
