"""A small asynchronous client for opledger's operations API (`/v1/operations`, `/v1/buttons`).

Any aiohttp-based bot can copy this file. Every call carries the bot's client token (an
`[[api.clients]]` entry of opledger's configuration), which opens only that bot's operations.
A call that opledger refuses raises `OpledgerError` with the status and opledger's message; a
call that cannot reach opledger raises aiohttp's own error. Both are safe to retry: the same
business key starts one operation however often it is asked.
"""

from __future__ import annotations

from typing import Any

import aiohttp


class OpledgerError(Exception):
    """opledger answered with an error (4xx or 5xx): `status`, its `error` code and `message`."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.error = str(body.get("error", ""))
        self.message = str(body.get("message", ""))
        super().__init__(f"opledger answered {status} {self.error}: {self.message}")


class Opledger:
    """The operations API of one opledger, with one client token."""

    def __init__(self, base_url: str, token: str, timeout_secs: float = 10.0) -> None:
        self._base = base_url.rstrip("/")
        self._token = token
        self._timeout = timeout_secs
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def start(
        self,
        action: str,
        params: dict[str, str],
        *,
        update_id: int,
        user_id: int | None = None,
        chat_id: int | None = None,
    ) -> dict[str, Any]:
        """Starts `action` with `params` (or finds the operation its business key already has).

        `update_id` is the Telegram update that asked for it. Give `chat_id` only if opledger
        should reply to that chat with the outcome (`[actions.reply]`); a handler that answers
        its user itself leaves it out.
        """
        body: dict[str, Any] = {"action": action, "params": params, "update_id": update_id}
        if user_id is not None:
            body["user_id"] = user_id
        if chat_id is not None:
            body["chat_id"] = chat_id
        return await self._call("POST", "/v1/operations", json=body)

    async def wait(self, operation_id: str, seconds: int) -> dict[str, Any]:
        """The operation once it is settled (confirmed, failed, reconciled) or `seconds` passed."""
        return await self._call(
            "GET",
            f"/v1/operations/{operation_id}",
            params={"wait": str(seconds)},
            timeout=seconds + self._timeout,
        )

    async def button(
        self,
        action: str,
        params: dict[str, str],
        *,
        user_id: int,
        chat_id: int | None = None,
        expires_in_secs: int = 3600,
    ) -> str:
        """A one-time `callback_data` that starts `action` once, when `user_id` clicks it."""
        body: dict[str, Any] = {
            "action": action,
            "params": params,
            "user_id": user_id,
            "expires_in_secs": expires_in_secs,
        }
        if chat_id is not None:
            body["chat_id"] = chat_id
        answer = await self._call("POST", "/v1/buttons", json=body)
        return str(answer["callback_data"])

    async def _call(
        self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        async with self._session.request(
            method,
            self._base + path,
            headers={"Authorization": f"Bearer {self._token}"},
            timeout=aiohttp.ClientTimeout(total=timeout or self._timeout),
            **kwargs,
        ) as response:
            body = await response.json(content_type=None)
            if response.status >= 400:
                raise OpledgerError(response.status, body if isinstance(body, dict) else {})
            return body
