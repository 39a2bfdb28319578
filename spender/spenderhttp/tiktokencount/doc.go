// Package tiktokencount counts prompt tokens for OpenAI's models in the
// gateway's own process, with OpenAI's tiktoken encodings (cl100k_base,
// o200k_base), so that the limit stage (spenderhttp.Middleware) reserves
// an exact input count without a round trip to the engine's /v1/tokenize.
//
//	counter := tiktokencount.New(spenderhttp.TokenizeCounter{BaseURL: engine}) // or New(nil): bytes/4
//	chain := auth(spenderhttp.Middleware(limiter, counter)(proxy))
//
// A Counter picks the encoding by model name (EncodingForModel, the table
// in docs/http.md), counts a chat request's messages the way OpenAI's
// cookbook "How to count tokens with tiktoken" does (TokensPerMessage,
// TokensPerName, ReplyPriming) and plain prompt and input strings as
// they are, and hands every model it does not know to its next counter.
// The encodings' BPE files are the ones github.com/pkoukk/tiktoken-go-loader
// embeds: no network, ever. Text is split by the encoding's pattern as
// OpenAI's tiktoken splits it (with github.com/dlclark/regexp2, or, for
// text that is all ASCII, by hand-written splitters that cut where the
// patterns do) and each piece is byte-pair merged as tiktoken merges it;
// the counts equal github.com/pkoukk/tiktoken-go's
// (TestCountsMatchTiktokenGo, TestASCIISplit).
//
// # Why a package of its own
//
// Go links only the packages a program imports, so this package is the
// whole cost of the dependency: a gateway that does not import it links
// neither regexp2 nor the loader's embedded BPE files (7 MB: the loader
// embeds p50k_base and r50k_base too; the demo gateway's binary is
// 24.8 MB with them). spenderhttp itself only defines the interface this
// package implements (MessageCounter), so avoiding the dependency costs a
// user nothing but not importing it.
//
// # What an encoding costs
//
// Each encoding loads on a Counter's first count for a model that uses
// it, once (sync.OnceValues), whatever the concurrency; counts wait for
// the load. Measured by TestEncodingCost (docs/performance.md, "In-process
// token counts"), each in a fresh process:
//
//	encoding      first count (the load)   heap kept
//	cl100k_base   0.06-0.08 s              4 MiB
//	o200k_base    0.11-0.14 s              8 MiB
//
// A second Counter made by New loads again and keeps as much more;
// Counters made by WithNext share their parent's encodings, so make one
// with New per process. After the load, the estimate of a short chat
// request takes 3-5 µs, against 2.5-3.5 µs for bytes/4 and ~80 µs through
// an engine's /v1/tokenize on loopback (BenchmarkEstimate); text counts at
// over 80 MB/s of ASCII prose, 2-6 MB/s of text with other characters
// and of the longest runs the bounds let through (BenchmarkCountText).
//
// # Bounds
//
// Text over MaxBytes per call, or with a run of one kind of character
// over MaxRunBytes (BPE is quadratic in such a run), is not encoded here
// but handed to the next counter, so that no request makes the gateway
// spend more than about 0.1 s of CPU counting. A panic while counting
// (none is known: FuzzCountTokens) becomes an error, and the count goes
// to the next counter too. The regexp2 engine keeps, per concurrent
// matcher, the runes of the last non-ASCII text it scanned (4 bytes per
// character): at most 1 MiB per matcher under MaxBytes.
//
// # Caveats
//
//   - The chat overhead numbers are the cookbook's for gpt-3.5-turbo,
//     gpt-4 and gpt-4o, verified there against the API; newer models
//     (gpt-4.1, gpt-5, the o-series) use the same numbers unverified.
//   - Tool definitions, tool calls' arguments, images and audio are not
//     counted (as in spenderhttp.PromptText); settlement with the
//     engine's usage corrects the estimate.
//   - Responses API input items are counted as their text, without chat
//     overhead.
//   - Model names match case-sensitively and without provider prefixes:
//     "openai/gpt-4o" or "GPT-4o" go to the next counter.
package tiktokencount
