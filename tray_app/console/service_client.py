"""One short request at a time to a running service, its failures in words a terminal user can act on."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

import httpx

from tray_app import config
from tray_app.host.service_probe import local_url
from tray_app.reach import admin_token

API_KEY_VARIABLE = "FAILSOFT_API_KEY"  # a key on the command line would show in every `ps`
TIMEOUT_S = 15.0


class ServiceError(Exception):
    """The service could not be reached, or refused the request; the message says which and why."""


@dataclass(frozen=True)
class ServiceClient:
    base_url: str
    api_key: str = ""
    # The control API's token named for this service (--admin-token). "": the token found on this machine
    # ($FAILSOFT_ADMIN_TOKEN, the data folder's file), sent only when `base_url` is the local service's own
    # address (`own`: the config's host and port; None: read from the config).
    admin: str = ""
    own: tuple[str, int] | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServiceClient:
        """The service at `--url`, else at the config's address; the key from $FAILSOFT_API_KEY, else the
        config's `[server] api_key`; the admin token from --admin-token, else the one found on this machine
        for the config's own address only."""
        cfg = config.load_config(args)
        url = (args.url or local_url(cfg.server.host, cfg.server.port)).rstrip("/")
        return cls(
            url,
            os.environ.get(API_KEY_VARIABLE) or cfg.server.api_key,
            admin=(getattr(args, "admin_token", None) or "").strip(),
            own=(cfg.server.host, cfg.server.port),
        )

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        return self._call("GET", path, params=params)

    def post(self, path: str, body: dict[str, Any] | None = None, timeout: float = TIMEOUT_S) -> Any:
        """`timeout`: a load or a restart answers once its worker is ready, which takes minutes at most."""
        return self._call("POST", path, body=body, timeout=timeout)

    def _call(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        timeout: float = TIMEOUT_S,
    ) -> Any:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if admin_token.sent_by_owner(path):
            headers.update(admin_token.headers(self.admin or admin_token.for_url(self.base_url, self.own)))
        try:
            with httpx.Client(trust_env=False, timeout=timeout, headers=headers) as client:
                response = client.request(method, self.base_url + path, params=params, json=body)
        except httpx.TimeoutException:
            raise ServiceError(
                f"the service at {self.base_url} did not answer within {timeout:.0f} s"
            ) from None
        except httpx.TransportError as error:
            raise ServiceError(
                f"no Failsoft service answers at {self.base_url} ({error.__class__.__name__}): start it with "
                "`failsoft serve` (or `failsoft` for the tray), or name another with --url"
            ) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success and body is not None:
            return body
        raise ServiceError(self._refusal(response.status_code, body))

    def _refusal(self, status: int, body: Any) -> str:
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            return f"what answers at {self.base_url} is not a Failsoft service (HTTP {status})"
        if error.get("code") == "invalid_api_key":
            return (
                f"the service at {self.base_url} wants an API key: set {API_KEY_VARIABLE}, or "
                "[server] api_key in the config"
            )
        if (
            error.get("code") == "admin_token_required"
            and not self.admin
            and not admin_token.is_local_service(self.base_url, self.own)
        ):
            return (
                f"the service at {self.base_url} wants its admin token: pass --admin-token (the token found "
                "on this machine goes only to the local service's own address, the config's host and port)"
            )
        return str(error.get("message") or f"HTTP {status}")
