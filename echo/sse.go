package echo

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"net/http"
	"strconv"
	"time"
)

// responseID is a deterministic ID for the answer to body: prefix and the
// FNV-1a (64-bit) hash of the body in hex. Equal requests get equal IDs.
func responseID(prefix string, body []byte) string {
	h := fnv.New64a()
	_, _ = h.Write(body)
	return prefix + strconv.FormatUint(h.Sum64(), 16)
}

// sseWriter writes a text/event-stream answer, one event per data line,
// flushing after each through http.ResponseController.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error // the first write or flush error; later writes are skipped
}

// startSSE sends the 200 and the event-stream headers.
func startSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// event writes v as one "data: <json>" event and flushes.
func (s *sseWriter) event(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return
	}
	s.raw(b)
}

// done writes the closing "data: [DONE]" event.
func (s *sseWriter) done() { s.raw([]byte("[DONE]")) }

func (s *sseWriter) raw(data []byte) {
	if s.err != nil {
		return
	}
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, s.err = s.w.Write(buf); s.err != nil {
		return
	}
	s.err = s.rc.Flush()
}

// pause waits d before the next token; it reports false when the client
// left (ctx done) or a write already failed, so the stream stops.
func (s *sseWriter) pause(ctx context.Context, d time.Duration) bool {
	if s.err != nil || ctx.Err() != nil {
		return false
	}
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// usageField returns what a non-final chunk's usage field holds: null
// when usage was asked for, else nothing (omitted).
func usageField(include bool) json.RawMessage {
	if include {
		return json.RawMessage("null")
	}
	return nil
}
