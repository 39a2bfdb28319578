// Package spenderhttp is ration's HTTP stage: the middleware a gateway
// author puts into an OpenAI-compatible proxy chain to enforce each API
// key's requests-per-minute and tokens-per-minute budgets, plus the pieces
// it is made of (cost estimation, prompt extraction, the tokenizer client,
// the rate-limit headers).
//
// It depends on a Reserver, not on a concrete limiter, so it runs
// unchanged on the standalone *spender.Limiter and on the leased one.
//
// # Guarantees
//
//   - Budgets are per Principal.KeyID, never per tenant.
//   - A request without a Principal passes through untouched: no body
//     read, no headers, no limit.
//   - Every reservation ends exactly once, in Settle or Cancel, also when
//     the handler panics (the panic then propagates).
//   - Every response to an admitted or rate-limited request carries the
//     x-ratelimit-* headers of the key's limited dimensions, computed at
//     reservation time; an upstream's own x-ratelimit-* values are replaced.
//   - A 429 carries Retry-After (whole seconds, rounded up, at least 1)
//     unless the cost can never fit, and the OpenAI error body.
//   - A 5xx without usage is cancelled: clients do not pay for outages.
//   - SSE responses go out event by event (flushed through
//     http.ResponseController); the recorder implements Unwrap.
//   - Nothing the client sends makes the stage panic or answer 500: bodies
//     over the cap get 413 without a reservation, negative max tokens 400,
//     malformed JSON is estimated from its bytes and passed on.
//
// Time comes only from the Reserver's clock (and, for the Anthropic reset
// instants, WithClock). The package has no mutable package-level state.
//
// # Caveats
//
//   - The estimate counts the prompt text only: the chat template's few
//     tokens per message (unless the Counter is a MessageCounter, such as
//     package tiktokencount's), tool definitions and images are left out,
//     and a request without a max reserves DefaultCompletionTokens (256)
//     per choice. Settlement with the actual usage corrects both; an overrun
//     becomes debt unless WithBoundedOverrun caps the output.
//   - When no usage comes back (client disconnected, upstream silent) the
//     key is charged the prompt estimate plus the generated text seen, at
//     ceil(bytes/4); for a non-SSE answer, all of its body bytes count.
//   - An upstream 4xx without usage is charged 1 request and 0 tokens.
//   - For streams that did not ask for usage, stream_options.include_usage
//     is injected; other chunks then carry "usage":null, which the client
//     sees (OpenAI-compatible clients ignore it). Only the usage-only
//     final chunk is withheld.
//   - The whole request body is held in memory (up to the cap) because it
//     must be read to be estimated; a rewritten body (usage or bounded
//     overrun injection) is re-encoded with sorted keys.
//   - A JSON answer's usage is read from its last top-level-looking
//     "usage" member; answers over 1 MiB keep only their last 64 KiB for
//     that.
//   - Hijack and other optional interfaces are reachable only through
//     http.ResponseController (via Unwrap), not by type assertion on the
//     ResponseWriter the handler gets.
//   - Pre-reservation errors (413, 400, invalid key or limits) carry no
//     x-ratelimit-* headers: no budget was consulted.
package spenderhttp
