package testkit

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"
)

// IdleConns opens n connections to addr (host:port): the even ones send
// req (a raw HTTP/1.1 request that keeps the connection alive) and read
// its response, the odd ones send nothing. It then waits, at most within,
// for the server to close every one, and fails the test for each it
// did not. It returns how long the last one took to close.
func IdleConns(t testing.TB, addr string, n int, req string, within time.Duration) time.Duration {
	t.Helper()
	conns := make([]net.Conn, n)
	readers := make([]*bufio.Reader, n)
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i], readers[i] = c, bufio.NewReader(c)
		if i%2 == 1 {
			continue
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		resp, err := http.ReadResponse(readers[i], nil)
		if err != nil {
			t.Fatalf("connection %d: reading the response: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Close {
			t.Fatalf("connection %d: the server closed it after the request; want it kept alive", i)
		}
	}
	start := time.Now()
	deadline := start.Add(within)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		last    time.Duration
		stayed  int
		gotData int
	)
	for i := range n {
		wg.Go(func() {
			conns[i].SetReadDeadline(deadline)
			_, err := readers[i].ReadByte()
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				gotData++
			case errors.Is(err, os.ErrDeadlineExceeded):
				stayed++
			default: // EOF or reset: the server closed it
				last = max(last, took)
			}
		})
	}
	wg.Wait()
	if stayed > 0 || gotData > 0 {
		t.Errorf("of %d idle connections, %d stayed open past %v and %d got unasked-for data", n, stayed, within, gotData)
	}
	return last
}

// SlowBody sends to addr (host:port) the raw request head (which must
// declare a Content-Length) followed by body, which is shorter than it
// declares, and waits at most within for the server to answer or close
// the connection. It returns the response status, or 0 when the server
// closed the connection without one; it fails the test if neither
// happened in time.
func SlowBody(t testing.TB, addr, head, body string, within time.Duration) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(within))
	if _, err := io.WriteString(c, head+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatalf("a body shorter than its Content-Length got no answer within %v", within)
	case err != nil:
		return 0 // closed without an answer
	}
	resp.Body.Close()
	return resp.StatusCode
}
