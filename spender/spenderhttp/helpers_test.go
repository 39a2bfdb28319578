package spenderhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

func newClock() *fakeclock.Clock { return fakeclock.New() }

// event is one call a recordingReserver saw on a reservation.
type event struct {
	op   string // "settle" or "cancel"
	cost ration.Amount
}

// recordingReserver wraps a Reserver and records what each reservation
// was reserved with and how it ended.
type recordingReserver struct {
	spenderhttp.Reserver
	mu       sync.Mutex
	reserved []ration.Amount
	keys     []string
	events   []event
	notify   chan<- event // if set, receives every event too
}

func (r *recordingReserver) Reserve(ctx context.Context, key string, lim ration.Limits, c ration.Amount) (spender.Reservation, error) {
	res, err := r.Reserver.Reserve(ctx, key, lim, c)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, key)
	if err != nil {
		return nil, err
	}
	r.reserved = append(r.reserved, c)
	return &recordingReservation{Reservation: res, r: r}, nil
}

func (r *recordingReserver) Events() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.events...)
}

func (r *recordingReserver) Reserved() []ration.Amount {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ration.Amount(nil), r.reserved...)
}

func (r *recordingReserver) send(ev event) {
	if r.notify != nil {
		r.notify <- ev
	}
}

type recordingReservation struct {
	spender.Reservation
	r *recordingReserver
}

func (rr *recordingReservation) Settle(c ration.Amount) {
	rr.r.mu.Lock()
	rr.r.events = append(rr.r.events, event{"settle", c})
	rr.r.mu.Unlock()
	rr.r.send(event{"settle", c})
	rr.Reservation.Settle(c)
}

func (rr *recordingReservation) Cancel() {
	rr.r.mu.Lock()
	rr.r.events = append(rr.r.events, event{"cancel", ration.Amount{}})
	rr.r.mu.Unlock()
	rr.r.send(event{"cancel", ration.Amount{}})
	rr.Reservation.Cancel()
}

// newRecorder returns a real Limiter on a fake clock, wrapped to record.
func newRecorder(t testing.TB) (*recordingReserver, *fakeclock.Clock) {
	clk := newClock()
	return &recordingReserver{Reserver: newLimiter(t, clk)}, clk
}

// authed returns a handler that sets p as the principal and runs h: the
// authentication stage of the chain.
func authed(p spenderhttp.Principal, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(spenderhttp.WithPrincipal(r.Context(), p)))
	})
}

// jsonHandler answers status with body as JSON.
func jsonHandler(status int, body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
}

// do serves one POST of body through h in memory.
func do(h http.Handler, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// openAIError is the OpenAI error body.
type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, body []byte) openAIError {
	t.Helper()
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q is not the OpenAI shape: %v", body, err)
	}
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error body %s lacks error.%s", body, k)
		}
	}
	return e
}

// chat is a chat request body with a 40-byte prompt (10 tokens at bytes/4)
// and the given extra fields.
func chat(extra string) string {
	b := `{"model":"m","messages":[{"role":"user","content":"0123456789012345678901234567890123456789"}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// newLimiter is spender.New, failing the test on an error.
var newLimiter = testkit.Limiter
