//go:build faults

package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// idleConns are connections a test opened and left idle.
type idleConns struct {
	conns   []net.Conn
	readers []*bufio.Reader
	last    []time.Time // when each connection last carried anything: the server's timeout runs from there
	opened  time.Duration
}

// openIdle opens n connections to addr, 32 at a time. The even ones send
// req (a raw HTTP/1.1 request that keeps the connection alive) and read
// its answer, so the server then waits on them under its idle timeout;
// the odd ones send nothing, so it waits under its read-header timeout.
// They are closed when the test ends.
func openIdle(ctx context.Context, t *testing.T, addr string, n int, req string) *idleConns {
	t.Helper()
	ic := &idleConns{conns: make([]net.Conn, n), readers: make([]*bufio.Reader, n), last: make([]time.Time, n)}
	t.Cleanup(func() {
		for _, c := range ic.conns {
			if c != nil {
				c.Close()
			}
		}
	})
	start := time.Now()
	errs := make(chan error, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			d := net.Dialer{Timeout: 5 * time.Second}
			for i := range next {
				if err := ic.open(ctx, &d, addr, i, req); err != nil {
					errs <- fmt.Errorf("connection %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("opening %d idle connections to %s: %v", n, addr, err)
	}
	ic.opened = time.Since(start)
	return ic
}

func (ic *idleConns) open(ctx context.Context, d *net.Dialer, addr string, i int, req string) error {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	ic.conns[i], ic.readers[i], ic.last[i] = c, bufio.NewReader(c), time.Now()
	if i%2 == 1 {
		return nil
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(ic.readers[i], nil)
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Close {
		return errors.New("the server closed it after one request; want it kept alive")
	}
	ic.last[i] = time.Now()
	c.SetDeadline(time.Time{})
	return nil
}

// idleClose is how the server ended a set of idle connections.
type idleClose struct {
	closed, stayed, gotData int
	longest                 time.Duration // from a connection's last activity to its close
}

// waitClosed waits for the server to close every connection, each at
// most within of its last activity: a read then ends in EOF or a reset.
func (ic *idleConns) waitClosed(within time.Duration) idleClose {
	var (
		mu  sync.Mutex
		res idleClose
		wg  sync.WaitGroup
	)
	for i, c := range ic.conns {
		wg.Go(func() {
			c.SetReadDeadline(ic.last[i].Add(within))
			_, err := ic.readers[i].ReadByte()
			took := time.Since(ic.last[i])
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				res.gotData++
			case errors.Is(err, os.ErrDeadlineExceeded):
				res.stayed++
			default: // EOF or reset: the server closed it
				res.closed++
				res.longest = max(res.longest, took)
			}
		})
	}
	wg.Wait()
	return res
}

// slowConn is one request whose body is dribbled.
type slowConn struct {
	status int           // the first answer's status; 0 = closed without one
	answer time.Duration // from the end of the head to the first answer or the close
	closed time.Duration // from the end of the head to the close
	err    error         // the connection neither answered nor closed in time
}

// slowBody sends head (which declares a Content-Length it never reaches)
// to addr, then one byte of body every tick, and reads what comes back:
// the first answer, and then the close. It gives up at within after the
// head.
func slowBody(ctx context.Context, addr, head string, tick, within time.Duration) slowConn {
	var s slowConn
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		s.err = err
		return s
	}
	defer c.Close()
	if _, err := io.WriteString(c, head); err != nil {
		s.err = err
		return s
	}
	start := time.Now()
	c.SetReadDeadline(start.Add(within))
	stop := make(chan struct{})
	defer close(stop)
	go func() { // dribble until the server cuts the connection or the reader is done
		tk := time.NewTicker(tick)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			if _, err := c.Write([]byte{' '}); err != nil {
				return
			}
		}
	}()
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	s.answer = time.Since(start)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.err = fmt.Errorf("no answer and no close within %v", within)
		return s
	case err != nil: // closed without an answer
		s.closed = s.answer
		return s
	}
	s.status = resp.StatusCode
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// After the answer the connection must not stay: read until the close.
	if _, err := io.Copy(io.Discard, r); errors.Is(err, os.ErrDeadlineExceeded) {
		s.err = fmt.Errorf("answered %d after %v, then not closed within %v", s.status, s.answer, within)
		return s
	}
	s.closed = time.Since(start)
	return s
}

// declaredHead is the head of a chat request that declares a body of
// length bytes; auth is a header line or "".
func declaredHead(auth string, length int) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: faults\r\n" + auth +
		"Content-Type: application/json\r\nContent-Length: " + fmt.Sprint(length) + "\r\n\r\n"
}

// bearer is the Authorization header line for key k.
func bearer(k string) string { return "Authorization: Bearer " + k + "\r\n" }

// longest is the largest of ds.
func longest(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// describe is a short list of statuses and their counts, for logs.
func describe(counts map[int]int) string {
	var b strings.Builder
	for code, n := range counts {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		if code == 0 {
			fmt.Fprintf(&b, "%d closed without an answer", n)
		} else {
			fmt.Fprintf(&b, "%d×%d", n, code)
		}
	}
	return b.String()
}
