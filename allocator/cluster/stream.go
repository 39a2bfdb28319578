package cluster

import (
	"bufio"
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
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrPeerRefused is wrapped by the error of a peer connection whose
// handshake failed: the other side does not speak this protocol, does not
// prove a peer secret this member accepts, is not a member (an unknown id,
// or a member's id from another address), or refused this member.
var ErrPeerRefused = errors.New("cluster: peer refused")

// Bounds on the connections a StreamLayer accepts.
const (
	// maxHandshakes bounds the incoming connections in their handshake
	// (not yet authenticated) at once, and maxHandshakesPerIP those from
	// one address: a connection beyond either is closed at once, so that
	// a flood of connections that never authenticate holds a few dozen
	// file descriptors, and a flood from one address leaves room for the
	// members' own.
	maxHandshakes      = 64
	maxHandshakesPerIP = 8
	// maxPeerConns bounds the authenticated connections one member may
	// hold open here (raft pools three per peer, plus one per snapshot
	// sent).
	maxPeerConns = 32
	// ioTimeout bounds a request or answer once it has begun, as raft's
	// transport bounds each RPC (NewNetworkTransport).
	ioTimeout = 10 * time.Second
)

// StreamConfig configures a StreamLayer.
type StreamConfig struct {
	// Listener accepts the peers' connections. The caller opens it; the
	// StreamLayer closes it.
	Listener net.Listener
	// Advertise is the address the peers dial to reach this member (its
	// raft.ServerAddress); nil means the listener's address.
	Advertise net.Addr
	// ID is this member's raft server id, which it names in every
	// handshake.
	ID raft.ServerID
	// Members returns the members a peer may be, by id with the raft
	// address each is dialed at: a peer's handshake names its id, which
	// must be listed, and its connection must come from the host of that
	// address (one of the IPs it resolves to; under mutual TLS its
	// certificate must also be valid for that host). A member this one
	// dials must name the id listed at the address dialed.
	Members func() map[raft.ServerID]raft.ServerAddress
	// Tokens are the peers' shared secrets. A member proves it knows
	// Tokens[0] and accepts a peer that proves any of them, so a secret is
	// rotated by adding the new one second everywhere, then first
	// everywhere, then removing the old one. With none, peers prove no
	// secret: mutual TLS authenticates them, or nothing does (development
	// only); both sides must agree on that.
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
	// IdleTimeout is how long an authenticated connection this member
	// accepted may wait between two requests before it is closed; 0 means
	// a minute. Connections this member dialed and left idle for half of
	// it are replaced when next used.
	IdleTimeout time.Duration
	// Logger receives refused connections (sampled) and accept errors;
	// nil discards.
	Logger *slog.Logger
}

// StreamLayer is a raft.StreamLayer over TCP, optionally TLS, on which
// every connection starts with a handshake that authenticates both ends:
// each names its member id and, with peer secrets, proves it knows one by
// HMAC challenge and response (each side sends a random 32-byte nonce and
// proves HMAC-SHA256(secret, role, both nonces, both ids, and over TLS
// the session's exported keying material)), so the secret never crosses
// the wire, a recorded proof is worthless on another connection, and over
// TLS a proof cannot be relayed into another session. Then the acceptor
// checks that the dialer is a member (StreamConfig.Members) and the
// dialer that the acceptor is the member it dialed. A connection that
// fails is closed, logged (the 1st, 2nd, 4th, 8th... and every 1000th)
// and counted; raft never sees it.
//
// After the handshake the layer hands raft one whole request or answer at
// a time, within the bounds of frames.go, and refuses a request that
// names another sender than the connection's member (ErrFrameRefused).
// It bounds the connections in their handshake (maxHandshakes, and
// maxHandshakesPerIP from one address) and the authenticated ones of each
// member (maxPeerConns), and closes idle ones (IdleTimeout).
//
// Without TLS the handshake keeps out processes that do not know the
// secret or are not members (a misconfigured member, another cluster, a
// scanner), but not an attacker on the path, who could take over a
// connection after it: use TLS for that. It is safe for concurrent use.
type StreamLayer struct {
	ln          net.Listener
	advertise   net.Addr
	id          raft.ServerID
	members     func() map[raft.ServerID]raft.ServerAddress
	tokens      [][]byte
	serverTLS   *tls.Config
	clientTLS   *tls.Config
	timeout     time.Duration
	idleTimeout time.Duration
	ioTimeout   time.Duration
	local       net.Addr // the address dialed from: the listener's IP when it listens on one
	log         *slog.Logger
	refused     *prometheus.CounterVec // by direction: in (a peer's connection), out (one this member dialed)
	frames      *prometheus.CounterVec // requests and answers refused after the handshake, by direction
	refusedN    atomic.Uint64          // for log sampling

	accepted chan net.Conn // authenticated incoming connections, for Accept
	done     chan struct{} // closed by Close
	wg       sync.WaitGroup

	mu        sync.Mutex
	handshake map[net.Conn]struct{}          // incoming connections in their handshake, closed by Close
	perIP     map[netip.Addr]int             // of those, how many from each address
	peerConns map[raft.ServerID]int          // authenticated incoming connections by member
	progress  map[raft.ServerAddress]Contact // the latest answers of the members dialed
	closed    bool
}

// Contact is what a member's answers on this member's connections said
// last (StreamLayer.Progress).
type Contact struct {
	At      time.Time // the latest answer to any request
	LastLog uint64    // the last log index its latest successful AppendEntries answer reported
}

var _ raft.StreamLayer = (*StreamLayer)(nil)

// NewStreamLayer starts accepting on cfg.Listener.
func NewStreamLayer(cfg StreamConfig) (*StreamLayer, error) {
	if cfg.Listener == nil {
		return nil, errors.New("cluster: a stream layer needs a listener")
	}
	if cfg.ID == "" || len(cfg.ID) > 255 || cfg.Members == nil {
		return nil, errors.New("cluster: a stream layer needs this member's id (1 to 255 bytes) and the members")
	}
	if (cfg.ServerTLS == nil) != (cfg.ClientTLS == nil) {
		return nil, errors.New("cluster: ServerTLS and ClientTLS go together")
	}
	s := &StreamLayer{ln: cfg.Listener, advertise: cfg.Advertise, id: cfg.ID, members: cfg.Members,
		serverTLS: cfg.ServerTLS, clientTLS: cfg.ClientTLS, timeout: cfg.HandshakeTimeout, idleTimeout: cfg.IdleTimeout,
		ioTimeout: ioTimeout, log: cfg.Logger, accepted: make(chan net.Conn), done: make(chan struct{}),
		handshake: map[net.Conn]struct{}{}, perIP: map[netip.Addr]int{}, peerConns: map[raft.ServerID]int{},
		progress: map[raft.ServerAddress]Contact{}}
	for _, t := range cfg.Tokens {
		if t == "" {
			return nil, errors.New("cluster: an empty peer secret")
		}
		s.tokens = append(s.tokens, []byte(t))
	}
	if cfg.ClientTLS != nil && cfg.ClientTLS.InsecureSkipVerify && len(s.tokens) == 0 {
		return nil, errors.New("cluster: TLS without verifying peers' certificates needs a peer secret to authenticate them")
	}
	if s.advertise == nil {
		s.advertise = s.ln.Addr()
	}
	if tcp, ok := s.advertise.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return nil, fmt.Errorf("cluster: advertise address %s is unspecified: give the address peers dial", tcp)
	}
	if tcp, ok := s.ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsUnspecified() {
		// Dial from the address listened on, so that peers see the
		// connection come from this member's address (a host with several
		// addresses would otherwise pick one by route).
		s.local = &net.TCPAddr{IP: tcp.IP}
	}
	if s.timeout <= 0 {
		s.timeout = 10 * time.Second
	}
	if s.idleTimeout <= 0 {
		s.idleTimeout = time.Minute
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ration_allocator_raft_peer_refused_total",
		Help: "Peer connections refused in the handshake (TLS, peer secret, membership, or too many at once), by direction: in (accepted here), out (dialed from here).",
	}, []string{"direction"})
	s.frames = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ration_allocator_raft_frames_refused_total",
		Help: "Raft requests (in) and answers (out) refused after the handshake: over their bounds, malformed, or naming another sender than the connection's member.",
	}, []string{"direction"})
	for _, d := range []string{"in", "out"} { // exported from the start, at 0
		s.refused.WithLabelValues(d)
		s.frames.WithLabelValues(d)
	}
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

// RegisterMetrics registers the refusal counters on reg:
//
//	ration_allocator_raft_peer_refused_total{direction}     handshakes failed: in (a peer's connection), out (one this member dialed)
//	ration_allocator_raft_frames_refused_total{direction}   requests (in) and answers (out) refused after the handshake
func (s *StreamLayer) RegisterMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{s.refused, s.frames} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Progress returns what the member at addr answered this member last, on
// the connections this member dialed, and whether it ever answered.
func (s *StreamLayer) Progress(addr raft.ServerAddress) (Contact, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.progress[addr]
	return c, ok
}

// answered records an answer from addr (lastLog: a successful
// AppendEntries answer's).
func (s *StreamLayer) answered(addr raft.ServerAddress, a appendResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.progress[addr]
	c.At = time.Now()
	if a.Success {
		c.LastLog = a.LastLog
	}
	s.progress[addr] = c
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

// errTooMany refuses a connection beyond the handshake bounds.
var errTooMany = fmt.Errorf("%w: too many connections in their handshake", ErrPeerRefused)

// acceptLoop accepts connections and runs each one's handshake on a
// goroutine of its own, so that a slow or silent peer holds up no other;
// a connection beyond maxHandshakes, or beyond maxHandshakesPerIP from its
// address, is closed at once.
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
		ip := addrIP(c.RemoteAddr())
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		if len(s.handshake) >= maxHandshakes || s.perIP[ip] >= maxHandshakesPerIP {
			s.mu.Unlock()
			c.Close()
			s.refuse("in", c.RemoteAddr(), errTooMany)
			continue
		}
		s.handshake[c] = struct{}{}
		s.perIP[ip]++
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			conn, err := s.serverHandshake(c)
			s.mu.Lock()
			delete(s.handshake, c)
			if s.perIP[ip]--; s.perIP[ip] == 0 {
				delete(s.perIP, ip)
			}
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

// addrIP is a connection's remote IP (IPv4 unmapped), or the zero Addr.
func addrIP(a net.Addr) netip.Addr {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// refuse counts and logs a failed handshake.
func (s *StreamLayer) refuse(direction string, peer net.Addr, err error) {
	s.refused.WithLabelValues(direction).Inc()
	if n := s.refusedN.Add(1); n&(n-1) == 0 || n%1000 == 0 {
		s.log.Warn("cluster: refused a peer connection", "direction", direction, "peer", peer.String(), "err", err, "refused_total", n)
	}
}

// refuseFrame counts and logs a refused request or answer.
func (s *StreamLayer) refuseFrame(direction, peer string, err error) {
	s.frames.WithLabelValues(direction).Inc()
	if n := s.refusedN.Add(1); n&(n-1) == 0 || n%1000 == 0 {
		s.log.Warn("cluster: refused a peer's frame; connection closed", "direction", direction, "peer", peer, "err", err, "refused_total", n)
	}
}

// admit counts an authenticated connection of peer, unless it holds
// maxPeerConns already; release uncounts one.
func (s *StreamLayer) admit(peer raft.ServerID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peerConns[peer] >= maxPeerConns {
		return false
	}
	s.peerConns[peer]++
	return true
}

func (s *StreamLayer) release(peer raft.ServerID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peerConns[peer]--; s.peerConns[peer] <= 0 {
		delete(s.peerConns, peer)
	}
}

// Dial connects to a peer and runs the handshake; its error wraps
// ErrPeerRefused when the peer failed it or refused this member.
func (s *StreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := s.dial(address, timeout)
	if err != nil {
		return nil, err
	}
	return newOutConn(s, address, c), nil
}

// dial connects and authenticates a connection to address.
func (s *StreamLayer) dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, LocalAddr: s.local}
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
//	client: magic, mode, client nonce, client id       (hello)
//	server: magic, mode, server nonce, server id, server proof
//	client: client proof                               (if the server's proof is good and it is the member dialed)
//	server: 'Y' (accepted) or 'N'                      (the proof is good and the client a member)
//
// An id is its length (one byte) and its bytes. mode is 1 with peer
// secrets, 0 without (then the proofs are absent); both sides must agree.
// A proof is HMAC-SHA256(secret, role || client nonce || server nonce ||
// client id || server id || binding), binding being the TLS session's
// exported keying material (empty without TLS).
const (
	handshakeMagic = "RATNRFT2"
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

// transcript is what a proof covers besides its role: the nonces, the
// ids (each with its length) and the TLS binding.
type transcript struct {
	nc, ns, idc, ids, binding []byte
}

// proof is the HMAC of role and the transcript under token.
func proof(token []byte, role string, tr transcript) []byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(role))
	m.Write(tr.nc)
	m.Write(tr.ns)
	m.Write([]byte{byte(len(tr.idc))})
	m.Write(tr.idc)
	m.Write([]byte{byte(len(tr.ids))})
	m.Write(tr.ids)
	m.Write(tr.binding)
	return m.Sum(nil)
}

// proves reports whether p is the proof of one of s's tokens. It checks
// every token, so the time taken does not say which matched.
func (s *StreamLayer) proves(p []byte, role string, tr transcript) bool {
	ok := false
	for _, t := range s.tokens {
		ok = hmac.Equal(p, proof(t, role, tr)) || ok
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

// head is a hello or a challenge's head: magic, mode, nonce, this
// member's id.
func (s *StreamLayer) head(nonce []byte) []byte {
	b := append(append([]byte(handshakeMagic), s.mode()), nonce...)
	return append(append(b, byte(len(s.id))), s.id...)
}

// readHead reads the peer's head (what: "hello" or "challenge"), checks
// its magic and mode, and returns its nonce and id.
func (s *StreamLayer) readHead(c net.Conn, what string) (nonce, id []byte, err error) {
	h := make([]byte, len(handshakeMagic)+1+nonceLen+1)
	if _, err := io.ReadFull(c, h); err != nil {
		return nil, nil, fmt.Errorf("%w: reading the %s (closed early: another mode, a version before member ids, or not a ration raft peer?): %w", ErrPeerRefused, what, err)
	}
	if !bytes.Equal(h[:len(handshakeMagic)], []byte(handshakeMagic)) {
		return nil, nil, fmt.Errorf("%w: not a ration raft peer of this version (bad magic)", ErrPeerRefused)
	}
	if m := h[len(handshakeMagic)]; m != s.mode() {
		return nil, nil, fmt.Errorf("%w: peer authentication mode %d, this member's %d (a peer secret on one side only?)", ErrPeerRefused, m, s.mode())
	}
	id = make([]byte, h[len(h)-1])
	if _, err := io.ReadFull(c, id); err != nil || len(id) == 0 {
		return nil, nil, fmt.Errorf("%w: reading the %s's member id: %v", ErrPeerRefused, what, err)
	}
	return h[len(handshakeMagic)+1 : len(h)-1], id, nil
}

// readProof reads the peer's proof and reports whether it proves one of
// s's tokens in role.
func (s *StreamLayer) readProof(c net.Conn, role string, tr transcript) (bool, error) {
	p := make([]byte, proofLen)
	if _, err := io.ReadFull(c, p); err != nil {
		return false, fmt.Errorf("%w: reading the %s's proof: %w", ErrPeerRefused, role, err)
	}
	return s.proves(p, role, tr), nil
}

// checkMember reports why the peer that connected from remote and names
// itself id may not be that member, or nil: id is a member, remote's IP
// is one its raft address's host resolves to, and under verified TLS its
// certificate is valid for that host.
func (s *StreamLayer) checkMember(c net.Conn, id raft.ServerID, remote net.Addr) error {
	addr, ok := s.members()[id]
	if !ok {
		return fmt.Errorf("%w: the peer names itself %q, not a member", ErrPeerRefused, id)
	}
	host, _, err := net.SplitHostPort(string(addr))
	if err != nil {
		return fmt.Errorf("%w: member %s's address %q: %w", ErrPeerRefused, id, addr, err)
	}
	ip := addrIP(remote)
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("%w: resolving member %s's host %s: %w", ErrPeerRefused, id, host, err)
	}
	if !slices.ContainsFunc(ips, func(a netip.Addr) bool { return a.Unmap() == ip }) {
		return fmt.Errorf("%w: the peer names itself %s but connects from %s, not from %s's address %s", ErrPeerRefused, id, ip, id, addr)
	}
	if tc, ok := c.(*tls.Conn); ok && s.serverTLS.ClientAuth == tls.RequireAndVerifyClientCert {
		if certs := tc.ConnectionState().PeerCertificates; len(certs) == 0 || certs[0].VerifyHostname(host) != nil {
			return fmt.Errorf("%w: the peer names itself %s but its certificate is not valid for %s", ErrPeerRefused, id, host)
		}
	}
	return nil
}

func (s *StreamLayer) serverHandshake(raw net.Conn) (net.Conn, error) {
	c, binding, err := s.start(raw, s.serverTLS, true, "")
	if err != nil {
		return nil, err
	}
	nc, idc, err := s.readHead(c, "hello")
	if err != nil {
		return nil, err
	}
	tr := transcript{nc: nc, ns: nonce(), idc: idc, ids: []byte(s.id), binding: binding}
	reply := s.head(tr.ns)
	if s.mode() == 1 {
		reply = append(reply, proof(s.tokens[0], "server", tr)...)
	}
	if _, err := c.Write(reply); err != nil {
		return nil, fmt.Errorf("%w: writing the challenge: %w", ErrPeerRefused, err)
	}
	var refusal error
	if s.mode() == 1 {
		ok, err := s.readProof(c, "client", tr)
		if err != nil {
			return nil, err
		}
		if !ok {
			refusal = fmt.Errorf("%w: the peer proved no accepted peer secret", ErrPeerRefused)
		}
	}
	peer := raft.ServerID(idc)
	if refusal == nil {
		refusal = s.checkMember(c, peer, raw.RemoteAddr())
	}
	if refusal == nil && !s.admit(peer) {
		refusal = fmt.Errorf("%w: member %s holds %d connections already", ErrPeerRefused, peer, maxPeerConns)
	}
	verdict := byte('Y')
	if refusal != nil {
		verdict = 'N'
	}
	if _, err := c.Write([]byte{verdict}); err != nil && refusal == nil {
		s.release(peer)
		return nil, fmt.Errorf("%w: writing the verdict: %w", ErrPeerRefused, err)
	}
	if refusal != nil {
		return nil, refusal
	}
	raw.SetDeadline(time.Time{})
	return &inConn{Conn: c, s: s, peer: peer, r: bufio.NewReader(c)}, nil
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
	tr := transcript{nc: nonce(), idc: []byte(s.id), binding: binding}
	if _, err := c.Write(s.head(tr.nc)); err != nil {
		return nil, fmt.Errorf("%w: writing the hello: %w", ErrPeerRefused, err)
	}
	if tr.ns, tr.ids, err = s.readHead(c, "challenge"); err != nil {
		return nil, err
	}
	if s.mode() == 1 {
		ok, err := s.readProof(c, "server", tr)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: the peer at %s proved no accepted peer secret", ErrPeerRefused, address)
		}
	}
	if at, ok := s.members()[raft.ServerID(tr.ids)]; !ok || string(at) != address {
		return nil, fmt.Errorf("%w: the peer at %s names itself %q, not the member there", ErrPeerRefused, address, tr.ids)
	}
	if s.mode() == 1 {
		if _, err := c.Write(proof(s.tokens[0], "client", tr)); err != nil {
			return nil, fmt.Errorf("%w: writing the proof: %w", ErrPeerRefused, err)
		}
	}
	v := make([]byte, 1)
	if _, err := io.ReadFull(c, v); err != nil {
		return nil, fmt.Errorf("%w: reading the verdict: %w", ErrPeerRefused, err)
	}
	if v[0] != 'Y' {
		return nil, fmt.Errorf("%w: the peer at %s refused this member (its peer secret, or not a member there: see its log)", ErrPeerRefused, address)
	}
	raw.SetDeadline(time.Time{})
	return c, nil
}
