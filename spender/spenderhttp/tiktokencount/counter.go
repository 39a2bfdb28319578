package tiktokencount

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/rationhq/ration/spender/spenderhttp"
)

// The encodings a Counter knows, by tiktoken's names.
const (
	CL100KBase = "cl100k_base"
	O200KBase  = "o200k_base"
)

// The chat format's overhead, as OpenAI's cookbook "How to count tokens
// with tiktoken" counts it (num_tokens_from_messages) for gpt-3.5-turbo,
// gpt-4 and gpt-4o, checked there against the API's usage.prompt_tokens
// (129 tokens for its example conversation on gpt-3.5-turbo and gpt-4,
// 124 on gpt-4o and gpt-4o-mini; TestCookbookExample reproduces both).
// The cookbook publishes no numbers for newer models (gpt-4.1, gpt-5, the
// o-series); CountMessages uses the same ones for every model it knows.
const (
	// TokensPerMessage frames every message: the cookbook's
	// "<|start|>{role/name}\n{content}<|end|>\n" costs 3 tokens besides
	// the role's and the content's own, which are encoded and counted.
	TokensPerMessage = 3
	// TokensPerName is added for a message with a name, on top of the
	// name's own tokens.
	TokensPerName = 1
	// ReplyPriming is added once per request: "every reply is primed with
	// <|start|>assistant<|message|>".
	ReplyPriming = 3
)

// Bounds on the work a count may do. Past either, the text goes to the
// Counter's next counter (or, without one, the estimate's bytes/4).
const (
	// MaxBytes is the most text one count encodes in-process: the sum of
	// the texts of one CountTokens or CountMessages call. A core counts
	// over 80 MB/s of ASCII prose but only 2-6 MB/s of text with other
	// characters (the pattern's engine) or of runs at MaxRunBytes
	// (BenchmarkCountText, docs/performance.md), so 256 KiB takes at most
	// about 0.1 s.
	MaxBytes = 256 << 10
	// MaxRunBytes is the longest run of letters, of whitespace or of other
	// non-digit characters a text may hold. BPE merging is quadratic in
	// the length of a piece the encoding's pattern splits off, and such a
	// run becomes one piece (a 16 KB run of one letter takes 0.1-0.2 s);
	// with every run at most 512 bytes no piece exceeds about 1 KiB.
	MaxRunBytes = 512
)

var (
	// ErrUnknownModel is returned for a model the table does not map to
	// an encoding, when the Counter has no next counter.
	ErrUnknownModel = errors.New("tiktokencount: no OpenAI encoding known for the model")
	// ErrTooLarge is returned for text over MaxBytes or with a run over
	// MaxRunBytes, when the Counter has no next counter.
	ErrTooLarge = errors.New("tiktokencount: text too large to count in-process")
)

// modelPrefixes maps model-name prefixes to encodings; EncodingForModel
// takes the longest that matches. It is never written. The table and the
// reasons for it are in docs/http.md, "In-process counts for OpenAI
// models".
var modelPrefixes = [...]struct{ prefix, encoding string }{
	{"gpt-4o", O200KBase},
	{"gpt-4.1", O200KBase},
	{"gpt-4.5", O200KBase},
	{"gpt-5", O200KBase},
	{"o1", O200KBase},
	{"o3", O200KBase},
	{"o4", O200KBase},
	{"chatgpt-4o", O200KBase},
	{"gpt-4", CL100KBase},
	{"gpt-3.5", CL100KBase},
	{"text-embedding-3", CL100KBase},
	{"text-embedding-ada-002", CL100KBase},
}

// EncodingForModel returns the encoding a Counter uses for model, by the
// longest matching prefix of the table (case-sensitive, as the API's
// model names are), or "" for a model it does not know.
func EncodingForModel(model string) string {
	best, enc := 0, ""
	for _, p := range modelPrefixes {
		if len(p.prefix) > best && strings.HasPrefix(model, p.prefix) {
			best, enc = len(p.prefix), p.encoding
		}
	}
	return enc
}

func (e *encoding) countRole(role string) int64 {
	if n, ok := e.roles[role]; ok {
		return n
	}
	return e.count(role)
}

// guard turns a panic while counting (in regexp2, say) into an error, so
// that a client's text can never take the limit stage down: the count
// then goes to the next counter (or bytes/4). No input is known to panic
// (FuzzCountTokens).
func (e *encoding) guard(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("tiktokencount: %s panicked: %v", e.name, r)
	}
}

// encodings loads each encoding once, on first use.
type encodings struct {
	cl100k, o200k func() (*encoding, error)
}

func newEncodings() *encodings {
	return &encodings{cl100k: lazyEncoding(CL100KBase), o200k: lazyEncoding(O200KBase)}
}

func lazyEncoding(name string) func() (*encoding, error) {
	return sync.OnceValues(func() (*encoding, error) { return loadEncoding(name) })
}

func (es *encodings) get(name string) (*encoding, error) {
	switch name {
	case CL100KBase:
		return es.cl100k()
	case O200KBase:
		return es.o200k()
	}
	return nil, fmt.Errorf("tiktokencount: unknown encoding %q", name)
}

// Counter counts prompt tokens in-process with OpenAI's tiktoken
// encodings, for the models EncodingForModel knows, and hands every other
// model, and texts over the bounds (MaxBytes, MaxRunBytes), to its next
// counter. It implements spenderhttp.MessageCounter, so a chat request's
// messages are counted with the chat format's overhead.
//
// A Counter loads each encoding on its first use and keeps it; share one
// (or Counters made from it by WithNext) rather than making one per
// request. It is safe for concurrent use.
type Counter struct {
	next spenderhttp.Counter
	encs *encodings
}

var _ spenderhttp.MessageCounter = (*Counter)(nil)

// New returns a Counter that hands what it does not count to next: the
// engine's spenderhttp.TokenizeCounter, say. With next nil it returns
// ErrUnknownModel or ErrTooLarge instead, and the estimate counts
// ceil(bytes/4).
func New(next spenderhttp.Counter) *Counter {
	return &Counter{next: next, encs: newEncodings()}
}

// WithNext returns a Counter that shares c's encodings (loaded once for
// both) and hands what it does not count to next instead.
func (c *Counter) WithNext(next spenderhttp.Counter) *Counter {
	return &Counter{next: next, encs: c.encs}
}

// CountTokens implements spenderhttp.Counter: the tokens text encodes to
// in model's encoding.
func (c *Counter) CountTokens(ctx context.Context, model, text string) (int64, error) {
	name := EncodingForModel(model)
	if name == "" {
		return c.pass(ctx, model, text, ErrUnknownModel)
	}
	if len(text) > MaxBytes || longestRun(text) > MaxRunBytes {
		return c.pass(ctx, model, text, ErrTooLarge)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	enc, err := c.encs.get(name)
	if err != nil {
		return c.pass(ctx, model, text, err)
	}
	n, err := enc.countText(text)
	if err != nil {
		return c.pass(ctx, model, text, err)
	}
	return n, nil
}

func (e *encoding) countText(text string) (_ int64, err error) {
	defer e.guard(&err)
	return e.count(text), nil
}

// pass hands text to the next counter, or returns err without one.
func (c *Counter) pass(ctx context.Context, model, text string, err error) (int64, error) {
	if c.next == nil {
		return 0, err
	}
	return c.next.CountTokens(ctx, model, text)
}

// CountMessages implements spenderhttp.MessageCounter: msgs as the chat
// format encodes them, ReplyPriming plus, for each message,
// TokensPerMessage, its role's and content's tokens and, if it has a
// name, the name's tokens plus TokensPerName.
//
// For a model it does not know, or messages over the bounds, it asks the
// next counter's CountMessages if that is a MessageCounter, and otherwise
// fails (ErrUnknownModel, ErrTooLarge): the estimate then counts the
// joined text with CountTokens, which goes to the next counter.
func (c *Counter) CountMessages(ctx context.Context, model string, msgs []spenderhttp.ChatMessage) (int64, error) {
	name := EncodingForModel(model)
	if name == "" {
		return c.passMessages(ctx, model, msgs, ErrUnknownModel)
	}
	size := 0
	for _, m := range msgs {
		size += len(m.Role) + len(m.Name) + len(m.Content)
		if size > MaxBytes || longestRun(m.Content) > MaxRunBytes || longestRun(m.Name) > MaxRunBytes || longestRun(m.Role) > MaxRunBytes {
			return c.passMessages(ctx, model, msgs, ErrTooLarge)
		}
	}
	enc, err := c.encs.get(name)
	if err != nil {
		return c.passMessages(ctx, model, msgs, err)
	}
	n, err := enc.countMessages(ctx, msgs)
	switch {
	case err == nil:
		return n, nil
	case ctx.Err() != nil:
		return 0, err
	}
	return c.passMessages(ctx, model, msgs, err)
}

func (e *encoding) countMessages(ctx context.Context, msgs []spenderhttp.ChatMessage) (_ int64, err error) {
	defer e.guard(&err)
	n := int64(ReplyPriming)
	for _, m := range msgs {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		n += TokensPerMessage + e.countRole(m.Role) + e.count(m.Content)
		if m.Name != "" {
			n += e.count(m.Name) + TokensPerName
		}
	}
	return n, nil
}

func (c *Counter) passMessages(ctx context.Context, model string, msgs []spenderhttp.ChatMessage, err error) (int64, error) {
	if mc, ok := c.next.(spenderhttp.MessageCounter); ok {
		return mc.CountMessages(ctx, model, msgs)
	}
	return 0, err
}

// Character classes for longestRun.
const (
	classOther = iota
	classLetter
	classSpace
	classDigit
)

func classOf(r rune) int {
	if r < utf8.RuneSelf {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
			return classLetter
		case '0' <= r && r <= '9':
			return classDigit
		case r == ' ', '\t' <= r && r <= '\r':
			return classSpace
		}
		return classOther
	}
	switch {
	case unicode.IsLetter(r), unicode.IsMark(r):
		return classLetter
	case unicode.IsNumber(r):
		return classDigit
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

// longestRun returns the length in bytes of s's longest run of
// characters of one class (letters and marks, whitespace, other), digits
// excepted: OpenAI's encodings split digits into pieces of at most 3. A
// piece of cl100k_base's or o200k_base's pattern lies within one such run
// plus one leading character, or, for punctuation followed by line
// breaks, two adjacent runs; so no piece is longer than 2*longestRun+1.
func longestRun(s string) int {
	longest, run, prev := 0, 0, -1
	for i := 0; i < len(s); {
		r, size := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRuneInString(s[i:])
		}
		i += size
		cl := classOf(r)
		switch {
		case cl == classDigit:
			run = 0
		case cl == prev:
			run += size
		default:
			run = size
		}
		prev = cl
		longest = max(longest, run)
	}
	return longest
}
