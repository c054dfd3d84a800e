"""An aiogram 3 bot in webhook mode behind opledger's gateway, using its operations API.

opledger receives Telegram's webhook, records and deduplicates every update, and forwards it
here (`[bots.forward]`), with Telegram's exact bytes and the headers `X-Opledger-Update-Id` and
`X-Opledger-Attempt`. This bot:

- answers `/start` in the webhook response (aiogram's "reply in webhook"), which opledger
  carries out through the Bot API once, tracked in its ledger;
- handles `/lead NAME` by starting opledger's `lead` action (`POST /v1/operations`), waiting for
  its outcome (`GET /v1/operations/{id}?wait=5`) and answering the user with it: a retried or
  repeated `/lead` joins the same operation, so the CRM gets one lead;
- sends `/offer` with an inline button whose `callback_data` is a one-time token from
  `POST /v1/buttons`: the click goes to opledger, which starts `lead` once however often it
  is clicked, and replies itself.

Configured by environment variables (see README.md). For tests it can record every request it
receives as a JSON line (`BOT_RECORD_FILE`) and answer slowly (`BOT_ANSWER_DELAY_MS`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from aiogram import Bot, Dispatcher, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import PRODUCTION, TelegramAPIServer
from aiogram.filters import Command, CommandObject, CommandStart
from aiogram.types import InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from aiogram.webhook.aiohttp_server import SimpleRequestHandler, setup_application
from aiohttp import web

from opledger_client import Opledger, OpledgerError

router = Router()


@router.message(CommandStart())
async def start(message: Message) -> Any:
    # Returned, not awaited: aiogram puts the call in the webhook answer, and opledger sends it.
    return message.answer(
        "Hello! Send /lead NAME to leave your contact, or /offer for a call back."
    )


@router.message(Command("lead"))
async def lead(
    message: Message, command: CommandObject, event_update: Update, opledger: Opledger
) -> Any:
    name = (command.args or "").strip()
    if not name:
        return message.answer("Send it as /lead NAME, e.g. /lead Ada.")
    user = message.from_user
    try:
        # The business key is the action's (`{name}:{user_id}`): a redelivery, a retry of this
        # handler or the user sending it again finds the same operation. No chat_id: this
        # handler answers the user itself.
        started = await opledger.start(
            "lead",
            {"name": name},
            update_id=event_update.update_id,
            user_id=user.id if user else None,
        )
        settled = await opledger.wait(started["operation_id"], 5)
    except OpledgerError as error:
        if error.status >= 500:
            raise  # opledger is unwell: fail this delivery, the gateway delivers it again
        return message.answer(f"Sorry, that lead cannot be taken: {error.message}")
    status = settled["status"]
    if status in ("confirmed", "reconciled"):
        reference = settled.get("external_id") or settled["operation_id"]
        return message.answer(f"Lead {name} is in the CRM (ref {reference}).")
    if status == "failed":
        return message.answer(f"Sorry, the CRM did not take lead {name}.")
    return message.answer(
        f"Lead {name} is on its way to the CRM; send /lead {name} again later to see where it is."
    )


@router.message(Command("offer"))
async def offer(message: Message, opledger: Opledger) -> Any:
    user = message.from_user
    if user is None:
        return None
    try:
        data = await opledger.button(
            "lead", {"name": user.first_name}, user_id=user.id, chat_id=message.chat.id
        )
    except OpledgerError as error:
        if error.status >= 500:
            raise
        return message.answer(f"Sorry, no offer right now: {error.message}")
    keyboard = InlineKeyboardMarkup(
        inline_keyboard=[[InlineKeyboardButton(text="Yes, call me back", callback_data=data)]]
    )
    return message.answer("Shall we call you back?", reply_markup=keyboard)


def env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if not value:
        sys.exit(f"aiogram-bot: set {name} (see examples/aiogram-bot/README.md)")
    return value


def recorder(path: str, webhook_path: str, secret: str, delay_ms: int) -> Any:
    """An aiohttp middleware that appends one JSON line per webhook request to `path`."""

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != webhook_path:
            return await handler(request)
        body = await request.read()  # aiohttp keeps it for aiogram's handler
        try:
            update = json.loads(body)
        except ValueError:
            update = {}
        message = (update.get("message") or {}) if isinstance(update, dict) else {}
        entry = {
            "pid": os.getpid(),
            "at": time.time(),
            "header_update_id": request.headers.get("X-Opledger-Update-Id"),
            "attempt": request.headers.get("X-Opledger-Attempt"),
            "secret_ok": request.headers.get("X-Telegram-Bot-Api-Secret-Token") == secret,
            "content_type": request.headers.get("Content-Type"),
            "update_id": update.get("update_id") if isinstance(update, dict) else None,
            "chat_id": (message.get("chat") or {}).get("id"),
            "text": message.get("text"),
            "sha256": hashlib.sha256(body).hexdigest(),
        }
        if path:
            with open(path, "a", encoding="utf-8") as file:
                file.write(json.dumps(entry) + "\n")
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        return await handler(request)

    return record


async def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    token = env("BOT_TOKEN")
    secret = env("BOT_WEBHOOK_SECRET")
    host, _, port = env("BOT_LISTEN", "127.0.0.1:8081").rpartition(":")
    path = env("BOT_WEBHOOK_PATH", "/webhook")
    api_base = os.environ.get("TELEGRAM_API_BASE")
    api = TelegramAPIServer.from_base(api_base) if api_base else PRODUCTION
    bot = Bot(token=token, session=AiohttpSession(api=api))
    opledger = Opledger(env("OPLEDGER_URL", "http://127.0.0.1:8080"), env("OPLEDGER_TOKEN"))

    dispatcher = Dispatcher(opledger=opledger)
    dispatcher.include_router(router)
    dispatcher.shutdown.register(opledger.close)

    middlewares = []
    record_file = os.environ.get("BOT_RECORD_FILE", "")
    delay_ms = int(os.environ.get("BOT_ANSWER_DELAY_MS", "0"))
    if record_file or delay_ms:
        middlewares.append(recorder(record_file, path, secret, delay_ms))
    app = web.Application(middlewares=middlewares)
    # handle_in_background=False: the handler runs before the answer, so a method it returns
    # goes back in the webhook response and a failure answers 500 (opledger delivers again).
    SimpleRequestHandler(
        dispatcher=dispatcher, bot=bot, secret_token=secret, handle_in_background=False
    ).register(app, path=path)
    setup_application(app, dispatcher, bot=bot)

    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host or "127.0.0.1", int(port))
    await site.start()
    print(f"aiogram bot listening on http://{host}:{port}{path}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
