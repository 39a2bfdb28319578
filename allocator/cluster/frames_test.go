package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// dialAccept dials srv from cl and returns both ends, the accepted one as
// raft gets it.
func dialAccept(t *testing.T, cl, srv *StreamLayer) (out, in net.Conn) {
	t.Helper()
	out, err := cl.Dial(raft.ServerAddress(srv.Addr().String()), time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { out.Close() })
	in, err = srv.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	return out, in
}

// TestStreamLayerMembership: a peer that proves the secret but is no
// member (an unknown id, a member's id from another address, or under
// mutual TLS a certificate not valid for the member's host) is refused on
// both ends, and so is an acceptor that is not the member listed at the
// address dialed.
func TestStreamLayerMembership(t *testing.T) {
	secret := []string{"peer-secret"}
	for _, tc := range []struct {
		name   string
		mode   peerTLS
		ip     string
		as     raft.ServerID // "" = a member of its own
		reason string
	}{
		{"unknown id", plain, "127.0.0.1", "evil", `evil\", not a member`},
		{"a member's id from another address", plain, "127.0.0.2", "n1", "names itself n1 but connects from 127.0.0.2"},
		{"certificate not valid for the member's host", mutual, "127.0.0.2", "", "certificate is not valid for 127.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLayers(t)
			srv := l.with("127.0.0.1", secret, tc.mode, func(*StreamConfig) {})
			cl := l.with(tc.ip, secret, tc.mode, func(c *StreamConfig) {
				if tc.as != "" {
					c.ID = tc.as
				}
			})
			if conn, err := cl.Dial(raft.ServerAddress(srv.Addr().String()), time.Second); !errors.Is(err, ErrPeerRefused) {
				if conn != nil {
					conn.Close()
				}
				t.Fatalf("dial: %v, want ErrPeerRefused", err)
			}
			refusedCount(t, srv, "in", 1)
			refusedCount(t, cl, "out", 1)
			// A refusal is counted, then logged.
			for deadline := time.Now().Add(5 * time.Second); !strings.Contains(l.logs.String(), tc.reason); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the refusal does not say %q:\n%s", tc.reason, l.logs.String())
				}
			}
		})
	}
	t.Run("not the member dialed", func(t *testing.T) {
		l := newLayers(t)
		cl := l.new(secret, plain, time.Second)
		stranger := l.with("127.0.0.1", secret, plain, func(c *StreamConfig) { c.ID = "n1" }) // n1 is cl, at another address
		if _, err := cl.Dial(raft.ServerAddress(stranger.Addr().String()), time.Second); !errors.Is(err, ErrPeerRefused) ||
			!strings.Contains(err.Error(), "not the member there") {
			t.Fatalf("dial: %v", err)
		}
	})
}

// TestStreamLayerFrames: after the handshake, what a member sends raft
// reaches raft only whole and within bounds, and as its own: a request
// naming another sender (a term hijack by a "leader" that is no member),
// a string declared beyond the bounds (refused before a byte of it is
// read), an unknown RPC, a snapshot over MaxSnapshotBytes, nesting too
// deep, and an oversize answer are each refused, counted, and the
// connection closed; a snapshot within bounds passes through whole, and
// an AppendEntries answer records the follower's progress.
func TestStreamLayerFrames(t *testing.T) {
	secret := []string{"peer-secret"}
	raw := func(b ...byte) []byte { return b }
	for _, tc := range []struct {
		name   string
		data   func(from raft.ServerID) []byte
		reason string
	}{
		{"term hijack", func(raft.ServerID) []byte {
			return request(t, rpcAppendEntries, &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("evil"), Addr: []byte("10.6.6.6:7451")},
				Term: 1005, Leader: []byte("10.6.6.6:7451")})
		}, `names "evil" as its sender`},
		{"log injection as another member", func(raft.ServerID) []byte {
			return request(t, rpcAppendEntries, &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("n1")}, Term: 2,
				Entries: []*raft.Log{{Index: 9, Term: 2, Type: raft.LogCommand, Data: []byte("injected")}}})
		}, `names "n1" as its sender`},
		{"a 2 GiB string", func(raft.ServerID) []byte {
			return raw(rpcAppendEntries, 0x81, 0xa4, 'D', 'a', 't', 'a', 0xc6, 0x7f, 0xff, 0xff, 0xff)
		}, "a string of 2147483647 bytes, at most 2097152"},
		{"a 4 GiB array", func(raft.ServerID) []byte {
			return raw(rpcAppendEntries, 0x81, 0xa7, 'E', 'n', 't', 'r', 'i', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff)
		}, "4294967295 items declared"},
		{"a large vote", func(raft.ServerID) []byte {
			return raw(rpcRequestVote, 0x81, 0xa9, 'C', 'a', 'n', 'd', 'i', 'd', 'a', 't', 'e', 0xdb, 0, 1, 0x86, 0xa0)
		}, "a string of 100000 bytes, at most 65536"},
		{"nesting", func(raft.ServerID) []byte {
			return append([]byte{rpcTimeoutNow}, bytes.Repeat([]byte{0x91}, 40)...)
		}, "nested deeper than 16"},
		{"unknown RPC", func(raft.ServerID) []byte { return raw(9, 0x80) }, "unknown RPC type 9"},
		{"a 2 GiB snapshot", func(from raft.ServerID) []byte {
			return request(t, rpcInstallSnapshot, &raft.InstallSnapshotRequest{RPCHeader: raft.RPCHeader{ID: []byte(from)}, Size: 2 << 30})
		}, "a snapshot of 2147483648 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLayers(t)
			srv, cl := l.new(secret, plain, time.Second), l.new(secret, plain, time.Second)
			out, in := dialAccept(t, cl, srv)
			data := tc.data(cl.id)
			go out.Write(data)
			_, err := io.ReadAll(in)
			if !errors.Is(err, ErrFrameRefused) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("read: %v, want ErrFrameRefused saying %q", err, tc.reason)
			}
			if n := testutil.ToFloat64(srv.frames.WithLabelValues("in")); n != 1 {
				t.Fatalf("frames refused in: %v", n)
			}
			if _, err := out.Read(make([]byte, 1)); err == nil {
				t.Fatal("the connection stayed open")
			}
		})
	}
	t.Run("a snapshot within bounds, then a request", func(t *testing.T) {
		l := newLayers(t)
		srv, cl := l.new(secret, plain, time.Second), l.new(secret, plain, time.Second)
		out, in := dialAccept(t, cl, srv)
		body := bytes.Repeat([]byte("snapshot"), 100_000)
		head := request(t, rpcInstallSnapshot, &raft.InstallSnapshotRequest{RPCHeader: raft.RPCHeader{ID: []byte(cl.id)}, Size: int64(len(body))})
		vote := request(t, rpcRequestVote, &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte(cl.id)}, Term: 3})
		want := append(append(append([]byte{}, head...), body...), vote...)
		go out.Write(want)
		got := make([]byte, len(want))
		if _, err := io.ReadFull(in, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read %d bytes, %v; equal: %v", len(got), err, bytes.Equal(got, want))
		}
	})
	t.Run("an oversize answer", func(t *testing.T) {
		l := newLayers(t)
		srv, cl := l.new(secret, plain, time.Second), l.new(secret, plain, time.Second)
		out, in := dialAccept(t, cl, srv)
		exchange(t, out, in, cl.id)
		out.Write(request(t, rpcRequestVote, &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte(cl.id)}}))
		go io.ReadFull(in, make([]byte, 1))
		go in.Write(append([]byte{0xa0, 0xc6, 0x10, 0, 0, 0}, make([]byte, 100)...))
		if _, err := out.Read(make([]byte, 1)); !errors.Is(err, ErrFrameRefused) {
			t.Fatalf("read: %v, want ErrFrameRefused", err)
		}
		if n := testutil.ToFloat64(cl.frames.WithLabelValues("out")); n != 1 {
			t.Fatalf("frames refused out: %v", n)
		}
	})
	t.Run("progress", func(t *testing.T) {
		l := newLayers(t)
		srv, cl := l.new(secret, plain, time.Second), l.new(secret, plain, time.Second)
		out, in := dialAccept(t, cl, srv)
		req := request(t, rpcAppendEntries, &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte(cl.id)}, Term: 2})
		resp := answer(t, &raft.AppendEntriesResponse{Term: 2, LastLog: 42, Success: true})
		if _, ok := cl.Progress(raft.ServerAddress(srv.Addr().String())); ok {
			t.Fatal("progress before any answer")
		}
		go func() {
			io.ReadFull(in, make([]byte, len(req)))
			in.Write(resp)
		}()
		out.Write(req)
		if _, err := io.ReadFull(out, make([]byte, len(resp))); err != nil {
			t.Fatal(err)
		}
		if c, ok := cl.Progress(raft.ServerAddress(srv.Addr().String())); !ok || c.LastLog != 42 || time.Since(c.At) > time.Second {
			t.Fatalf("progress %+v %v, want last log 42 just now", c, ok)
		}
	})
}

// TestStreamLayerBounds: connections in their handshake are bounded per
// address (and in all), so that a flood from one address leaves a member
// elsewhere its own; a member holds at most maxPeerConns connections; an
// accepted connection idle past IdleTimeout is closed, and the dialer's
// side replaces it when raft next sends on it.
func TestStreamLayerBounds(t *testing.T) {
	secret := []string{"peer-secret"}
	t.Run("handshakes", func(t *testing.T) {
		l := newLayers(t)
		srv := l.new(secret, plain, 5*time.Second)
		silent := func(ip string) net.Conn {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: time.Second}
			c, err := d.Dial("tcp", srv.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		closedSoon := func(c net.Conn) bool {
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			return err != nil && !(errors.As(err, &ne) && ne.Timeout())
		}
		for range maxHandshakesPerIP {
			silent("127.0.0.1")
		}
		refusedCount(t, srv, "in", 0)
		if !closedSoon(silent("127.0.0.1")) {
			t.Fatal("a connection beyond the bound per address stayed open")
		}
		member := l.with("127.0.0.2", secret, plain, func(*StreamConfig) {})
		dialAccept(t, member, srv)
		inHandshake := func() int {
			srv.mu.Lock()
			defer srv.mu.Unlock()
			return len(srv.handshake)
		}
		for i := 3; inHandshake() < maxHandshakes; i++ {
			for range maxHandshakesPerIP {
				silent(fmt.Sprintf("127.0.0.%d", i))
			}
			time.Sleep(10 * time.Millisecond) // accepted on the layer's goroutine
		}
		if !closedSoon(silent("127.0.1.1")) {
			t.Fatal("a connection beyond the bound in all stayed open")
		}
		refusedCount(t, srv, "in", 2)
	})
	t.Run("connections per member", func(t *testing.T) {
		l := newLayers(t)
		srv, cl := l.new(secret, plain, time.Second), l.new(secret, plain, time.Second)
		var conns []net.Conn
		for range maxPeerConns {
			c, err := cl.Dial(raft.ServerAddress(srv.Addr().String()), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		if _, err := cl.Dial(raft.ServerAddress(srv.Addr().String()), time.Second); !errors.Is(err, ErrPeerRefused) {
			t.Fatalf("connection %d: %v, want refused", maxPeerConns+1, err)
		}
		in, err := srv.Accept()
		if err != nil {
			t.Fatal(err)
		}
		in.Close()
		dialAccept(t, cl, srv)
		for _, c := range conns {
			c.Close()
		}
	})
	t.Run("idle", func(t *testing.T) {
		l := newLayers(t)
		idle := func(c *StreamConfig) { c.IdleTimeout = 200 * time.Millisecond }
		srv, cl := l.with("127.0.0.1", secret, plain, idle), l.with("127.0.0.1", secret, plain, idle)
		out, in := dialAccept(t, cl, srv)
		exchange(t, out, in, cl.id)
		start := time.Now()
		if n, err := in.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("an idle connection: read %d, %v; want io.EOF", n, err)
		}
		if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
			t.Fatalf("closed after %v, want the 200 ms idle timeout", d)
		}
		// The dialer's side, idle beyond half the timeout, redials.
		got := make(chan net.Conn, 1)
		go func() {
			c, err := srv.Accept()
			if err != nil {
				t.Error(err)
			}
			got <- c
		}()
		req := request(t, rpcRequestVote, &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte(cl.id)}, Term: 8})
		if _, err := out.Write(req); err != nil {
			t.Fatalf("a request on an idle connection: %v", err)
		}
		fresh := <-got
		defer fresh.Close()
		if _, err := io.ReadFull(fresh, make([]byte, len(req))); err != nil {
			t.Fatal(err)
		}
		fresh.Write(answer(t, &raft.RequestVoteResponse{Term: 8}))
		if _, err := out.Read(make([]byte, 1)); err != nil {
			t.Fatalf("the answer on the new connection: %v", err)
		}
	})
}
