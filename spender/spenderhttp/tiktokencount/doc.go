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
// The encoding is github.com/pkoukk/tiktoken-go's, its BPE files embedded
// by github.com/pkoukk/tiktoken-go-loader: no network, ever.
//
// # Why a package of its own
//
// Go links only the packages a program imports, so this package is the
// whole cost of the dependency: a gateway that does not import it links
// neither tiktoken-go, its regexp2 engine, nor the loader's embedded BPE
// files (7 MB: the loader embeds p50k_base and r50k_base too). The demo
// gateway's binary grows from 16.1 to 23.6 MB with it. spenderhttp itself
// only defines the interface this package implements (MessageCounter),
// so avoiding the dependency costs a user nothing but not importing it.
//
// # What an encoding costs
//
// Each encoding loads on a Counter's first count for a model that uses
// it, once (sync.OnceValues), whatever the concurrency; counts wait for
// the load. Measured by TestEncodingCost (docs/performance.md, "In-process
// token counts"), each in a fresh process:
//
//	encoding      first count (the load)   heap kept   RSS added
//	cl100k_base   0.21-0.28 s              12 MiB      15-18 MiB
//	o200k_base    0.41-0.50 s              24 MiB      31-37 MiB
//
// (o200k_base took 1.06 s once, loaded right after cl100k_base on a
// busy machine.) A second Counter made by New loads again: tiktoken-go
// keeps the parsed ranks, but the Counter builds its own decoder and
// pattern, 5-6 MiB and 0.07-0.4 s (cl100k_base) or 12-13 MiB and 0.2-0.3 s
// (o200k_base) more. Counters made by WithNext share their parent's
// encodings, so make one with New per process. After the load, the
// estimate of a short chat request takes 20-35 µs (BenchmarkEstimate),
// against ~100 µs through an engine's /v1/tokenize on loopback, and text
// counts at 1.5-2.7 MB/s (BenchmarkCountText).
//
// # State outside our values
//
// tiktoken-go holds its BPE loader in a package variable that every load
// reads without a lock, and its default loader downloads the files. The
// first load by any Counter installs the embedded offline loader, once,
// under a sync.Once: that is the only package-level state here. It
// replaces the loader for the whole process, so a program that uses
// tiktoken-go itself gets the embedded files too, and one that installs
// its own loader concurrently with a Counter's first load races with it.
//
// # Bounds
//
// Text over MaxBytes per call, or with a run of one kind of character
// over MaxRunBytes (BPE is quadratic in such a run), is not encoded here
// but handed to the next counter, so that no request makes the gateway
// spend more than about 0.2 s of CPU counting. A panic inside tiktoken-go
// (none is known: FuzzCountTokens) becomes an error, and the count goes
// to the next counter too. tiktoken-go's regexp2
// engine keeps, per concurrent matcher, the runes of the last text it
// scanned (4 bytes per character): at most 1 MiB per matcher under
// MaxBytes.
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
