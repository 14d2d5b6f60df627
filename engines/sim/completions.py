"""The generation endpoints (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``,
``/v1/messages``; ``engines.sim.apis`` describes each): one handler, top-down, plus Anthropic's
``/v1/messages/count_tokens``.

parse -> record -> faults (crash, headers delay, status) -> validate (``params``: ``stop`` and
``n`` as vLLM checks them) -> tokenise -> plan ->
schedule (engine, or the fixed ``chunk_interval_s`` clock) -> stream or answer. A client
disconnect cancels the handler (``handler_cancellation=True``) or fails a write; either way the
sequences leave the engine and the request counts as aborted.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from engines.sim.agent import REASONING_TOKENS, script_turn, wants_reasoning
from engines.sim.apis import CHAT, COMPLETION, MESSAGES, RESPONSES, Api
from engines.sim.engine import Job
from engines.sim.faults import Faults
from engines.sim.messages_api import SchemaError, count_tokens_body
from engines.sim.messages_api import to_chat as messages_to_chat
from engines.sim.params import InvalidParam, check_n, check_stop
from engines.sim.plans import Plan, make_plans
from engines.sim.replica_state import STATE, SimState
from engines.sim.request import RequestContext, RequestError
from engines.sim.request_models import request_problem
from engines.sim.sse import ConnectionReset
from engines.sim.textgen import Prompt, analyse, analyse_ids, render_chat, rendered_key

THREAD_THRESHOLD_CHARS = 200_000  # tokenise larger prompts in a worker thread


def error_response(state: SimState, faults: Faults | None, status: int, message: str,
                   param: str | None = None, type_: str | None = None,
                   headers: dict[str, str] | None = None, api: Api = CHAT) -> web.Response:
    """A vLLM error response in ``api``'s shape (OpenAI: nested, or flat with
    ``--legacy-error-shape``; Anthropic for ``/v1/messages``)."""
    flat = state.config.legacy_error_shape
    if faults is not None and faults.error_shape is not None:
        flat = faults.error_shape == "flat"
    body = api.error_body(message, status, flat=flat, type_=type_, param=param)
    return web.Response(status=status, body=body, content_type="application/json",
                        headers=headers)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    return await handle(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    return await handle(request, COMPLETION)


async def responses(request: web.Request) -> web.StreamResponse:
    """``POST /v1/responses``."""
    return await handle(request, RESPONSES)


async def messages(request: web.Request) -> web.StreamResponse:
    """``POST /v1/messages``."""
    return await handle(request, MESSAGES)


async def count_tokens(request: web.Request) -> web.Response:
    """``POST /v1/messages/count_tokens``: the prompt's tokens as the engine would count them
    (the same rendering as ``/v1/messages``); the replica faults ``status`` and
    ``headers_delay_s`` apply."""
    state = request.app[STATE]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        state.record(request, None)
        return error_response(state, None, 400, f"Invalid JSON in request body: {e}")
    state.record(request, body)
    faults = state.faults
    if faults.headers_delay_s:
        await asyncio.sleep(faults.headers_delay_s)
    if faults.status is not None:
        msg = faults.error_message or f"Simulated error {faults.status}"
        return error_response(state, faults, faults.status, msg, api=MESSAGES)
    try:
        if not isinstance(body, dict):
            raise SchemaError("Request body must be a JSON object", "body")
        refused = request_problem("count_tokens", body)
        if refused is not None:
            raise refused
        chat_body = messages_to_chat(body, need_max_tokens=False)
        chat_body["max_tokens"] = None
        prompts, _ = await _prepare(state, chat_body, faults, True)
    except RequestError as e:
        api = CHAT if isinstance(e, SchemaError) else MESSAGES
        return error_response(state, faults, e.status, e.message, param=e.param, api=api)
    return web.Response(body=count_tokens_body(prompts[0].num_tokens),
                        content_type="application/json")


async def handle(request: web.Request, api: Api) -> web.StreamResponse:
    """Serve one generation request of ``api`` (module docstring)."""
    state = request.app[STATE]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        state.record(request, None)
        return error_response(state, None, 400, f"Invalid JSON in request body: {e}")
    entry = state.record(request, body)
    if not isinstance(body, dict):
        return error_response(state, None, 400, "Request body must be a JSON object")
    chat = api.chat
    refused = request_problem(api.name, body)
    if refused is not None:  # vLLM's pydantic models refuse it: its OpenAI-shaped 400
        return error_response(state, None, 400, refused.message, param=refused.param)
    faults = _request_faults(state, body)
    if isinstance(faults, web.Response):
        return faults
    if faults.crash:
        os._exit(1)
    job: Job | None = None
    try:
        early = await _fault_answer(state, faults, api)
        if early is not None:
            return early
        try:
            chat_body = api.to_chat(body)
            prompts, plans = await _prepare(state, chat_body, faults, chat)
            faults = _turn_faults(faults, chat_body) if chat else faults
        except RequestError as e:
            shape = CHAT if isinstance(e, SchemaError) else api
            return error_response(state, faults, e.status, e.message, param=e.param,
                                  type_=e.type_, api=shape)
        try:
            priority = _priority(state, body)
        except RequestError as e:
            return error_response(state, faults, e.status, e.message, param=e.param,
                                  type_=e.type_, api=api)
        deliveries: AsyncIterator[list[tuple[int, int, bool]]]
        if faults.chunk_interval_s is not None:
            deliveries = _clock(plans, faults.chunk_interval_s)
        else:
            job = Job(priority)
            for pl in plans:
                pr = prompts[pl.index // (len(plans) // len(prompts))]
                job.add(pl.index, pr.num_tokens, pr.block_hashes, pl.tokens)
            deliveries = _engine_outputs(state, job, len(plans))
        ctx = RequestContext(state, chat, prompts, plans, job, faults, body, rid=api.rid(body))
        if body.get("stream"):
            resp = await api.stream(request, ctx, deliveries)
        else:
            try:
                resp = await api.full(request, ctx, deliveries)
            except ConnectionReset:  # the connection is gone; nothing reaches the client
                resp = web.Response(status=502)
        entry["completed"] = not ctx.reset
        if not ctx.reset:
            state.counts.completed += 1
            for pl in plans:
                state.metrics.finished(pl.finish)
        return resp
    except asyncio.CancelledError:
        _count_abort(state, entry)
        raise
    except ConnectionResetError:
        # the client left mid-answer (aiohttp raises on the next write): an abort, as in vLLM,
        # not a server error; aiohttp finds the transport closed and only logs the access
        _count_abort(state, entry)
        if request.transport is not None:
            request.transport.abort()  # never answer twice on a half-written stream
        return web.Response(status=499)
    finally:
        if job is not None:
            state.engine.abort(job)


def _request_faults(state: SimState, body: dict[str, Any]) -> Faults | web.Response:
    """The simulator's faults merged with the request's own ``sim_faults``, or the 400 that
    refuses them (not accepted by this simulator, or invalid)."""
    try:
        own = body.get("sim_faults")
        if own is not None and not state.config.accept_sim_faults:
            return error_response(state, None, 400, "sim_faults is not accepted by this "
                                  "simulator (start it with --accept-sim-faults)",
                                  param="sim_faults")
        return state.faults.merged(Faults.model_validate(own) if own is not None else None)
    except ValidationError as e:
        return error_response(state, None, 400, f"Invalid sim_faults: {e}", param="sim_faults")


async def _fault_answer(state: SimState, faults: Faults, api: Api) -> web.Response | None:
    """After ``headers_delay_s``, the answer that replaces generation: the fault's own error
    status (with its ``Retry-After``), or 503 while the engine is still loading; None to
    generate."""
    if faults.headers_delay_s:
        await asyncio.sleep(faults.headers_delay_s)
    if faults.status is not None:
        headers = None
        if faults.retry_after is not None:
            ra = faults.retry_after
            headers = {"Retry-After": str(int(ra)) if ra == int(ra) else str(ra)}
        msg = faults.error_message or f"Simulated error {faults.status}"
        return error_response(state, faults, faults.status, msg, type_=faults.error_type,
                              headers=headers, api=api)
    if not state.ready:
        return error_response(state, faults, 503, "The engine is still loading.", api=api)
    return None


def _count_abort(state: SimState, entry: dict[str, Any]) -> None:
    """Count one request aborted by its client (the ``/sim/requests`` entry and the metric)."""
    entry["aborted"] = True
    state.counts.aborted += 1
    state.metrics.sim_aborted.inc()


def _priority(state: SimState, body: dict[str, Any]) -> int:
    """The request's ``priority`` (vLLM's extra field, default 0; lower runs earlier). Like
    vLLM (``Processor.process_inputs``), a non-zero priority without ``--scheduling-policy
    priority`` is refused (400)."""
    priority = body.get("priority", 0)
    if priority is None:
        priority = 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise RequestError(400, "priority must be an integer", "priority")
    if priority != 0 and state.config.scheduling_policy != "priority":
        raise RequestError(
            400, f"Got priority {priority} but Priority scheduling is not enabled.", "priority"
        )
    return priority


def _turn_faults(faults: Faults, body: dict[str, Any]) -> Faults:
    """``faults`` with the scripted turn's own ``reset_after_chunks`` (``ScriptTurn``: counted
    in the turn's answer, after the ``REASONING_TOKENS`` reasoning events of a request that
    asks for reasoning) when this request answers such a turn and does not continue one."""
    if body.get("continue_final_message"):
        return faults
    turn = script_turn(faults.script, body, faults.script_text_when)
    if turn is None or turn.reset_after_chunks is None:
        return faults
    after = turn.reset_after_chunks + (REASONING_TOKENS if wants_reasoning(body) else 0)
    return faults.model_copy(update={"reset_after_chunks": after})


async def _prepare(state: SimState, body: dict[str, Any], faults: Faults, chat: bool
                   ) -> tuple[list[Prompt], list[Plan]]:
    cfg = state.config
    try:  # sampling parameters first, as vLLM's schema does: before any tokenising
        n = check_n(body)
        check_stop(body)
    except InvalidParam as e:
        raise RequestError(400, e.message, e.param, e.type_) from None
    model = body.get("model")
    if model is not None and model != cfg.model:
        raise RequestError(
            404, f"The model `{model}` does not exist. Valid aliases: {cfg.model}.", "model"
        )
    texts, ids, prefix, base_key = _prompt_inputs(state, body, faults, chat)
    bs = cfg.block_size
    prompts: list[Prompt] = []
    for t in texts:
        if len(t) > THREAD_THRESHOLD_CHARS:
            prompts.append(await asyncio.to_thread(analyse, t, bs))
        else:
            prompts.append(analyse(t, bs))
    prompts.extend(analyse_ids(i, bs) for i in ids)
    if base_key is not None:  # the words an uninterrupted turn would have had
        prompts[0].key = base_key
    requested = body.get("max_completion_tokens") if chat else None
    if requested is None:
        requested = body.get("max_tokens")
    if requested is not None and (not isinstance(requested, int) or requested < 1):
        raise RequestError(400, f"max_tokens must be at least 1, got {requested}. "
                           f"(parameter=max_tokens, value={requested})", "max_tokens")
    if requested is not None and requested > cfg.max_model_len:
        raise RequestError(400, f"max_tokens={requested} cannot be greater than max_model_len="
                           f"{cfg.max_model_len}. Please request fewer output tokens. "
                           f"(parameter=max_tokens, value={requested})", "max_tokens")
    limits: list[int] = []
    for pr in prompts:
        room = cfg.max_model_len - pr.num_tokens
        if room < 1:
            raise RequestError(
                400,
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"your prompt contains {pr.num_tokens} input tokens, which exceeds this limit "
                "even without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={pr.num_tokens})",
                "input_tokens",
            )
        # vLLM 0.32 caps the output at the room left instead of rejecting the request
        limits.append(room if requested is None else min(requested, room))
    plans = make_plans(body, prompts, n, limits, cfg.output_tokens, faults, state.textgen, chat,
                       prefix=prefix, policy=cfg.turn_policy())
    for pl in plans:
        need = -(-(prompts[pl.index // n].num_tokens + pl.tokens) // bs)
        if need > cfg.num_gpu_blocks:
            raise RequestError(400, f"The request needs {need} KV-cache blocks; the engine has "
                               f"{cfg.num_gpu_blocks}.")
    return prompts, plans


def _prompt_inputs(state: SimState, body: dict[str, Any], faults: Faults, chat: bool
                   ) -> tuple[list[str], list[list[int]], str | None, int | None]:
    """What a request asks to be tokenised: ``(texts, token id lists, prefix, base key)``.
    ``prefix``: the assistant text a continuation carries on (``continue_final_message``, a
    completions prompt that ends in text already produced, or a script's tail); ``base key``:
    the rendered key of the prompt without that prefix (None without one). Raises
    ``RequestError`` (400) for missing or malformed messages or prompt."""
    texts: list[str] = []
    ids: list[list[int]] = []
    prefix: str | None = None  # continue_final_message: the assistant text to continue
    base_key: int | None = None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty list", "messages")
        try:
            prefix = continuation_prefix(body, messages)
            if prefix is None:
                texts.append(render_chat(messages))
            else:  # the prompt ends inside the assistant's turn, right after its text
                base = render_chat(messages[:-1])
                texts.append(base + prefix)
                base_key = rendered_key(base)
        except ValueError as e:
            raise RequestError(400, str(e), "messages") from e
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            texts.append(prompt)
            found = state.textgen.continued(prompt) if body.get("n") in (None, 1) else None
            if found is not None:  # a prompt plus the text already produced: continue it
                prefix, base_key = prompt[found[0]:], found[1]
            elif faults.chunks:  # a script continues where the prompt's tail leaves it
                prefix = _script_tail(prompt, faults.chunks)
        elif isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            ids.append(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(x, str) for x in prompt):
            texts.extend(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(x, list) for x in prompt):
            ids.extend(prompt)
        else:
            raise RequestError(400, "'prompt' must be a string, a list of strings or token ids",
                               "prompt")
    return texts, ids, prefix, base_key


def _script_tail(prompt: str, chunks: list[str]) -> str | None:
    """The longest start of the scripted text (whole chunks) that ``prompt`` ends with."""
    acc = ""
    best = None
    for c in chunks:
        acc += c
        if prompt.endswith(acc):
            best = acc
    return best


def continuation_prefix(body: dict[str, Any], messages: list[Any]) -> str | None:
    """The final assistant message's text when the request asks vLLM to continue it
    (``continue_final_message: true``), else None. Like vLLM (``ChatCompletionRequest``'s
    validator), ``add_generation_prompt`` (default true) must then be false; and the final
    message must be the assistant's. Raises ``ValueError`` (answered as 400)."""
    if not body.get("continue_final_message"):
        return None
    if body.get("add_generation_prompt", True):
        raise ValueError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        raise ValueError(
            "continue_final_message is set but the final message is not an assistant message."
        )
    content = last.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise ValueError("continue_final_message needs the final message's content as text.")
    return content


async def _engine_outputs(state: SimState, job: Job, n_plans: int
                          ) -> AsyncIterator[list[tuple[int, int, bool]]]:
    state.engine.submit(job)
    left = n_plans
    while left:
        out = await job.next()
        left -= sum(1 for o in out if o[2])
        yield out


async def _clock(plans: list[Plan], interval: float) -> AsyncIterator[list[tuple[int, int, bool]]]:
    """One item per choice per tick, ``interval`` seconds apart (fault ``chunk_interval_s``)."""
    remaining = {pl.index: pl.tokens for pl in plans}
    first = True
    while remaining:
        if not first:
            await asyncio.sleep(interval)
        first = False
        out = []
        for idx in list(remaining):
            remaining[idx] -= 1
            done = remaining[idx] == 0
            if done:
                del remaining[idx]
            out.append((idx, 1, done))
        yield out
