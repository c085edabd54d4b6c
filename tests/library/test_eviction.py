"""The rule that makes room on the GPU: idle models only, least recently used first, no more than needed."""

from __future__ import annotations

from tray_app.library.eviction import Loaded, make_room

MiB = 1024**2


def test_nothing_is_unloaded_when_the_new_model_fits_beside_the_others() -> None:
    room = make_room(1000 * MiB, 3, [Loaded("a", 300 * MiB, busy=False, last_used=1.0)], 500 * MiB)
    assert room.fits and room.evict == ()


def test_the_least_recently_used_idle_model_goes_first_and_only_as_many_as_needed() -> None:
    loaded = [
        Loaded("recent", 300 * MiB, busy=False, last_used=30.0),
        Loaded("oldest", 300 * MiB, busy=False, last_used=10.0),
        Loaded("older", 300 * MiB, busy=False, last_used=20.0),
    ]
    assert make_room(1000 * MiB, 0, loaded, 100 * MiB).evict == ()
    assert make_room(1000 * MiB, 0, loaded, 400 * MiB).evict == ("oldest",)
    room = make_room(1000 * MiB, 0, loaded, 500 * MiB)
    assert room.fits and room.evict == ("oldest", "older")


def test_a_model_with_requests_in_flight_is_never_unloaded() -> None:
    loaded = [Loaded("busy", 600 * MiB, busy=True, last_used=1.0), Loaded("idle", 300 * MiB, False, 5.0)]
    room = make_room(1000 * MiB, 3, loaded, 350 * MiB)
    assert room.fits and room.evict == ("idle",)
    room = make_room(1000 * MiB, 3, loaded, 500 * MiB)
    assert not room.fits and room.evict == ()  # even unloading "idle" would not make room: nothing goes
    assert "busy" in room.reason


def test_the_count_limit_unloads_one_even_when_bytes_would_fit() -> None:
    loaded = [Loaded("a", 10 * MiB, False, 2.0), Loaded("b", 10 * MiB, False, 1.0)]
    room = make_room(1000 * MiB, 2, loaded, 10 * MiB)
    assert room.fits and room.evict == ("b",)


def test_a_model_larger_than_the_whole_share_never_fits() -> None:
    room = make_room(100 * MiB, 3, [], 200 * MiB)
    assert not room.fits and "200.00 MiB" in room.reason
