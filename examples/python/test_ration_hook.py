"""Tests of ration_hook against a real sidecar at RATION_SIDECAR_URL
(.ci/run starts `sidecar -embedded` and runs `python3 -m unittest` here)."""

import asyncio
import os
import types
import unittest
import uuid

import ration_hook

URL = os.environ.get("RATION_SIDECAR_URL")


def setUpModule():
    if not URL:
        raise RuntimeError("set RATION_SIDECAR_URL to a running sidecar, e.g. "
                           "`go run ./cmd/sidecar -embedded` and RATION_SIDECAR_URL=http://127.0.0.1:7460")


def fresh_key():
    return "py-test-" + uuid.uuid4().hex


def remaining_tokens(sidecar, key, tpm):
    """Reserves nothing (cost 0) on key and returns its remaining tokens."""
    a = sidecar.reserve([{"key": key, "limits": {"tpm": tpm}, "cost": {}}])
    sidecar.cancel(a["reservationId"])
    return int(a["headers"]["X-Ratelimit-Remaining-Tokens"])


class SidecarTest(unittest.TestCase):
    def setUp(self):
        self.sidecar = ration_hook.Sidecar(URL)

    def test_reserve_settle(self):
        key = fresh_key()
        a = self.sidecar.reserve([{"key": key, "limits": {"rpm": 3, "tpm": 1000}, "cost": {"requests": 1, "tokens": 600}}])
        self.assertEqual(len(a["reservationId"]), 22)
        self.assertEqual(a["headers"]["X-Ratelimit-Remaining-Requests"], "2")
        self.assertEqual(a["headers"]["X-Ratelimit-Remaining-Tokens"], "400")
        self.sidecar.settle(a["reservationId"], [{"requests": 1, "tokens": 100}])
        self.assertEqual(remaining_tokens(self.sidecar, key, 1000), 900)

    def test_rate_limited(self):
        key = fresh_key()
        charge = {"key": key, "limits": {"rpm": 2}, "cost": {"requests": 1}}
        for _ in range(2):
            self.sidecar.reserve([charge])
        with self.assertRaises(ration_hook.RateLimited) as cm:
            self.sidecar.reserve([charge])
        e = cm.exception
        self.assertEqual(e.status_code, 429)
        self.assertEqual(e.budget, key)
        self.assertEqual(e.retry_after, 30)  # one request of 2 per minute
        self.assertEqual(e.headers["Retry-After"], "30")

    def test_too_large(self):
        with self.assertRaises(ration_hook.RateLimited) as cm:
            self.sidecar.reserve([{"key": fresh_key(), "limits": {"tpm": 100}, "cost": {"tokens": 101}}])
        self.assertEqual(cm.exception.decision, "DECISION_TOO_LARGE")
        self.assertIsNone(cm.exception.retry_after)
        self.assertEqual(cm.exception.headers["X-Should-Retry"], "false")

    def test_errors(self):
        with self.assertRaises(ration_hook.SidecarError) as cm:
            self.sidecar.reserve([{"key": "", "limits": {"rpm": 1}, "cost": {"requests": 1}}])
        self.assertEqual(cm.exception.code, "invalid_argument")
        with self.assertRaises(ration_hook.SidecarError) as cm:
            self.sidecar.settle("A" * 22, [{"requests": 1}])
        self.assertEqual(cm.exception.code, "not_found")


class HookTest(unittest.TestCase):
    def setUp(self):
        self.sidecar = ration_hook.Sidecar(URL)
        self.hook = ration_hook.RationHook(self.sidecar)

    def user(self, key, rpm=10, tpm=2000):
        return types.SimpleNamespace(token=key, rpm_limit=rpm, tpm_limit=tpm)

    def test_success_settles_usage(self):
        key = fresh_key()
        data = {"model": "m", "messages": [{"role": "user", "content": "hello from ration"}], "max_tokens": 100}
        data = asyncio.run(self.hook.async_pre_call_hook(self.user(key), None, data, "completion"))
        rid = data["metadata"][ration_hook.RationHook.METADATA_KEY]
        self.assertEqual(remaining_tokens(self.sidecar, key, 2000), 2000 - 105)  # 18 bytes/4 -> 5, + 100
        response = types.SimpleNamespace(usage=types.SimpleNamespace(total_tokens=12))
        kwargs = {"litellm_params": {"metadata": {ration_hook.RationHook.METADATA_KEY: rid}}}
        asyncio.run(self.hook.async_log_success_event(kwargs, response, None, None))
        self.assertEqual(remaining_tokens(self.sidecar, key, 2000), 2000 - 12)

    def test_failure_cancels(self):
        key = fresh_key()
        data = asyncio.run(self.hook.async_pre_call_hook(self.user(key), None, {"messages": []}, "completion"))
        kwargs = {"litellm_params": {"metadata": data["metadata"]}}
        asyncio.run(self.hook.async_log_failure_event(kwargs, None, None, None))
        self.assertEqual(remaining_tokens(self.sidecar, key, 2000), 2000)

    def test_refused_is_429(self):
        key = fresh_key()
        with self.assertRaises(ration_hook.RateLimited) as cm:
            for _ in range(3):
                asyncio.run(self.hook.async_pre_call_hook(self.user(key, rpm=2), None, {"messages": []}, "completion"))
        self.assertEqual(cm.exception.status_code, 429)
        self.assertEqual(cm.exception.headers["Retry-After"], "30")


if __name__ == "__main__":
    unittest.main()
