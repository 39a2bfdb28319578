package spenderhttp

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/http"
)

// Capture limits, in bytes.
const (
	// jsonKeepWhole is how much of a JSON answer is kept to read its usage
	// after the fact; beyond it only the tail is kept.
	jsonKeepWhole = 1 << 20
	// jsonTail is the tail kept of a larger JSON answer: usage comes last
	// in OpenAI-compatible answers (embeddings put megabytes of vectors
	// before it).
	jsonTail = 64 << 10
	// maxPendingEvent is the longest SSE event held back while waiting for
	// its blank line; a longer one is forwarded as it is.
	maxPendingEvent = 1 << 20
)

// bodyMode is how the recorder treats the response body.
type bodyMode uint8

const (
	modeOther bodyMode = iota // counted, not parsed
	modeJSON                  // kept (whole or tail) and parsed for usage at the end
	modeSSE                   // parsed event by event, forwarded per event
)

// recorder wraps the ResponseWriter of an admitted request: it re-applies
// the budget headers when the status is written, forwards the body,
// captures the usage, and counts generated text for the no-usage fallback.
// It belongs to one request and is used by the handler's goroutine only
// (as net/http requires of a ResponseWriter).
type recorder struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	hdrs headerSet // the budget at reservation, as headers

	code      int // the status written, 0 until then
	mode      bodyMode
	dropUsage bool // the stage asked for include_usage: drop the usage-only chunk

	buf     []byte // JSON: the answer (whole, or its tail when tail is set)
	tail    bool
	pending []byte // SSE: bytes of the event not yet complete

	usage    *usage // the last usage seen, nil if none
	outBytes int64  // SSE: generated text bytes; other modes: body bytes
	writeErr error  // the first error writing to the client

	// res, when set, is settled with a stream's usage at its "[DONE]"
	// event, before that event is forwarded: a client that sends its next
	// request as soon as the stream ends then sees this one settled in its
	// headers. settled records that it was.
	res     *hold
	settled bool
}

var (
	_ http.ResponseWriter = (*recorder)(nil)
	_ http.Flusher        = (*recorder)(nil)
)

// Header returns the underlying header map.
func (r *recorder) Header() http.Header { return r.w.Header() }

// Unwrap returns the underlying ResponseWriter, so http.ResponseController
// reaches its Hijack, deadlines and full-duplex controls.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// WriteHeader re-applies the budget headers (an upstream's own
// x-ratelimit-* values must not reach the client), picks the body mode
// from the Content-Type and writes the status. Informational statuses pass
// through; a second final status is passed on for net/http to report.
func (r *recorder) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		r.w.WriteHeader(code)
		return
	}
	if r.code != 0 {
		r.w.WriteHeader(code)
		return
	}
	r.code = code
	h := r.w.Header()
	r.hdrs.apply(h)
	if ct := h.Get("Content-Type"); ct != "" {
		mt, _, _ := mime.ParseMediaType(ct)
		switch {
		case mt == "text/event-stream":
			r.mode = modeSSE
		case mt == "application/json" || len(mt) > 5 && mt[len(mt)-5:] == "+json":
			r.mode = modeJSON
		}
	}
	r.w.WriteHeader(code)
}

// Write forwards p. SSE is forwarded per complete event and flushed after
// each Write that completed one; the usage-only chunk the stage asked for
// is dropped. It returns the first error the client connection gave.
func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		if r.w.Header().Get("Content-Type") == "" && looksLikeJSON(p) {
			r.w.Header()["Content-Type"] = []string{"application/json"}
		}
		r.WriteHeader(http.StatusOK)
	}
	switch r.mode {
	case modeSSE:
		r.pending = append(r.pending, p...)
		if r.drainEvents() {
			r.flush()
		}
		return len(p), r.writeErr
	case modeJSON:
		r.keepJSON(p)
	default:
		r.outBytes += int64(len(p))
	}
	n, err := r.w.Write(p)
	if err != nil && r.writeErr == nil {
		r.writeErr = err
	}
	return n, err
}

// Flush sends what has been written. An SSE event still incomplete stays
// held until its blank line arrives.
func (r *recorder) Flush() { r.flush() }

// FlushError is Flush returning the underlying error, for
// http.ResponseController.
func (r *recorder) FlushError() error { return r.rc.Flush() }

func (r *recorder) flush() {
	if err := r.rc.Flush(); err != nil && r.writeErr == nil && err != http.ErrNotSupported {
		r.writeErr = err
	}
}

// forward writes bytes of complete events to the client.
func (r *recorder) forward(b []byte) {
	if r.writeErr != nil {
		return
	}
	if _, err := r.w.Write(b); err != nil {
		r.writeErr = err
	}
}

// drainEvents handles every complete event in pending and reports whether
// it forwarded any.
func (r *recorder) drainEvents() bool {
	forwarded := false
	rest := r.pending
	for {
		end, sep := eventEnd(rest)
		if end < 0 {
			break
		}
		if r.event(rest[:end]) {
			r.forward(rest[:end+sep])
			forwarded = true
		}
		rest = rest[end+sep:]
	}
	if len(rest) > maxPendingEvent {
		r.outBytes += int64(len(rest))
		r.forward(rest)
		rest = rest[:0]
		forwarded = true
	}
	r.pending = append(r.pending[:0], rest...)
	return forwarded
}

// event reads one SSE event (without its blank line) and reports whether
// to forward it.
func (r *recorder) event(ev []byte) bool {
	data := sseData(ev)
	if string(data) == "[DONE]" {
		if r.usage != nil && r.res != nil && !r.settled {
			r.res.settle(r.usage.spent())
			r.settled = true
		}
		return true
	}
	if len(data) == 0 {
		return true
	}
	var c streamChunk
	if json.Unmarshal(data, &c) != nil {
		r.outBytes += int64(len(data))
		return true
	}
	r.outBytes += c.outputBytes()
	if u := c.get(); u != nil {
		r.usage = u
		if r.dropUsage && len(c.Choices) == 0 {
			return false
		}
	}
	return true
}

// keepJSON keeps p for the usage read at the end: the whole answer up to
// jsonKeepWhole, then only its last jsonTail bytes.
func (r *recorder) keepJSON(p []byte) {
	r.outBytes += int64(len(p))
	r.buf = append(r.buf, p...)
	if !r.tail && len(r.buf) > jsonKeepWhole {
		r.tail = true
	}
	if r.tail && len(r.buf) > 2*jsonTail {
		r.buf = append(r.buf[:0], r.buf[len(r.buf)-jsonTail:]...)
	}
}

// finish runs after the handler returned: the last SSE event (one the
// upstream did not end with a blank line) is handled and flushed, and a
// JSON answer is read for its usage.
func (r *recorder) finish() {
	switch r.mode {
	case modeSSE:
		if len(bytes.TrimSpace(r.pending)) > 0 {
			if r.event(bytes.TrimRight(r.pending, "\r\n")) {
				r.forward(r.pending)
			}
			r.pending = r.pending[:0]
			r.flush()
		}
	case modeJSON:
		if r.tail {
			r.usage = usageFromTail(r.buf)
		} else {
			r.usage = usageFromJSON(r.buf)
		}
	}
}

// eventEnd finds the blank line that ends the first SSE event in b. It
// returns the event's length (its lines with their line endings) and the
// blank line's length, or -1 when b holds no complete event yet. Lines end
// in "\r\n", "\n" or "\r".
func eventEnd(b []byte) (end, sep int) {
	start := 0
	for {
		i := bytes.IndexAny(b[start:], "\r\n")
		if i < 0 {
			return -1, 0
		}
		i += start
		next := i + 1
		if b[i] == '\r' {
			if next == len(b) {
				return -1, 0 // a "\n" may follow in the next write
			}
			if b[next] == '\n' {
				next++
			}
		}
		if i == start {
			return start, next - start
		}
		start = next
	}
}

// sseData returns the event's data: its data lines, each without "data:"
// and one optional space, joined by "\n". It allocates only for events of
// more than one data line.
func sseData(ev []byte) []byte {
	var data []byte
	lines := 0
	for len(ev) > 0 {
		line := ev
		ev = nil
		if i := bytes.IndexAny(line, "\r\n"); i >= 0 {
			next := i + 1
			if line[i] == '\r' && next < len(line) && line[next] == '\n' {
				next++
			}
			line, ev = line[:i], line[next:]
		}
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		v, _ = bytes.CutPrefix(v, []byte(" "))
		switch lines {
		case 0:
			data = v
		case 1:
			data = append(append(append([]byte(nil), data...), '\n'), v...)
		default:
			data = append(append(data, '\n'), v...)
		}
		lines++
	}
	return data
}

// looksLikeJSON reports whether p starts, after white space, like a JSON
// object.
func looksLikeJSON(p []byte) bool {
	p = bytes.TrimLeft(p, " \t\r\n")
	return len(p) > 0 && p[0] == '{'
}
