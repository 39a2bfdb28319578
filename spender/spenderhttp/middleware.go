package spenderhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// statusClientClosed is nginx's "client closed request" status.
const statusClientClosed = 499

// Reserver is what the middleware needs of a limiter: the standalone
// *spender.Limiter and the leased one both satisfy it.
type Reserver interface {
	Reserve(ctx context.Context, key string, lim ration.Limits, c ration.Amount) (spender.Reservation, error)
}

// Middleware returns the rate-limit stage of an OpenAI-compatible proxy
// chain. It must run after authentication (which calls WithPrincipal) and
// before the handler that calls the upstream. For each request:
//
//  1. No Principal in the context: the request passes through untouched,
//     with no headers and no limit.
//  2. The body is read as it arrives, up to WithMaxBodyBytes (16 MiB by
//     default); a larger one is answered 413 and reserves nothing. Memory
//     is taken only for bytes received, never from the declared
//     Content-Length, and counts against WithMaxBodyBytesInFlight (256 MiB
//     by default, shared by every handler of this Middleware): a body that
//     would exceed it is answered 503 server_overloaded with Retry-After: 1.
//     A body cut by a read deadline (the server's ReadTimeout) is answered
//     408 and the connection closed. A negative
//     max_tokens, max_completion_tokens or max_output_tokens is answered
//     400 invalid_request_error. Malformed JSON is not an error here: it is
//     estimated from its bytes and passed on for the upstream to answer.
//  3. EstimateCost with counter (nil: bytes/4), then Reserve on the key
//     Principal.KeyID with Principal.Limits. A *spender.RejectError becomes
//     429 with the x-ratelimit-* headers, Retry-After and the OpenAI error
//     body; a cost that can never fit gets its own message and no
//     Retry-After. A validation error (an empty or overlong key, invalid
//     limits) becomes a 4xx in the same shape, never a 500.
//  4. The headers are computed from the reservation's Status and set before
//     the handler runs; they are set again when the handler writes its
//     status, replacing any an upstream sent.
//  5. For a streaming chat or completions request that did not ask for
//     usage, "stream_options": {"include_usage": true} is added to the
//     forwarded body and the usage-only final chunk is not forwarded. With
//     WithBoundedOverrun a missing max_tokens is injected too.
//  6. The handler runs with the (possibly rewritten) body; SSE responses
//     are forwarded event by event and flushed after each.
//  7. The reservation is settled exactly once: a stream that reported
//     usage is settled with it at its "[DONE]" event, before that event is
//     forwarded (so a client that sends its next request as soon as the
//     stream ends sees it settled); otherwise when the handler returns (or
//     panics): with the usage the upstream reported (JSON usage, or the
//     final SSE chunk's); else Cancel if the status is 5xx (our outages
//     are free) or the handler panicked before writing; else 1 request and
//     0 tokens for a
//     4xx; else the prompt estimate plus the generated text seen at
//     ceil(bytes/4), the fallback for a client that disconnected or an
//     upstream that reports no usage.
//
// The returned handler is safe for concurrent use. The Reserver, the
// Counter and the handler decide how much of the request context they
// honour; the middleware itself never blocks on anything but them.
func Middleware(l Reserver, counter Counter, opts ...Option) func(http.Handler) http.Handler {
	cfg := newConfig(opts)
	// One budget for every handler this Middleware wraps.
	budget := &bodyBudget{max: cfg.maxInFlight}
	return func(next http.Handler) http.Handler {
		return &stage{cfg: cfg, l: l, counter: counter, messages: isMessageCounter(counter), next: next, budget: budget}
	}
}

// stage is the handler Middleware returns; it holds no per-request state.
type stage struct {
	cfg      config
	budget   *bodyBudget // nil: no cap on body bytes in flight
	l        Reserver
	counter  Counter
	messages bool // counter is a MessageCounter: parse the chat messages for it
	next     http.Handler
}

func (s *stage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, ok := PrincipalFrom(r.Context())
	if !ok {
		s.next.ServeHTTP(w, r)
		return
	}
	ctx := r.Context()
	log := s.cfg.logger

	body, held, tooLarge, err := readBody(r, s.cfg.maxBody, s.budget)
	defer s.budget.release(held)
	switch {
	case errors.Is(err, errBodyBudget):
		log.LogAttrs(ctx, slog.LevelWarn, "spenderhttp: body bytes in flight at the cap", slog.String("key", p.KeyID), slog.Int64("max_in_flight", s.cfg.maxInFlight))
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, typeServer, codeOverloaded, "",
			"The server is receiving too many request bodies at once. Please try again in 1s (Retry-After: 1 seconds).")
		return
	case tooLarge:
		log.LogAttrs(ctx, slog.LevelInfo, "spenderhttp: body over the cap", slog.String("key", p.KeyID), slog.Int64("max_bytes", s.cfg.maxBody))
		writeError(w, http.StatusRequestEntityTooLarge, typeInvalidRequest, codeTooLarge, "",
			"Request body too large: the limit is "+strconv.FormatInt(s.cfg.maxBody, 10)+" bytes.")
		return
	case err != nil && isTimeout(err):
		log.LogAttrs(ctx, slog.LevelInfo, "spenderhttp: body too slow", slog.String("key", p.KeyID), slog.Any("err", err))
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusRequestTimeout, typeInvalidRequest, codeBodyTimeout, "", "The request body did not arrive in time.")
		return
	case err != nil:
		log.LogAttrs(ctx, slog.LevelInfo, "spenderhttp: reading the body", slog.String("key", p.KeyID), slog.Any("err", err))
		writeError(w, http.StatusBadRequest, typeInvalidRequest, codeUnreadableBody, "", "Could not read the request body.")
		return
	}

	req, err := parseRequest(body, s.messages)
	var neg *negativeMaxError
	if errors.As(err, &neg) {
		writeError(w, http.StatusBadRequest, typeInvalidRequest, codeInvalidValue, neg.field,
			"Invalid '"+neg.field+"': "+strconv.FormatInt(neg.value, 10)+" is below the minimum value of 0.")
		return
	}
	defaultCompletion := int64(DefaultCompletionTokens)
	if s.cfg.overrun && s.cfg.overrunMax > 0 {
		defaultCompletion = s.cfg.overrunMax
	}
	est := estimate(ctx, s.counter, body, req, defaultCompletion)

	if m := p.Models[req.model]; len(m) > 0 {
		p.Budgets = append(p.Budgets[:len(p.Budgets):len(p.Budgets)], m...) // a copy: p is shared by requests
	}
	res, err := s.reserve(ctx, p, est)
	if err != nil {
		s.reject(w, r, p, err)
		return
	}
	s.cfg.decided(ctx, Decision{Admitted: true})
	views := res.views()
	// The completion may use what every budget that counts it has left.
	out, _ := tightest(views, func(v *budgetView) bool { return v.meter != InputTokens }, tokensOf)

	// Rewrite the body when the stage needs to: usage for streams, a max
	// for bounded overrun.
	fields := s.injections(req, est, out)
	r2 := r
	if len(fields) > 0 {
		if nb, err := rewriteBody(body, fields); err == nil {
			body = nb
			r2 = r.Clone(ctx)
			if r2.Header.Get("Content-Length") != "" {
				r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
			}
		} else {
			log.LogAttrs(ctx, slog.LevelWarn, "spenderhttp: body rewrite failed", slog.String("key", p.KeyID), slog.Any("err", err))
			fields = nil
		}
	}
	if r2 == r {
		r2 = new(http.Request)
		*r2 = *r
	}
	setBody(r2, body)

	hdrs := s.cfg.headerSetOf(views)
	hdrs.apply(w.Header())
	rec := &recorder{
		w:         w,
		rc:        http.NewResponseController(w),
		hdrs:      hdrs,
		dropUsage: fields["stream_options"] != nil,
		res:       res,
	}
	returned := false
	defer func() { s.settle(ctx, p, res, rec, est, returned) }()
	s.next.ServeHTTP(rec, r2)
	rec.finish()
	returned = true
}

// settle ends the reservation once the handler is done; see Middleware,
// step 7.
//
// A handler that panics after writing a 2xx status (httputil.ReverseProxy
// aborts with http.ErrAbortHandler when a stream breaks, on either side)
// is settled like one that returned: the client may have read the output.
// One that panics before writing anything is cancelled.
func (s *stage) settle(ctx context.Context, p Principal, res *hold, rec *recorder, est estimateResult, returned bool) {
	switch {
	case rec.settled:
		// Settled with the stream's usage at its end (see recorder).
	case rec.usage != nil:
		res.settle(rec.usage.spent())
	case rec.code >= 500 || (rec.code == 0 && !returned):
		res.cancel()
	case rec.code >= 400:
		res.settle(spent{requests: 1})
	default:
		used := spentOf(1, est.prompt, ceilQuarter(rec.outBytes))
		s.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "spenderhttp: no usage reported; settling the estimate",
			slog.String("key", p.KeyID), slog.Int64("tokens", used.total), slog.Int("status", rec.code))
		res.settle(used)
	}
}

// reject answers a Reserve error without reserving anything.
func (s *stage) reject(w http.ResponseWriter, r *http.Request, p Principal, err error) {
	ctx := r.Context()
	log := s.cfg.logger
	var re *spender.RejectError
	switch {
	case errors.As(err, &re):
		b := refOf(p, re.Key)
		s.cfg.headerSetOf([]budgetView{{budgetRef: b, st: re.Status}}).apply(w.Header())
		if re.Oversize {
			// Retrying cannot help: tell the OpenAI SDKs, which otherwise
			// retry a 429 even without Retry-After.
			w.Header()["X-Should-Retry"] = []string{"false"}
		} else {
			w.Header()[hdrRetryAfter] = []string{strconv.Itoa(spender.RetryAfterSeconds(re.RetryAfter))}
		}
		log.LogAttrs(ctx, slog.LevelDebug, "spenderhttp: rejected", slog.String("key", p.KeyID), slog.String("budget", b.key),
			slog.String("dimension", re.Dimension.String()), slog.Bool("oversize", re.Oversize),
			slog.Duration("retry_after", re.RetryAfter))
		s.cfg.decided(ctx, Decision{Budget: b.key, Dimension: re.Dimension})
		writeError(w, http.StatusTooManyRequests, typeRateLimit, codeRateLimited, "", rejectMessage(re, b))
	case errors.Is(err, spender.ErrInvalidKey):
		log.LogAttrs(ctx, slog.LevelWarn, "spenderhttp: principal has an invalid key ID", slog.Int("key_len", len(p.KeyID)), slog.Any("err", err))
		writeError(w, http.StatusUnauthorized, typeInvalidRequest, codeInvalidAPIKey, "",
			"The API key could not be used for rate limiting: its ID is empty, too long or not valid UTF-8.")
	case errors.Is(err, ration.ErrInvalidLimits):
		log.LogAttrs(ctx, slog.LevelWarn, "spenderhttp: principal has invalid limits", slog.String("key", p.KeyID), slog.Any("err", err))
		writeError(w, http.StatusForbidden, typeInvalidRequest, codeInvalidLimits, "",
			"The API key's rate limits are misconfigured; ask the administrator to fix them.")
	case errors.Is(err, spender.ErrKeyRejected):
		log.LogAttrs(ctx, slog.LevelWarn, "spenderhttp: the allocator rejected the key", slog.String("key", p.KeyID), slog.Any("err", err))
		writeError(w, http.StatusForbidden, typeInvalidRequest, codeInvalidLimits, "",
			"The API key's rate limits were refused by the rate limiter; ask the administrator to fix them.")
	case errors.Is(err, spender.ErrInvalidCost):
		writeError(w, http.StatusBadRequest, typeInvalidRequest, codeInvalidValue, "",
			"The request's cost could not be estimated.")
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		// The client is gone; nobody reads an answer. 499 is the de facto
		// "client closed request" status, so access logs do not show 200.
		log.LogAttrs(ctx, slog.LevelDebug, "spenderhttp: client left during Reserve", slog.String("key", p.KeyID))
		w.WriteHeader(statusClientClosed)
	default:
		log.LogAttrs(ctx, slog.LevelError, "spenderhttp: reserve failed", slog.String("key", p.KeyID), slog.Any("err", err))
		writeError(w, http.StatusServiceUnavailable, typeServer, codeLimiterUnusable, "",
			"The rate limiter is unavailable; try again shortly.")
	}
}

// injections returns the top-level fields the stage adds to the forwarded
// body, or nil.
func (s *stage) injections(req request, est estimateResult, out dimState) map[string]json.RawMessage {
	if !req.valid || !req.chatLike {
		return nil
	}
	var fields map[string]json.RawMessage
	if req.stream && !req.includeUsage {
		fields = map[string]json.RawMessage{"stream_options": json.RawMessage(`{"include_usage":true}`)}
	}
	if s.cfg.overrun && req.maxField == "" && out.limit > 0 {
		perChoice := s.cfg.overrunMax
		if perChoice == 0 {
			perChoice = satAdd(est.completion, max(out.remaining, 0)) / req.choices
		}
		if fields == nil {
			fields = make(map[string]json.RawMessage, 1)
		}
		fields["max_tokens"] = strconv.AppendInt(nil, max(perChoice, 1), 10)
	}
	return fields
}

// rewriteBody sets fields at the top level of the JSON object body. An
// existing stream_options object is merged: include_usage is set and its
// other members kept. Keys come out sorted; values are kept byte for byte.
func rewriteBody(body []byte, fields map[string]json.RawMessage) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	for k, v := range fields {
		if k == "stream_options" {
			var so map[string]json.RawMessage
			if old := m[k]; len(old) > 0 && old[0] == '{' && json.Unmarshal(old, &so) == nil {
				so["include_usage"] = json.RawMessage("true")
				b, err := json.Marshal(so)
				if err != nil {
					return nil, err
				}
				v = b
			}
		}
		m[k] = v
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// errBodyBudget is readBody's error when the stage's cap on body bytes in
// flight (WithMaxBodyBytesInFlight) is reached.
var errBodyBudget = errors.New("spenderhttp: body bytes in flight at the cap")

// minBodyChunk is the first buffer readBody allocates for a body of
// unknown or larger declared length.
const minBodyChunk = 4 << 10

// readBody reads r's body up to limit bytes and reports whether it was
// larger. A declared Content-Length above limit is refused unread. The
// buffer grows only as bytes arrive (doubling, from minBodyChunk or a
// smaller declared length), never past minBodyChunk on the declared
// length alone, so memory follows what the client has sent;
// each buffer is charged to b in full before it is allocated (the smaller
// ones it replaces stay in memory until the collector frees them, so a
// body of n bytes is charged about 2n), and errBodyBudget comes back when
// b is full. The caller releases the returned held bytes from b when it is
// done with the body.
func readBody(r *http.Request, limit int64, b *bodyBudget) (body []byte, held int64, tooLarge bool, err error) {
	if r.ContentLength > limit {
		return nil, 0, true, nil
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0, false, nil
	}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return nil, held, true, nil
			}
			// Grow to at most limit+1: one byte past the cap tells a body
			// over it from one exactly at it. A declared length under
			// minBodyChunk sizes the first buffer (plus the byte that
			// reads the end): most requests are that small.
			first := int64(minBodyChunk)
			if r.ContentLength > 0 && r.ContentLength < minBodyChunk {
				first = r.ContentLength + 1
			}
			next := min(max(2*int64(cap(buf)), first), limit+1)
			if !b.acquire(next) {
				return nil, held, false, errBodyBudget
			}
			held += next
			nb := make([]byte, len(buf), next)
			copy(nb, buf)
			buf = nb
		}
		n, rerr := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, held, false, rerr
		}
	}
	if int64(len(buf)) > limit {
		return nil, held, true, nil
	}
	return buf, held, false, nil
}

// bodyBudget caps the body bytes a stage holds at once (buffer capacity,
// charged as it grows). A nil *bodyBudget has no cap.
type bodyBudget struct {
	max  int64
	used atomic.Int64
}

// acquire charges n bytes if they fit under the cap.
func (b *bodyBudget) acquire(n int64) bool {
	if b == nil {
		return true
	}
	for {
		cur := b.used.Load()
		if cur+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// release returns n bytes charged by acquire.
func (b *bodyBudget) release(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
	}
}

// isTimeout reports whether err is a read deadline passing (the server's
// ReadTimeout, or a deadline set through http.ResponseController).
func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// setBody makes body the request's body, replayable through GetBody.
func setBody(r *http.Request, body []byte) {
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body, r.GetBody = http.NoBody, nil
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}
