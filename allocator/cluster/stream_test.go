package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/testkit"
)

// peerTLS is a side's TLS: none, mutual (certificates verified against a
// CA), encrypted only (certificates not verified), or mutual against
// another CA than the other side's.
type peerTLS int

const (
	plain peerTLS = iota
	mutual
	unverified
	otherCA
)

// layers makes StreamLayers on loopback for tests, sharing one CA and
// one membership: each layer is a member, n1, n2..., at its listener's
// address.
type layers struct {
	t    *testing.T
	ca   testkit.TLSFiles
	logs *testkit.SyncBuffer

	mu      sync.Mutex
	members map[raft.ServerID]raft.ServerAddress
}

func newLayers(t *testing.T) *layers {
	return &layers{t: t, ca: testkit.NewTLSFiles(t), logs: &testkit.SyncBuffer{}, members: map[raft.ServerID]raft.ServerAddress{}}
}

// membership is the layers' Members.
func (l *layers) membership() map[raft.ServerID]raft.ServerAddress {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.members)
}

// join lists id at addr.
func (l *layers) join(id raft.ServerID, addr raft.ServerAddress) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.members[id] = addr
}

func (l *layers) new(tokens []string, mode peerTLS, timeout time.Duration) *StreamLayer {
	l.t.Helper()
	return l.with("127.0.0.1", tokens, mode, func(c *StreamConfig) { c.HandshakeTimeout = timeout })
}

// with makes a layer on ip, a member named n1, n2... at its listener's
// address, with tune's changes to its configuration (which may rename
// it, or drop Join to keep it out of the membership).
func (l *layers) with(ip string, tokens []string, mode peerTLS, tune func(*StreamConfig)) *StreamLayer {
	l.t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		l.t.Fatal(err)
	}
	l.mu.Lock()
	id := raft.ServerID(fmt.Sprintf("n%d", len(l.members)+1))
	l.mu.Unlock()
	cfg := StreamConfig{Listener: ln, ID: id, Members: l.membership, Tokens: tokens,
		Logger: slog.New(slog.NewTextHandler(l.logs, nil))}
	tune(&cfg)
	if cfg.ID == id {
		l.join(id, raft.ServerAddress(ln.Addr().String()))
	}
	switch mode {
	case mutual:
		cfg.ServerTLS, cfg.ClientTLS = PeerTLS(l.ca.Certificate(l.t), l.ca.Pool)
	case unverified:
		cfg.ServerTLS, cfg.ClientTLS = PeerTLS(l.ca.Certificate(l.t), nil)
	case otherCA:
		other := testkit.NewTLSFiles(l.t)
		cfg.ServerTLS, cfg.ClientTLS = PeerTLS(other.Certificate(l.t), other.Pool)
	}
	s, err := NewStreamLayer(cfg)
	if err != nil {
		ln.Close()
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { s.Close() })
	return s
}

// refusedCount polls until s has refused want connections in direction
// (an incoming handshake runs on its own goroutine), and fails the test
// otherwise.
func refusedCount(t *testing.T, s *StreamLayer, direction string, want float64) {
	t.Helper()
	var got float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if got = testutil.ToFloat64(s.refused.WithLabelValues(direction)); got == want {
			return
		}
	}
	t.Fatalf("refused %s: %v, want %v", direction, got, want)
}

// TestStreamLayerHandshake: a connection is handed to raft only when both
// ends prove a cluster token the other accepts (and, with TLS, pass its
// handshake); otherwise it is refused on both ends, each counting it. The
// bytes raft then sends cross intact.
func TestStreamLayerHandshake(t *testing.T) {
	for _, tc := range []struct {
		name             string
		server, client   []string
		serverTLS, clTLS peerTLS
		ok               bool
	}{
		{"same token", []string{"t1"}, []string{"t1"}, plain, plain, true},
		{"rotation midway", []string{"new", "old"}, []string{"old", "new"}, plain, plain, true},
		{"client's token unknown", []string{"t1"}, []string{"t2", "t1"}, plain, plain, false},
		{"server's token unknown", []string{"t1", "t2"}, []string{"t2"}, plain, plain, false},
		{"wrong token", []string{"t1"}, []string{"t2"}, plain, plain, false},
		{"no tokens on either side", nil, nil, plain, plain, true},
		{"token on the server only", []string{"t1"}, nil, plain, plain, false},
		{"token on the client only", nil, []string{"t1"}, plain, plain, false},
		{"mutual TLS", []string{"t1"}, []string{"t1"}, mutual, mutual, true},
		{"mutual TLS, no tokens", nil, nil, mutual, mutual, true},
		{"mutual TLS, wrong token", []string{"t1"}, []string{"t2"}, mutual, mutual, false},
		{"unverified TLS", []string{"t1"}, []string{"t1"}, unverified, unverified, true},
		{"client certificate of another CA", []string{"t1"}, []string{"t1"}, mutual, otherCA, false},
		{"plain client, TLS server", []string{"t1"}, []string{"t1"}, mutual, plain, false},
		{"TLS client, plain server", []string{"t1"}, []string{"t1"}, plain, mutual, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLayers(t)
			srv, cl := l.new(tc.server, tc.serverTLS, time.Second), l.new(tc.client, tc.clTLS, time.Second)
			conn, err := cl.Dial(raft.ServerAddress(srv.Addr().String()), time.Second)
			if !tc.ok {
				if err == nil {
					conn.Close()
					t.Fatal("connected")
				}
				if !errors.Is(err, ErrPeerRefused) {
					t.Fatalf("dial: %v, want ErrPeerRefused", err)
				}
				refusedCount(t, srv, "in", 1)
				refusedCount(t, cl, "out", 1)
				if !strings.Contains(l.logs.String(), "cluster: refused a peer connection") {
					t.Fatalf("refusal not logged:\n%s", l.logs.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("dial: %v\n%s", err, l.logs.String())
			}
			defer conn.Close()
			in, err := srv.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			exchange(t, conn, in, cl.id)
			refusedCount(t, srv, "in", 0)
			refusedCount(t, cl, "out", 0)
		})
	}
}

// request is what raft's transport sends for a request: its type, then
// the request in msgpack.
func request(t *testing.T, rpc uint8, req any) []byte {
	t.Helper()
	var b []byte
	if err := codec.NewEncoderBytes(&b, &codec.MsgpackHandle{}).Encode(req); err != nil {
		t.Fatal(err)
	}
	return append([]byte{rpc}, b...)
}

// answer is what raft's transport sends back: an error string, then the
// response, each in msgpack.
func answer(t *testing.T, resp any) []byte {
	t.Helper()
	var b []byte
	enc := codec.NewEncoderBytes(&b, &codec.MsgpackHandle{})
	if err := enc.Encode(""); err != nil {
		t.Fatal(err)
	}
	if err := enc.Encode(resp); err != nil {
		t.Fatal(err)
	}
	return b
}

// exchange sends a vote request from the dialer (member from) on conn and
// the answer back from in, the acceptor's end, and checks that both cross
// intact.
func exchange(t *testing.T, conn, in net.Conn, from raft.ServerID) {
	t.Helper()
	for _, x := range []struct {
		w    net.Conn
		r    net.Conn
		data []byte
	}{
		{conn, in, request(t, rpcRequestVote, &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte(from), Addr: []byte("x")}, Term: 7})},
		{in, conn, answer(t, &raft.RequestVoteResponse{Term: 7, Granted: true})},
	} {
		if _, err := x.w.Write(x.data); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(x.data))
		if _, err := io.ReadFull(x.r, buf); err != nil || !bytes.Equal(buf, x.data) {
			t.Fatalf("read %q, %v; want %q", buf, err, x.data)
		}
	}
}

// TestStreamLayerStrangers: a connection that is not a peer's (an HTTP
// request, or silence past the handshake timeout) is refused and counted,
// and holds up no other peer's connection meanwhile.
func TestStreamLayerStrangers(t *testing.T) {
	l := newLayers(t)
	srv := l.new([]string{"t1"}, plain, 300*time.Millisecond)
	silent, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	peer := l.new([]string{"t1"}, plain, time.Second)
	conn, err := peer.Dial(raft.ServerAddress(srv.Addr().String()), time.Second)
	if err != nil {
		t.Fatalf("a peer waited behind a silent connection: %v", err)
	}
	conn.Close()
	in, err := srv.Accept()
	if err != nil {
		t.Fatal(err)
	}
	in.Close()
	http, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer http.Close()
	fmt.Fprintf(http, "GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: curl/8.0\r\n\r\n")
	refusedCount(t, srv, "in", 2) // the HTTP request, then the silent one at its timeout
	if _, err := http.Read(make([]byte, 1)); err == nil {
		t.Fatal("the refused connection was not closed")
	}
	if !strings.Contains(l.logs.String(), "bad magic") {
		t.Fatalf("log:\n%s", l.logs.String())
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

// TestStreamLayerConfig: what NewStreamLayer refuses.
func TestStreamLayerConfig(t *testing.T) {
	ca := testkit.NewTLSFiles(t)
	srvTLS, clTLS := PeerTLS(ca.Certificate(t), nil)
	members := func() map[raft.ServerID]raft.ServerAddress { return nil }
	for _, tc := range []struct {
		name string
		cfg  func(ln net.Listener) StreamConfig
		want string
	}{
		{"no listener", func(net.Listener) StreamConfig { return StreamConfig{} }, "needs a listener"},
		{"no id", func(ln net.Listener) StreamConfig { return StreamConfig{Listener: ln, Members: members} }, "needs this member's id"},
		{"no members", func(ln net.Listener) StreamConfig { return StreamConfig{Listener: ln, ID: "a"} }, "needs this member's id"},
		{"half TLS", func(ln net.Listener) StreamConfig {
			return StreamConfig{Listener: ln, ID: "a", Members: members, ServerTLS: srvTLS}
		}, "go together"},
		{"empty token", func(ln net.Listener) StreamConfig {
			return StreamConfig{Listener: ln, ID: "a", Members: members, Tokens: []string{""}}
		}, "empty peer secret"},
		{"unverified TLS without token", func(ln net.Listener) StreamConfig {
			return StreamConfig{Listener: ln, ID: "a", Members: members, ServerTLS: srvTLS, ClientTLS: clTLS}
		}, "needs a peer secret"},
		{"unspecified advertise", func(ln net.Listener) StreamConfig {
			return StreamConfig{Listener: ln, ID: "a", Members: members, Advertise: &net.TCPAddr{IP: net.IPv4zero, Port: 7451}}
		}, "unspecified"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			if s, err := NewStreamLayer(tc.cfg(ln)); err == nil || !strings.Contains(err.Error(), tc.want) {
				if s != nil {
					s.Close()
				}
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// tcpRaft: timeouts for nodes on loopback TCP, four times fastRaft's, so
// that a busy test machine rarely forces a new election.
func tcpRaft(c *raft.Config) {
	fastRaft(c)
	c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
}

// TestClusterOverTCP: three nodes on raft's network transport over
// authenticated stream layers on loopback, plain and with mutual TLS,
// elect a leader and replicate; a follower names the leader's TCP address.
func TestClusterOverTCP(t *testing.T) {
	for _, mode := range []peerTLS{plain, mutual} {
		t.Run(fmt.Sprint(map[peerTLS]string{plain: "plain", mutual: "mutual TLS"}[mode]), func(t *testing.T) {
			l := newLayers(t)
			var nodes []*Node
			var servers []raft.Server
			for range 3 {
				s := l.new([]string{"cluster-secret"}, mode, time.Second)
				nd, err := New(s.id, NewNetworkTransport(s, nil), ledgerCfg, WithRaftConfig(tcpRaft))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { nd.Shutdown() })
				nodes = append(nodes, nd)
				servers = append(servers, raft.Server{ID: nd.ID(), Address: nd.Addr()})
			}
			if err := nodes[0].Bootstrap(servers...); err != nil {
				t.Fatal(err)
			}
			// leader polls for the current leader: on loopback under -race
			// an election may be lost and run again.
			leader := func() *Node {
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					for _, nd := range nodes {
						if nd.IsLeader() {
							return nd
						}
					}
				}
				t.Fatalf("no leader\n%s", l.logs.String())
				return nil
			}
			caller := ledger.Caller{SpenderID: "gw", Epoch: 1}
			for seq := range uint64(10) {
				caller.Sequence = seq + 1
				cmd := ledger.Acquire{Now: 1, Caller: caller, Keys: []ledger.AcquireKey{
					{Key: "k", Limits: ration.Limits{TPM: 6000}, Want: ration.Amount{Tokens: 10}}}}
				// The same call again after a leader change: exactly once.
				for _, err := leader().Apply(t.Context(), cmd); err != nil; _, err = leader().Apply(t.Context(), cmd) {
					if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrOutcomeUnknown) {
						t.Fatal(err)
					}
				}
			}
			lead := leader()
			want, index := lead.FSM().StateSnapshot()
			for _, nd := range nodes {
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
					if got, i := nd.FSM().StateSnapshot(); i >= index && string(got) == string(want) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s did not converge", nd.ID())
					}
				}
			}
			// A follower names the leader's TCP address (polled: it learns
			// a new leader a heartbeat late).
			named := func() bool {
				lead := leader()
				for _, nd := range nodes {
					var nle *NotLeaderError
					if nd != lead {
						if _, err := nd.Apply(t.Context(), ledger.Sweep{Now: 1}); errors.As(err, &nle) && nle.Leader == lead.Addr() {
							return true
						}
					}
				}
				return false
			}
			for deadline := time.Now().Add(10 * time.Second); !named(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("no follower named the leader's address")
				}
			}
			if strings.Contains(l.logs.String(), "refused") {
				t.Fatalf("a peer connection was refused:\n%s", l.logs.String())
			}
		})
	}
}
