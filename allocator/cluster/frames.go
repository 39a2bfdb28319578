package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// What raft's network transport sends after the handshake, and the bounds
// the stream layer holds it to. A request is raft's RPC type (one byte),
// then the request as one msgpack value, then, for InstallSnapshot, the
// snapshot's Size raw bytes; a response is two msgpack values (an error
// string, the response). The stream layer reads each request or response
// whole before raft sees a byte of it, refusing one that declares more
// than its bounds before reading (or allocating for) it, and a request
// whose sender is not the member that connection authenticated as.
const (
	// MaxEntryBytes bounds one log entry's data: a replicated Ledger
	// groups at most maxEntryKeys keys of calls into an entry, which
	// encodes well within it (TestEntryFitsMaxEntryBytes).
	MaxEntryBytes = 2 << 20
	// MaxSnapshotBytes bounds a snapshot a member installs from its
	// leader, and so the state a cluster can hold.
	MaxSnapshotBytes = 1 << 30
	// maxAppendEntries is raft's MaxAppendEntries on every Node: the log
	// entries one AppendEntries carries, so that a frame of them stays
	// within maxAppendFrame.
	maxAppendEntries = 8
	// maxAppendFrame bounds an AppendEntries request: maxAppendEntries
	// entries of MaxEntryBytes, their fields and the request's.
	maxAppendFrame = maxAppendEntries*(MaxEntryBytes+1<<10) + 64<<10
	// maxSmallFrame bounds every other request (votes, a snapshot's
	// header, TimeoutNow) and every response: a few hundred bytes each.
	maxSmallFrame = 64 << 10
	// maxFrameDepth bounds the nesting of a frame's msgpack values (a
	// request nests three deep).
	maxFrameDepth = 16
)

// raft's RPC types (net_transport.go).
const (
	rpcAppendEntries uint8 = iota
	rpcRequestVote
	rpcInstallSnapshot
	rpcTimeoutNow
	rpcRequestPreVote
)

// ErrFrameRefused is wrapped by the error a peer's connection returns to
// raft when the peer sent what the stream layer refuses: a frame over its
// bounds or malformed, an unknown RPC, or an RPC that names another
// sender than the member the connection authenticated as. The connection
// is closed.
var ErrFrameRefused = errors.New("cluster: peer frame refused")

func frameErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrFrameRefused}, args...)...)
}

// frameReader reads msgpack values from r into buf, checking each
// declared length against the frame's bounds before reading it: buf
// grows only as bytes arrive, never to more than max.
type frameReader struct {
	r         *bufio.Reader
	buf       []byte
	max       int // bytes the frame may reach
	maxString int // bytes one str, bin or ext may hold
}

// take reads n more bytes into buf and returns them.
func (f *frameReader) take(n uint64) ([]byte, error) {
	if n > uint64(f.max-len(f.buf)) {
		return nil, frameErr("frame over %d bytes", f.max)
	}
	start, end := len(f.buf), len(f.buf)+int(n)
	for len(f.buf) < end {
		k := min(end-len(f.buf), 64<<10)
		f.buf = slices.Grow(f.buf, k)
		m, err := io.ReadFull(f.r, f.buf[len(f.buf):len(f.buf)+k])
		f.buf = f.buf[:len(f.buf)+m]
		if err != nil {
			return nil, err
		}
	}
	return f.buf[start:], nil
}

// length reads a k-byte big-endian length.
func (f *frameReader) length(k int) (uint64, error) {
	b, err := f.take(uint64(k))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range b {
		n = n<<8 | uint64(c)
	}
	return n, nil
}

// payload reads a str, bin or ext body of n bytes (extra: an ext's type).
func (f *frameReader) payload(n uint64, extra uint64) error {
	if n > uint64(f.maxString) {
		return frameErr("a string of %d bytes, at most %d", n, f.maxString)
	}
	_, err := f.take(n + extra)
	return err
}

// items reads n values, each at least a byte.
func (f *frameReader) items(n uint64, depth int) error {
	if n > uint64(f.max-len(f.buf)) {
		return frameErr("%d items declared in a frame of at most %d bytes", n, f.max)
	}
	for range n {
		if err := f.value(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// sized reads a length of k bytes and then what it sizes: a payload
// (extra bytes more for an ext's type) or items (per entries each).
func (f *frameReader) sized(k int, extra uint64, per uint64, depth int) error {
	n, err := f.length(k)
	if err != nil {
		return err
	}
	if per == 0 {
		return f.payload(n, extra)
	}
	if n > uint64(f.max) {
		return frameErr("%d items declared in a frame of at most %d bytes", n, f.max)
	}
	return f.items(n*per, depth)
}

// value reads one msgpack value (see the msgpack specification's format
// table).
func (f *frameReader) value(depth int) error {
	if depth > maxFrameDepth {
		return frameErr("nested deeper than %d", maxFrameDepth)
	}
	b, err := f.take(1)
	if err != nil {
		return err
	}
	switch t := b[0]; {
	case t <= 0x7f || t >= 0xe0: // fixint
		return nil
	case t <= 0x8f: // fixmap
		return f.items(2*uint64(t&0x0f), depth)
	case t <= 0x9f: // fixarray
		return f.items(uint64(t&0x0f), depth)
	case t <= 0xbf: // fixstr
		return f.payload(uint64(t&0x1f), 0)
	}
	switch t := b[0]; t {
	case 0xc0, 0xc2, 0xc3: // nil, false, true
		return nil
	case 0xc4, 0xd9: // bin 8, str 8
		return f.sized(1, 0, 0, depth)
	case 0xc5, 0xda: // bin 16, str 16
		return f.sized(2, 0, 0, depth)
	case 0xc6, 0xdb: // bin 32, str 32
		return f.sized(4, 0, 0, depth)
	case 0xc7, 0xc8, 0xc9: // ext 8, 16, 32: length, type, data
		return f.sized(1<<(t-0xc7), 1, 0, depth)
	case 0xca, 0xce, 0xd2: // float 32, uint 32, int 32
		_, err = f.take(4)
	case 0xcb, 0xcf, 0xd3: // float 64, uint 64, int 64
		_, err = f.take(8)
	case 0xcc, 0xd0: // uint 8, int 8
		_, err = f.take(1)
	case 0xcd, 0xd1: // uint 16, int 16
		_, err = f.take(2)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1 to 16, after its type
		_, err = f.take(1 + 1<<(t-0xd4))
	case 0xdc, 0xdd: // array 16, 32
		return f.sized(2<<(t-0xdc), 0, 1, depth)
	case 0xde, 0xdf: // map 16, 32
		return f.sized(2<<(t-0xde), 0, 2, depth)
	default: // 0xc1, never used
		return frameErr("msgpack tag %#x", t)
	}
	return err
}

// rpcHead is what the stream layer reads of a request: its sender and,
// for InstallSnapshot, the snapshot's size. raft's requests embed
// RPCHeader, which msgpack encodes inline, as this does.
type rpcHead struct {
	raft.RPCHeader
	Size int64
}

// appendResult is what the stream layer reads of an AppendEntries
// response: how far the follower's log reaches (Node.AddMember's catch-up).
type appendResult struct {
	LastLog uint64
	Success bool
}

func decodeMsgpack(b []byte, v any) error {
	if err := codec.NewDecoderBytes(b, &codec.MsgpackHandle{}).Decode(v); err != nil {
		return frameErr("decoding: %v", err)
	}
	return nil
}

// inConn is a connection a peer dialed, past the handshake: it hands raft
// one whole, checked request at a time (see readRequest). Between
// requests it waits at most the idle timeout, after which it answers raft
// io.EOF (raft closes it quietly; the peer's side redials, see outConn);
// once a request has begun, it must arrive within the I/O timeout.
type inConn struct {
	net.Conn
	s      *StreamLayer
	peer   raft.ServerID
	r      *bufio.Reader
	frame  []byte // the current request, checked, from off on not yet read by raft
	off    int
	stream int64 // snapshot bytes still to pass through
	once   sync.Once
}

func (c *inConn) Read(p []byte) (int, error) {
	if c.off == len(c.frame) && c.stream == 0 {
		if err := c.readRequest(); err != nil {
			return 0, err
		}
	}
	if c.off < len(c.frame) {
		n := copy(p, c.frame[c.off:])
		c.off += n
		return n, nil
	}
	c.Conn.SetReadDeadline(time.Now().Add(c.s.ioTimeout))
	n, err := c.r.Read(p[:min(int64(len(p)), c.stream)])
	c.stream -= int64(n)
	return n, err
}

func (c *inConn) Write(p []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(c.s.ioTimeout))
	return c.Conn.Write(p)
}

// readRequest reads the next request whole and checks it: its RPC type,
// its size against that type's bound, and that it names the connection's
// member as its sender (RPCHeader.ID: a leader's, a candidate's id), so
// that one member cannot speak for another or for a stranger (a "leader"
// that is no member). A refusal closes the connection.
func (c *inConn) readRequest() error {
	c.Conn.SetReadDeadline(time.Now().Add(c.s.idleTimeout))
	t, err := c.r.ReadByte()
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return io.EOF // idle: closed quietly
		}
		return err
	}
	c.Conn.SetReadDeadline(time.Now().Add(c.s.ioTimeout))
	f := frameReader{r: c.r, buf: c.frame[:0], max: maxSmallFrame, maxString: maxSmallFrame}
	switch t {
	case rpcAppendEntries:
		f.max, f.maxString = maxAppendFrame, MaxEntryBytes
	case rpcRequestVote, rpcRequestPreVote, rpcInstallSnapshot, rpcTimeoutNow:
	default:
		return c.refuse(frameErr("unknown RPC type %d", t))
	}
	f.buf = append(f.buf, t)
	if err := f.value(0); err != nil {
		if errors.Is(err, ErrFrameRefused) {
			return c.refuse(err)
		}
		return err
	}
	var h rpcHead
	if err := decodeMsgpack(f.buf[1:], &h); err != nil {
		return c.refuse(err)
	}
	if raft.ServerID(h.ID) != c.peer {
		return c.refuse(frameErr("RPC type %d from member %s names %q as its sender", t, c.peer, h.ID))
	}
	if t == rpcInstallSnapshot {
		if h.Size < 0 || h.Size > MaxSnapshotBytes {
			return c.refuse(frameErr("a snapshot of %d bytes, at most %d", h.Size, MaxSnapshotBytes))
		}
		c.stream = h.Size
	}
	c.frame, c.off = f.buf, 0
	return nil
}

func (c *inConn) refuse(err error) error {
	c.s.refuseFrame("in", string(c.peer), err)
	c.Conn.Close()
	return err
}

func (c *inConn) Close() error {
	c.once.Do(func() { c.s.release(c.peer) })
	return c.Conn.Close()
}

// outConn is a connection this member dialed, past the handshake: raft
// sends requests on it and reads the answers, which it hands raft one
// whole, checked response at a time; the last log index an AppendEntries
// response reports, and the time of every answer, go to the layer's
// progress (Progress). A connection that sat idle for half the idle
// timeout, which raft keeps in its pool, is replaced by a new one (dialed
// and authenticated again) when raft sends on it next: the peer closes
// idle connections at the idle timeout, and a request sent on a closed one
// would fail, costing raft a vote or a backoff.
type outConn struct {
	s    *StreamLayer
	addr raft.ServerAddress

	mu       sync.Mutex // guards conn against Close from raft's other goroutines
	conn     net.Conn
	r        *bufio.Reader
	deadline time.Time // the last deadline raft set, for a new connection
	last     time.Time // when the last answer was read (or the connection made)
	inRPC    bool      // a request was sent and its answer not read yet
	rpc      uint8     // its type
	resp     []byte    // the current answer, checked, from off on not yet read by raft
	off      int
}

func newOutConn(s *StreamLayer, addr raft.ServerAddress, conn net.Conn) *outConn {
	return &outConn{s: s, addr: addr, conn: conn, r: bufio.NewReader(conn), last: time.Now()}
}

func (c *outConn) current() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

func (c *outConn) Write(p []byte) (int, error) {
	if !c.inRPC && len(p) > 0 {
		if time.Since(c.last) > c.s.idleTimeout/2 {
			if err := c.redial(); err != nil {
				return 0, err
			}
		}
		c.inRPC, c.rpc = true, p[0]
	}
	return c.current().Write(p)
}

// redial replaces the connection with a new one to the same peer.
func (c *outConn) redial() error {
	fresh, err := c.s.dial(c.addr, c.s.ioTimeout)
	if err != nil {
		return err
	}
	c.mu.Lock()
	old := c.conn
	c.conn, c.r, c.last = fresh, bufio.NewReader(fresh), time.Now()
	if !c.deadline.IsZero() {
		fresh.SetDeadline(c.deadline)
	}
	c.mu.Unlock()
	old.Close()
	return nil
}

func (c *outConn) Read(p []byte) (int, error) {
	if c.off == len(c.resp) {
		if err := c.readResponse(); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.resp[c.off:])
	c.off += n
	return n, nil
}

// readResponse reads the answer to the request sent: two values, each
// within maxSmallFrame.
func (c *outConn) readResponse() error {
	if !c.inRPC {
		return frameErr("an answer from %s with no request sent", c.addr)
	}
	f := frameReader{r: c.r, buf: c.resp[:0], max: maxSmallFrame, maxString: maxSmallFrame}
	if err := f.value(0); err != nil {
		return c.refuse(err)
	}
	start := len(f.buf)
	f.max += start
	if err := f.value(0); err != nil {
		return c.refuse(err)
	}
	var a appendResult
	if c.rpc == rpcAppendEntries {
		if err := decodeMsgpack(f.buf[start:], &a); err != nil {
			return c.refuse(err)
		}
	}
	c.s.answered(c.addr, a)
	c.resp, c.off = f.buf, 0
	c.inRPC, c.last = false, time.Now()
	return nil
}

func (c *outConn) refuse(err error) error {
	if errors.Is(err, ErrFrameRefused) {
		c.s.refuseFrame("out", string(c.addr), err)
	}
	c.current().Close()
	return err
}

func (c *outConn) Close() error { return c.current().Close() }

func (c *outConn) LocalAddr() net.Addr  { return c.current().LocalAddr() }
func (c *outConn) RemoteAddr() net.Addr { return c.current().RemoteAddr() }

func (c *outConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.current().SetDeadline(t)
}

func (c *outConn) SetReadDeadline(t time.Time) error  { return c.current().SetReadDeadline(t) }
func (c *outConn) SetWriteDeadline(t time.Time) error { return c.current().SetWriteDeadline(t) }

var _ net.Conn = (*outConn)(nil)
