"""A client of ration's sidecar and a LiteLLM pre-call/post-call hook.

Standard library only (urllib, json): it imports without LiteLLM installed.
With LiteLLM, register the hook in the proxy's config.yaml:

    litellm_settings:
      callbacks: ration_hook.proxy_handler_instance

The hook reserves each request's budget before the call (1 request and the
prompt estimate plus max_tokens, on the key's own RPM/TPM), refuses it with
HTTP 429 and Retry-After when the budget is short, and settles the actual
usage after the call (or cancels it when the call failed). The budget is
shared with every gateway on the same ration allocator.
"""

import asyncio
import json
import os
import urllib.error
import urllib.request

try:  # the proxy's own base, when LiteLLM is installed
    from litellm.integrations.custom_logger import CustomLogger
except ImportError:  # pragma: no cover - the tests run without LiteLLM
    CustomLogger = object

try:  # LiteLLM's proxy answers a hook's HTTPException with its status and headers
    from fastapi import HTTPException as _HTTPError
except ImportError:

    class _HTTPError(Exception):
        def __init__(self, status_code, detail=None, headers=None):
            super().__init__(detail)
            self.status_code, self.detail, self.headers = status_code, detail, headers or {}


SERVICE = "/ration.sidecar.v1.ReservationService/"
DEFAULT_URL = os.environ.get("RATION_SIDECAR_URL", "http://127.0.0.1:7460")


class SidecarError(Exception):
    """An error the sidecar answered: code is the Connect code
    ("invalid_argument", "not_found", "unavailable", ...)."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class RateLimited(_HTTPError):
    """A refusal: status_code 429, headers to copy (Retry-After, x-ratelimit-*),
    retry_after in seconds (None when the request can never fit)."""

    def __init__(self, answer):
        headers = answer.get("headers", {})
        retry = headers.get("Retry-After")
        super().__init__(status_code=429, detail=answer.get("message", "rate limited"), headers=headers)
        self.decision = answer.get("decision")
        self.budget = answer.get("budget")
        self.retry_after = int(retry) if retry else None


class Sidecar:
    """Reserve, Settle and Cancel over the Connect protocol's JSON."""

    def __init__(self, base_url=DEFAULT_URL, timeout=2.0):
        self.base_url, self.timeout = base_url.rstrip("/"), timeout

    def _call(self, method, body):
        req = urllib.request.Request(
            self.base_url + SERVICE + method,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                err = json.loads(e.read())
            except ValueError:
                err = {"code": "unknown", "message": f"HTTP {e.code}"}
            raise SidecarError(err.get("code", "unknown"), err.get("message", "")) from None

    def reserve(self, charges, max_wait_ms=0):
        """Admits a request charged to every charge ({"key", "limits", "cost"}),
        all or nothing. Returns the answer (reservationId, headers,
        sendAfterMs, holdMs); raises RateLimited when refused."""
        answer = self._call("Reserve", {"charges": charges, "maxWaitMs": max_wait_ms})
        if answer.get("decision") != "DECISION_ADMITTED":
            raise RateLimited(answer)
        return answer

    def settle(self, reservation_id, usage):
        """Charges the actual usage: one {"requests", "tokens"} per charge."""
        self._call("Settle", {"reservationId": reservation_id, "usage": usage})

    def cancel(self, reservation_id):
        """Returns the whole reserved cost."""
        self._call("Cancel", {"reservationId": reservation_id})


def estimate_tokens(data):
    """Prompt bytes / 4 (rounded up) plus the completion budget: max_tokens,
    else 256. Settlement corrects it with the actual usage."""
    text = ""
    for m in data.get("messages") or []:
        content = m.get("content")
        if isinstance(content, str):
            text += content + "\n"
        elif isinstance(content, list):
            text += "\n".join(p.get("text", "") for p in content if isinstance(p, dict)) + "\n"
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        text += prompt
    completion = data.get("max_completion_tokens") or data.get("max_tokens") or 256
    return -(-len(text.encode()) // 4) + int(completion)


def _usage_tokens(response_obj):
    usage = getattr(response_obj, "usage", None)
    if usage is None and isinstance(response_obj, dict):
        usage = response_obj.get("usage")
    if usage is None:
        return None
    if isinstance(usage, dict):
        return usage.get("total_tokens")
    return getattr(usage, "total_tokens", None)


def _metadata(kwargs):
    return (kwargs.get("litellm_params") or {}).get("metadata") or kwargs.get("metadata") or {}


class RationHook(CustomLogger):
    """LiteLLM's CustomLogger hooks on ration's sidecar: the key's budget is
    the virtual key's rpm_limit and tpm_limit (0 or None: unlimited)."""

    METADATA_KEY = "ration_reservation_id"

    def __init__(self, sidecar=None):
        self.sidecar = sidecar or Sidecar()

    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        key = getattr(user_api_key_dict, "token", None) or getattr(user_api_key_dict, "api_key", None)
        if not key:
            return data
        charge = {
            "key": key,
            "limits": {
                "rpm": getattr(user_api_key_dict, "rpm_limit", None) or 0,
                "tpm": getattr(user_api_key_dict, "tpm_limit", None) or 0,
            },
            "cost": {"requests": 1, "tokens": estimate_tokens(data)},
        }
        answer = await asyncio.to_thread(self.sidecar.reserve, [charge])
        data.setdefault("metadata", {})[self.METADATA_KEY] = answer["reservationId"]
        return data

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        rid = _metadata(kwargs).get(self.METADATA_KEY)
        if not rid:
            return
        tokens = _usage_tokens(response_obj)
        if tokens is None:  # no usage reported: the estimate stands
            tokens = estimate_tokens(kwargs)
        await asyncio.to_thread(self.sidecar.settle, rid, [{"requests": 1, "tokens": int(tokens)}])

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        rid = _metadata(kwargs).get(self.METADATA_KEY)
        if rid:
            await asyncio.to_thread(self.sidecar.cancel, rid)


proxy_handler_instance = RationHook()
