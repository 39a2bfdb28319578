// Package gateway is an OpenAI-compatible gateway built around ration's
// limit stage: bearer API keys from a keys file, spenderhttp.Middleware,
// and a reverse proxy to an inference engine that streams without
// buffering. cmd/gateway-demo runs several of these in one process; a
// gateway author can mount one New per listener.
//
// The chain for /v1/ requests, outermost first:
//
//  1. metrics (ration_gateway_*: requests by route and code, latency,
//     in flight, auth failures, upstream errors)
//  2. Authenticate: "Authorization: Bearer <key>" looked up in the keys
//     in force (a Keyring, or a LiveKeys a KeysReloader keeps in step
//     with the keys file); missing or unknown is 401 in the OpenAI error
//     shape
//  3. POST only: spenderhttp.Middleware on the key's ID and limits
//     (429 with Retry-After, x-ratelimit-* headers, settlement with the
//     actual usage); GET (e.g. /v1/models) is authenticated but not
//     counted
//  4. the reverse proxy to the upstream
//
// # Guarantees
//
//   - A client's mistake never becomes a 500: bad keys are 401, bad
//     bodies get the limit stage's 400/413, and what passes on is
//     answered by the upstream. An unreachable upstream is 502 (and the
//     reservation is cancelled: outages are free).
//   - The client's API key is never forwarded upstream, logged or echoed.
//   - SSE responses reach the client event by event: the proxy flushes
//     every write and every wrapper implements Unwrap for
//     http.ResponseController.
//   - Each Gateway has its own Prometheus registry unless WithRegistry
//     shares one; nothing is registered globally.
//
// # Caveats
//
//   - Keys given as a *Keyring are fixed. Given as a *LiveKeys, a
//     KeysReloader swaps them when the keys file changes or on SIGHUP
//     (KeysReloader.Run): all or nothing, one atomic swap, requests in
//     flight keep the keys they started with.
//   - Accept-Encoding is forced to identity towards the upstream, so the
//     limit stage can read usage; responses are not compressed.
//   - Only Bearer auth is read (not x-api-key or api-key headers).
//   - The budget is whatever the limiter enforces: a standalone
//     *spender.Limiter per instance gives each instance the whole limit;
//     a leased one shares the key's global budget.
package gateway
