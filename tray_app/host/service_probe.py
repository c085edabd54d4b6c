"""What already answers at the service's address: Failsoft, another program, or nothing.

The README's home-server set-up runs `failsoft serve` as a systemd unit and the tray at login: that tray
must show the running service, not fail to bind its port and vanish. So before it starts a service of its
own, the tray asks the configured address (`GET /failsoft/status`): Failsoft there means attach to it;
another program there is named in the error; a refused connection means the address is free. `failsoft
serve` and `failsoft doctor` ask the same when the port is taken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import httpx

# How long a port that accepts connections may stay silent: a `failsoft serve` that has just bound its port
# answers once it has read its model and opened its journal, a few seconds at most.
ANSWER_WAIT_S = 15.0
# `failsoft serve` and `failsoft doctor` only name what holds a port they found taken: a shorter wait.
TAKEN_PORT_WAIT_S = 3.0
Found = Literal["failsoft", "refused", "other", "nothing"]


@dataclass(frozen=True)
class Probe:
    found: Found
    detail: str = ""  # what answered, in words for a message


def local_url(host: str, port: int) -> str:
    """Where this machine reaches a service bound to `host` (a wildcard bind is reached on loopback)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def probe_service(base_url: str, api_key: str = "", wait: float = ANSWER_WAIT_S) -> Probe:
    """What answers `GET /failsoft/status` at `base_url`: Failsoft ("failsoft"), Failsoft refusing this
    config's API key ("refused"), anything else ("other"), or nothing listening ("nothing")."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + wait
    with httpx.Client(trust_env=False, timeout=httpx.Timeout(2.0, connect=1.0), headers=headers) as client:
        while True:
            try:
                response = client.get(f"{base_url}/failsoft/status")
            except httpx.ConnectError:
                return Probe("nothing")
            except (httpx.TimeoutException, httpx.RemoteProtocolError, httpx.ReadError):
                if time.monotonic() >= deadline:
                    return Probe("other", f"something listens at {base_url} but gives no HTTP answer")
                time.sleep(0.25)  # a service that is still starting: it answers soon
                continue
            return _classify(base_url, response)


def _classify(base_url: str, response: httpx.Response) -> Probe:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code == 200 and _is_status(body):
        return Probe("failsoft", f"Failsoft {body['version']} at {base_url}")
    error = body.get("error") if isinstance(body, dict) else None
    if response.status_code == 401 and isinstance(error, dict) and error.get("code") == "invalid_api_key":
        return Probe("refused", f"the Failsoft service at {base_url} refuses this config's API key")
    return Probe("other", f"another program answers at {base_url} (HTTP {response.status_code})")


def _is_status(body: object) -> bool:
    """Failsoft's own status object (contract.status.ServiceStatus), by the fields the tray reads."""
    return (
        isinstance(body, dict)
        and isinstance(body.get("version"), str)
        and isinstance(body.get("workers"), dict)
        and isinstance(body.get("plan"), dict)
    )
