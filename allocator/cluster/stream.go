package cluster

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrPeerRefused is wrapped by the error of a peer connection whose
// handshake failed: the other side does not speak this protocol, does not
// prove a cluster token this member accepts, or refused this member's.
var ErrPeerRefused = errors.New("cluster: peer refused")

// StreamConfig configures a StreamLayer.
type StreamConfig struct {
	// Listener accepts the peers' connections. The caller opens it; the
	// StreamLayer closes it.
	Listener net.Listener
	// Advertise is the address the peers dial to reach this member (its
	// raft.ServerAddress); nil means the listener's address.
	Advertise net.Addr
	// Tokens are the cluster's shared secrets. A member proves it knows
	// Tokens[0] and accepts a peer that proves any of them, so a token is
	// rotated by adding the new one second everywhere, then first
	// everywhere, then removing the old one. With none, peers are not
	// authenticated (development only); both sides must agree on that.
	Tokens []string
	// ServerTLS and ClientTLS, both or neither, wrap every connection in
	// TLS: ServerTLS for the connections this member accepts, ClientTLS for
	// those it dials (its ServerName, if empty, is set to the host
	// dialed). Mutual TLS is theirs to configure (ClientAuth, ClientCAs,
	// RootCAs, Certificates). nil: plain TCP.
	ServerTLS, ClientTLS *tls.Config
	// HandshakeTimeout bounds a connection's TLS and token handshake;
	// 0 means 10 s.
	HandshakeTimeout time.Duration
	// Logger receives refused connections (sampled) and accept errors;
	// nil discards.
	Logger *slog.Logger
}

// StreamLayer is a raft.StreamLayer over TCP, optionally TLS, on which
// every connection starts with a handshake that authenticates both ends
// with the cluster's token, by HMAC challenge and response: each side
// sends a random 32-byte nonce and proves it knows a token with
// HMAC-SHA256(token, role, both nonces, and over TLS the session's
// exported keying material), so the token never crosses the wire, a
// recorded proof is worthless on another connection, and over TLS a proof
// cannot be relayed into another session. A connection that fails the
// handshake is closed, logged (the 1st, 2nd, 4th, 8th... and every 1000th)
// and counted; raft never sees it.
//
// Without TLS the handshake keeps out processes that do not know the
// token (a misconfigured member, another cluster, a scanner), but not an
// attacker on the path, who could take over a connection after it: use
// TLS for that. It is safe for concurrent use.
type StreamLayer struct {
	ln        net.Listener
	advertise net.Addr
	tokens    [][]byte
	serverTLS *tls.Config
	clientTLS *tls.Config
	timeout   time.Duration
	log       *slog.Logger
	refused   *prometheus.CounterVec // by direction: in (a peer's connection), out (one this member dialed)
	refusedN  atomic.Uint64          // for log sampling

	accepted chan net.Conn // authenticated incoming connections, for Accept
	done     chan struct{} // closed by Close
	wg       sync.WaitGroup

	mu        sync.Mutex
	handshake map[net.Conn]struct{} // incoming connections in their handshake, closed by Close
	closed    bool
}

var _ raft.StreamLayer = (*StreamLayer)(nil)

// NewStreamLayer starts accepting on cfg.Listener.
func NewStreamLayer(cfg StreamConfig) (*StreamLayer, error) {
	if cfg.Listener == nil {
		return nil, errors.New("cluster: a stream layer needs a listener")
	}
	if (cfg.ServerTLS == nil) != (cfg.ClientTLS == nil) {
		return nil, errors.New("cluster: ServerTLS and ClientTLS go together")
	}
	s := &StreamLayer{ln: cfg.Listener, advertise: cfg.Advertise, serverTLS: cfg.ServerTLS, clientTLS: cfg.ClientTLS,
		timeout: cfg.HandshakeTimeout, log: cfg.Logger, accepted: make(chan net.Conn),
		done: make(chan struct{}), handshake: map[net.Conn]struct{}{}}
	for _, t := range cfg.Tokens {
		if t == "" {
			return nil, errors.New("cluster: an empty cluster token")
		}
		s.tokens = append(s.tokens, []byte(t))
	}
	if cfg.ClientTLS != nil && cfg.ClientTLS.InsecureSkipVerify && len(s.tokens) == 0 {
		return nil, errors.New("cluster: TLS without verifying peers' certificates needs a cluster token to authenticate them")
	}
	if s.advertise == nil {
		s.advertise = s.ln.Addr()
	}
	if tcp, ok := s.advertise.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return nil, fmt.Errorf("cluster: advertise address %s is unspecified: give the address peers dial", tcp)
	}
	if s.timeout <= 0 {
		s.timeout = 10 * time.Second
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ration_allocator_raft_peer_refused_total",
		Help: "Peer connections refused in the handshake (TLS or cluster token), by direction: in (accepted here), out (dialed from here).",
	}, []string{"direction"})
	s.refused.WithLabelValues("in")
	s.refused.WithLabelValues("out") // both exported from the start, at 0
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// PeerTLS returns the TLS configurations of a member that presents cert
// to its peers. With ca, TLS is mutual: each side verifies the other's
// certificate against ca (a peer's certificate must be valid for the host
// it is dialed at, and for client authentication too). Without ca the
// connection is encrypted but certificates are not verified; the cluster
// token's handshake, bound to the TLS session, is then what authenticates
// the peer, so a StreamLayer refuses that combination without tokens.
func PeerTLS(cert tls.Certificate, ca *x509.CertPool) (server, client *tls.Config) {
	server = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	if ca != nil {
		server.ClientCAs, server.ClientAuth = ca, tls.RequireAndVerifyClientCert
		client.RootCAs = ca
	} else {
		client.InsecureSkipVerify = true // the token handshake, bound to the session, authenticates
	}
	return server, client
}

// NewNetworkTransport returns raft's network transport over s, logging
// to logger (nil discards), with raft's usual pool of 3 connections per
// peer and a 10 s I/O timeout, and without pipelined replication. Closing
// the transport (raft's Shutdown does) closes s.
//
// Pipelining is off (MaxRPCsInFlight 1: one AppendEntries at a time)
// because in raft v1.7.3 it can deadlock. When a follower answers a
// pipelined AppendEntries with Success=false (a log mismatch, or an
// error), raft's pipelineDecode returns and no one reads the pipeline's
// responses any more; if the replication loop sends once more before it
// notices, that send waits for the response reader, which waits for
// pipelineDecode: forever. The follower's replication goroutine never
// ends, so its heartbeats go on (it is never replicated to again, yet
// never times out), and raft's Shutdown waits for that goroutine without
// end. The fault suite's failover case met this once in some forty
// runs: a member that became leader as its peers stopped (SIGTERM to all
// three) still sent heartbeats to one of them, and to no other, over a
// minute later, and never exited; of the waits in raft's replication,
// only the pipeline's has no timeout. Raft's own notes on MaxRPCsInFlight
// say pipelining brings little on a low-latency network.
func NewNetworkTransport(s *StreamLayer, logger *slog.Logger) *raft.NetworkTransport {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: s, MaxPool: 3, Timeout: 10 * time.Second, Logger: newHclog(logger), MaxRPCsInFlight: 1,
	})
}

// RegisterMetrics registers the refused-connection counter on reg:
//
//	ration_allocator_raft_peer_refused_total{direction}   handshakes failed: in (a peer's connection), out (one this member dialed)
func (s *StreamLayer) RegisterMetrics(reg prometheus.Registerer) error {
	return reg.Register(s.refused)
}

// Addr returns the advertised address.
func (s *StreamLayer) Addr() net.Addr { return s.advertise }

// Accept returns the next incoming connection that passed the handshake.
// After Close it returns net.ErrClosed.
func (s *StreamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.accepted:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting, closes the listener and the connections still
// in their handshake, and waits for its goroutines. Connections already
// handed to raft are raft's to close.
func (s *StreamLayer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	for c := range s.handshake {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// acceptLoop accepts connections and runs each one's handshake on a
// goroutine of its own, so that a slow or silent peer holds up no other.
func (s *StreamLayer) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			// A temporary failure (out of file descriptors): back off.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("cluster: accepting a peer connection", "err", err, "retry_in", delay)
			select {
			case <-s.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.handshake[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			conn, err := s.serverHandshake(c)
			s.mu.Lock()
			delete(s.handshake, c)
			s.mu.Unlock()
			if err != nil {
				c.Close()
				select {
				case <-s.done: // cut short by Close: not the peer's failure
				default:
					s.refuse("in", c.RemoteAddr(), err)
				}
				return
			}
			select {
			case s.accepted <- conn:
			case <-s.done:
				conn.Close()
			}
		}()
	}
}

// refuse counts and logs a failed handshake.
func (s *StreamLayer) refuse(direction string, peer net.Addr, err error) {
	s.refused.WithLabelValues(direction).Inc()
	if n := s.refusedN.Add(1); n&(n-1) == 0 || n%1000 == 0 {
		s.log.Warn("cluster: refused a peer connection", "direction", direction, "peer", peer.String(), "err", err, "refused_total", n)
	}
}

// Dial connects to a peer and runs the handshake; its error wraps
// ErrPeerRefused when the peer failed it or refused this member.
func (s *StreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", string(address))
	if err != nil {
		return nil, err
	}
	conn, err := s.clientHandshake(c, string(address))
	if err != nil {
		c.Close()
		s.refuse("out", c.RemoteAddr(), err)
		return nil, err
	}
	return conn, nil
}

// The handshake, after TLS when on. Client (the dialer) and server:
//
//	client: magic, mode, client nonce       (hello)
//	server: magic, mode, server nonce, server proof
//	client: client proof                    (if the server's proof is good)
//	server: 'Y' (accepted) or 'N'
//
// mode is 1 with tokens, 0 without (then the proofs are absent); both
// sides must agree. A proof is HMAC-SHA256(token, role || client nonce ||
// server nonce || binding), binding being the TLS session's exported
// keying material (empty without TLS).
const (
	handshakeMagic = "RATNRFT1"
	nonceLen       = 32
	proofLen       = sha256.Size
	tlsExporter    = "EXPORTER-ration-raft-peer-auth"
)

func (s *StreamLayer) mode() byte {
	if len(s.tokens) > 0 {
		return 1
	}
	return 0
}

// proof is the HMAC of role, the nonces and binding under token.
func proof(token []byte, role string, nc, ns, binding []byte) []byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(role))
	m.Write(nc)
	m.Write(ns)
	m.Write(binding)
	return m.Sum(nil)
}

// proves reports whether p is the proof of one of s's tokens. It checks
// every token, so the time taken does not say which matched.
func (s *StreamLayer) proves(p []byte, role string, nc, ns, binding []byte) bool {
	ok := false
	for _, t := range s.tokens {
		ok = hmac.Equal(p, proof(t, role, nc, ns, binding)) || ok
	}
	return ok
}

// secure wraps c in TLS when configured and returns the connection to use
// and the channel binding.
func secure(ctx context.Context, c net.Conn, conf *tls.Config, server bool, host string) (net.Conn, []byte, error) {
	if conf == nil {
		return c, nil, nil
	}
	var tc *tls.Conn
	if server {
		tc = tls.Server(c, conf)
	} else {
		if conf.ServerName == "" {
			conf = conf.Clone()
			conf.ServerName = host
		}
		tc = tls.Client(c, conf)
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, nil, fmt.Errorf("%w: TLS: %w", ErrPeerRefused, err)
	}
	st := tc.ConnectionState()
	binding, err := st.ExportKeyingMaterial(tlsExporter, nil, 32)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: TLS keying material: %w", ErrPeerRefused, err)
	}
	return tc, binding, nil
}

func nonce() []byte {
	b := make([]byte, nonceLen)
	rand.Read(b) // never fails (crypto/rand)
	return b
}

// start sets raw's deadline for the handshake and wraps it in TLS when
// configured (conf; host is the name a client verifies).
func (s *StreamLayer) start(raw net.Conn, conf *tls.Config, server bool, host string) (net.Conn, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	raw.SetDeadline(time.Now().Add(s.timeout))
	return secure(ctx, raw, conf, server, host)
}

// head is a hello or a challenge's head: magic, mode, nonce.
func (s *StreamLayer) head(nonce []byte) []byte {
	return append(append([]byte(handshakeMagic), s.mode()), nonce...)
}

// readHead reads the peer's head (what: "hello" or "challenge"), checks
// its magic and mode, and returns its nonce.
func (s *StreamLayer) readHead(c net.Conn, what string) ([]byte, error) {
	h := make([]byte, len(handshakeMagic)+1+nonceLen)
	if _, err := io.ReadFull(c, h); err != nil {
		return nil, fmt.Errorf("%w: reading the %s (closed early: another mode, or not a ration raft peer?): %w", ErrPeerRefused, what, err)
	}
	if !bytes.Equal(h[:len(handshakeMagic)], []byte(handshakeMagic)) {
		return nil, fmt.Errorf("%w: not a ration raft peer (bad magic)", ErrPeerRefused)
	}
	if m := h[len(handshakeMagic)]; m != s.mode() {
		return nil, fmt.Errorf("%w: peer authentication mode %d, this member's %d (a cluster token on one side only?)", ErrPeerRefused, m, s.mode())
	}
	return h[len(handshakeMagic)+1:], nil
}

// readProof reads the peer's proof and reports whether it proves one of
// s's tokens in role.
func (s *StreamLayer) readProof(c net.Conn, role string, nc, ns, binding []byte) (bool, error) {
	p := make([]byte, proofLen)
	if _, err := io.ReadFull(c, p); err != nil {
		return false, fmt.Errorf("%w: reading the %s's proof: %w", ErrPeerRefused, role, err)
	}
	return s.proves(p, role, nc, ns, binding), nil
}

func (s *StreamLayer) serverHandshake(raw net.Conn) (net.Conn, error) {
	c, binding, err := s.start(raw, s.serverTLS, true, "")
	if err != nil {
		return nil, err
	}
	nc, err := s.readHead(c, "hello")
	if err != nil {
		return nil, err
	}
	ns := nonce()
	reply := s.head(ns)
	if s.mode() == 1 {
		reply = append(reply, proof(s.tokens[0], "server", nc, ns, binding)...)
	}
	if _, err := c.Write(reply); err != nil {
		return nil, fmt.Errorf("%w: writing the challenge: %w", ErrPeerRefused, err)
	}
	verdict := byte('Y')
	var refusal error
	if s.mode() == 1 {
		ok, err := s.readProof(c, "client", nc, ns, binding)
		if err != nil {
			return nil, err
		}
		if !ok {
			verdict, refusal = 'N', fmt.Errorf("%w: the peer proved no accepted cluster token", ErrPeerRefused)
		}
	}
	if _, err := c.Write([]byte{verdict}); err != nil && refusal == nil {
		return nil, fmt.Errorf("%w: writing the verdict: %w", ErrPeerRefused, err)
	}
	if refusal != nil {
		return nil, refusal
	}
	raw.SetDeadline(time.Time{})
	return c, nil
}

func (s *StreamLayer) clientHandshake(raw net.Conn, address string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	c, binding, err := s.start(raw, s.clientTLS, false, host)
	if err != nil {
		return nil, err
	}
	nc := nonce()
	if _, err := c.Write(s.head(nc)); err != nil {
		return nil, fmt.Errorf("%w: writing the hello: %w", ErrPeerRefused, err)
	}
	ns, err := s.readHead(c, "challenge")
	if err != nil {
		return nil, err
	}
	if s.mode() == 1 {
		ok, err := s.readProof(c, "server", nc, ns, binding)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: the peer at %s proved no accepted cluster token", ErrPeerRefused, address)
		}
		if _, err := c.Write(proof(s.tokens[0], "client", nc, ns, binding)); err != nil {
			return nil, fmt.Errorf("%w: writing the proof: %w", ErrPeerRefused, err)
		}
	}
	v := make([]byte, 1)
	if _, err := io.ReadFull(c, v); err != nil {
		return nil, fmt.Errorf("%w: reading the verdict: %w", ErrPeerRefused, err)
	}
	if v[0] != 'Y' {
		return nil, fmt.Errorf("%w: the peer at %s did not accept this member's cluster token", ErrPeerRefused, address)
	}
	raw.SetDeadline(time.Time{})
	return c, nil
}
