package spenderhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// stallingBody gives prefix, then blocks in Read (after signalling
// stalled) until release is closed, then fails with err (io.EOF: the
// body ends there).
type stallingBody struct {
	prefix  *strings.Reader
	stalled chan<- struct{}
	release <-chan struct{}
	err     error
	once    sync.Once
}

func (b *stallingBody) Read(p []byte) (int, error) {
	if b.prefix.Len() > 0 {
		return b.prefix.Read(p)
	}
	b.once.Do(func() { b.stalled <- struct{}{} })
	<-b.release
	return 0, b.err
}

func heapInuse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// A declared Content-Length used to size the buffer
// before a byte arrived, so 40 requests declaring 16 MB and sending
// nothing held 640 MB.
func TestMiddlewareBodyMemoryFollowsBytesReceived(t *testing.T) {
	const conns, declared = 40, 16_000_000
	rec, _ := newRecorder(t)
	h := authed(spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 1000}},
		spenderhttp.Middleware(rec, nil)(&echoHandler{}))
	before := heapInuse()
	stalled := make(chan struct{}, conns)
	release := make(chan struct{})
	var wg sync.WaitGroup
	codes := make([]int, conns)
	for i := range conns {
		body := &stallingBody{prefix: strings.NewReader(""), stalled: stalled, release: release, err: io.ErrUnexpectedEOF}
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body)
		req.ContentLength = declared
		wg.Go(func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			codes[i] = w.Code
		})
	}
	timeout := time.After(10 * time.Second)
	for range conns {
		select {
		case <-stalled:
		case <-timeout:
			close(release)
			t.Fatal("the requests did not all reach the body read within 10s")
		}
	}
	held := int64(heapInuse()) - int64(before)
	close(release)
	wg.Wait()
	if held > 10<<20 {
		t.Errorf("%d requests declaring %d bytes and sending none hold %d MB of heap, want under 10 MB", conns, declared, held>>20)
	}
	for i, c := range codes {
		if c != http.StatusBadRequest {
			t.Errorf("request %d: status %d, want 400 for a body cut short", i, c)
		}
	}
}

func TestMiddlewareBodyBytesInFlightCap(t *testing.T) {
	rec, _ := newRecorder(t)
	h := authed(spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 1000}},
		spenderhttp.Middleware(rec, nil, spenderhttp.WithMaxBodyBytes(1<<20),
			spenderhttp.WithMaxBodyBytesInFlight(126<<10))(&echoHandler{}))

	// A body of unknown length that has sent 40 KiB has been charged its
	// buffers of 4, 8, 16, 32 and 64 KiB (the smaller ones are garbage,
	// not yet freed): 124 KiB of the cap, which leaves less than the first
	// buffer of another body declaring 3 KiB.
	stalled := make(chan struct{}, 1)
	release := make(chan struct{})
	prefix := `{"prompt":"` + strings.Repeat("x", 40<<10)
	slow := &stallingBody{prefix: strings.NewReader(prefix), stalled: stalled, release: release, err: io.EOF}
	done := make(chan int, 1)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/completions", slow))
		done <- w.Code
	}()
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow body was not read within 10s")
	}

	w := do(h, chat(strings.Repeat("y", 3<<10)))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("with the cap held: status %d, Retry-After %q; want 503 and 1", w.Code, w.Header().Get("Retry-After"))
	}
	e := decodeError(t, w.Body.Bytes())
	if e.Error.Type != "server_error" || e.Error.Code == nil || *e.Error.Code != "server_overloaded" {
		t.Errorf("503 body %s, want server_error / server_overloaded", w.Body)
	}

	close(release)
	select {
	case c := <-done:
		if c != http.StatusOK {
			t.Errorf("the slow body, once complete: status %d, want 200", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slow request did not finish within 10s")
	}
	if w := do(h, chat("")); w.Code != http.StatusOK {
		t.Errorf("after the slow body was released: status %d, want 200 (%s)", w.Code, w.Body)
	}
}

func TestMiddlewareBodyReadDeadlineIs408(t *testing.T) {
	rec, _ := newRecorder(t)
	next := &echoHandler{}
	h := authed(spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 1000}},
		spenderhttp.Middleware(rec, nil)(next))
	ch := make(chan struct{}, 1)
	closed := make(chan struct{})
	close(closed)
	body := &stallingBody{prefix: strings.NewReader(`{"prompt":"ab`), stalled: ch, release: closed, err: os.ErrDeadlineExceeded}
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", body)
	req.ContentLength = 500
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusRequestTimeout || w.Header().Get("Connection") != "close" {
		t.Fatalf("status %d, Connection %q; want 408 and close", w.Code, w.Header().Get("Connection"))
	}
	if next.calls != 0 || len(rec.Reserved()) != 0 {
		t.Errorf("a body cut by its deadline reached the handler or reserved")
	}
}
