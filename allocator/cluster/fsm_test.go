package cluster

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
)

func TestEntryRoundTrip(t *testing.T) {
	w := newWorkload(t)
	cmds := []ledger.Command{w.next(), w.next(), ledger.Sweep{Now: 5}, w.next()}
	b, err := encodeEntry(cmds)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeEntry(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cmds) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, cmds)
	}
	for n := range len(b) {
		if _, err := decodeEntry(b[:n]); !errors.Is(err, ErrBadEntry) {
			t.Fatalf("prefix %d/%d: err %v", n, len(b), err)
		}
	}
	if _, err := decodeEntry(append(b, 0)); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("trailing byte: err %v", err)
	}
	if _, err := encodeEntry(nil); err == nil {
		t.Fatal("empty entry encoded")
	}
	long := ledger.Acquire{Caller: ledger.Caller{SpenderID: strings.Repeat("x", ration.MaxSpenderIDLen+1)}}
	if _, err := encodeEntry([]ledger.Command{long}); !errors.Is(err, ledger.ErrInvalidArgument) {
		t.Fatalf("over-long spender id: err %v", err)
	}
}

// A malformed entry is refused whole, the same way on every replica: the
// response is an ErrBadEntry error and the state does not change, even
// when the damage is in a later command of the group.
func TestFSMBadEntry(t *testing.T) {
	f, err := NewFSM(ledgerCfg)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorkload(t)
	good, err := encodeEntry([]ledger.Command{w.next(), w.next()})
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), good...)
	bad[len(bad)-1] ^= 0xff // damage the second command's last byte
	before, _ := f.StateSnapshot()
	for _, data := range [][]byte{nil, {0}, {entryVersion}, good[:len(good)-1], bad} {
		resp := f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: data})
		if err, ok := resp.(error); !ok || !errors.Is(err, ErrBadEntry) {
			t.Fatalf("entry %x: response %v", data, resp)
		}
	}
	if after, _ := f.StateSnapshot(); !bytes.Equal(after, before) {
		t.Fatal("a bad entry changed the state")
	}
	if res, ok := f.Apply(&raft.Log{Index: 2, Type: raft.LogCommand, Data: good}).([]Result); !ok || len(res) != 2 || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("good entry: %+v", res)
	}
}

type memSink struct {
	bytes.Buffer
	closed, cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

// An FSM snapshot restores into another FSM: the same state bytes, the
// last applied index and the latest Now.
func TestFSMSnapshotRestore(t *testing.T) {
	f, err := NewFSM(ledgerCfg)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorkload(t)
	for i := uint64(1); i <= 20; i++ {
		b, err := encodeEntry([]ledger.Command{w.next()})
		if err != nil {
			t.Fatal(err)
		}
		f.Apply(&raft.Log{Index: i, Type: raft.LogCommand, Data: b})
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil || !sink.closed {
		t.Fatalf("persist: %v (closed %v)", err, sink.closed)
	}
	g, err := NewFSM(ledgerCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	fs, fi := f.StateSnapshot()
	gs, gi := g.StateSnapshot()
	if !bytes.Equal(fs, gs) || fi != gi || fi != 20 || f.now != g.now || g.now != w.now || g.Restores() != 1 {
		t.Fatalf("restored: index %d/%d, now %d/%d (want %d), equal state %v", gi, fi, g.now, f.now, w.now, bytes.Equal(fs, gs))
	}
	for _, bad := range [][]byte{nil, {snapshotVersion + 1}, {snapshotVersion}, {snapshotVersion, 1}, append(sink.Bytes()[:len(sink.Bytes()):len(sink.Bytes())], 0xff)} {
		if err := g.Restore(io.NopCloser(bytes.NewReader(bad))); err == nil {
			t.Fatalf("snapshot %x restored", bad)
		}
	}
}

// A single node on raft-boltdb and file snapshots comes back after a
// restart with the state it had (from its snapshot and its log), and its
// raft logs reach slog.
func TestNodeRestartBolt(t *testing.T) {
	dir := t.TempDir()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	start := func() *Node {
		_, tr := raft.NewInmemTransport("solo")
		nd, err := New("solo", tr, ledgerCfg, WithBoltStore(filepath.Join(dir, "raft.db")), WithFileSnapshots(dir, 2),
			WithLogger(logger), WithRaftConfig(fastRaft), WithRaftConfig(func(c *raft.Config) { c.SnapshotThreshold = 1 << 20 }))
		if err != nil {
			t.Fatal(err)
		}
		return nd
	}
	waitLeader := func(nd *Node) {
		deadline := time.Now().Add(waitFor)
		for !nd.IsLeader() {
			if time.Now().After(deadline) {
				t.Fatal("no leader")
			}
			time.Sleep(2 * time.Millisecond) // poll interval
		}
	}
	nd := start()
	if err := nd.Bootstrap(raft.Server{ID: nd.ID(), Address: nd.Addr()}); err != nil {
		t.Fatal(err)
	}
	waitLeader(nd)
	w := newWorkload(t)
	apply := func(n int) {
		for range n {
			cmd := w.next()
			r, err := nd.Apply(context.Background(), cmd)
			if err != nil {
				t.Fatal(err)
			}
			if want, _, _ := w.ref.Apply(cmd); !reflect.DeepEqual(r, want) {
				t.Fatalf("reply %+v, reference %+v", r, want)
			}
		}
	}
	apply(10)
	if err := nd.Snapshot(); err != nil {
		t.Fatal(err)
	}
	apply(5) // after the snapshot: only in the log
	want, wantIdx := nd.FSM().StateSnapshot()
	if err := nd.Shutdown(); err != nil {
		t.Fatal(err)
	}

	nd = start()
	defer nd.Shutdown()
	if err := nd.Bootstrap(raft.Server{ID: nd.ID(), Address: nd.Addr()}); !errors.Is(err, raft.ErrCantBootstrap) {
		t.Fatalf("bootstrap on existing state: %v", err)
	}
	if nd.FSM().Restores() != 1 {
		t.Fatalf("restores at start: %d", nd.FSM().Restores())
	}
	waitLeader(nd)
	deadline := time.Now().Add(waitFor)
	for nd.FSM().AppliedIndex() < wantIdx {
		if time.Now().After(deadline) {
			t.Fatalf("applied %d of %d after restart", nd.FSM().AppliedIndex(), wantIdx)
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
	if got, _ := nd.FSM().StateSnapshot(); !bytes.Equal(got, want) {
		t.Fatal("state after restart differs")
	}
	w.check(want)
	apply(3)
	if !strings.Contains(logs.String(), "node=solo") || !strings.Contains(logs.String(), "entering leader state") {
		t.Fatalf("raft's logs did not reach slog:\n%s", logs.String())
	}
}
