package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

// Log entries. An entry is a group of ledger commands applied in order:
// its version byte, the number of commands, then each command
// (ledger.EncodeCommand) prefixed with its length, all as uvarints.
const entryVersion = 1

// maxEntryCommands bounds the commands of one entry.
const maxEntryCommands = 1 << 16

// ErrBadEntry is returned (as the Apply response, on every replica alike)
// for a log entry that does not decode. Nothing of it is applied.
var ErrBadEntry = errors.New("cluster: malformed log entry")

// encodeEntry encodes cmds as one log entry.
func encodeEntry(cmds []ledger.Command) ([]byte, error) {
	if len(cmds) == 0 || len(cmds) > maxEntryCommands {
		return nil, fmt.Errorf("cluster: %d commands in one entry, want 1 to %d", len(cmds), maxEntryCommands)
	}
	b := binary.AppendUvarint([]byte{entryVersion}, uint64(len(cmds)))
	for i, c := range cmds {
		cb, err := ledger.EncodeCommand(c)
		if err != nil {
			return nil, fmt.Errorf("cluster: command %d: %w", i, err)
		}
		b = binary.AppendUvarint(b, uint64(len(cb)))
		b = append(b, cb...)
	}
	if len(b) > MaxEntryBytes {
		return nil, fmt.Errorf("cluster: an entry of %d bytes, at most %d (a StreamLayer refuses more)", len(b), MaxEntryBytes)
	}
	return b, nil
}

// DecodeEntry returns the commands of a log entry (the Data of a
// raft.LogCommand entry), for tools that read a member's raft log: the
// fault suite replays the logs of real members through an FSM to check
// that no call was applied twice. An entry that does not decode is an
// error wrapping ErrBadEntry.
func DecodeEntry(data []byte) ([]ledger.Command, error) { return decodeEntry(data) }

// decodeEntry decodes a whole entry, or fails without a command.
func decodeEntry(b []byte) ([]ledger.Command, error) {
	if len(b) == 0 || b[0] != entryVersion {
		return nil, fmt.Errorf("%w: version", ErrBadEntry)
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n == 0 || n > maxEntryCommands {
		return nil, fmt.Errorf("%w: command count", ErrBadEntry)
	}
	b = b[k:]
	cmds := make([]ledger.Command, 0, min(n, uint64(len(b))))
	for i := range n {
		m, k := binary.Uvarint(b)
		if k <= 0 || m > uint64(len(b)-k) {
			return nil, fmt.Errorf("%w: command %d length", ErrBadEntry, i)
		}
		c, err := ledger.DecodeCommand(b[k : k+int(m)])
		if err != nil {
			return nil, fmt.Errorf("%w: command %d: %w", ErrBadEntry, i, err)
		}
		cmds = append(cmds, c)
		b = b[k+int(m):]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: trailing bytes", ErrBadEntry)
	}
	return cmds, nil
}

// Result is one command's outcome: what ledger.State.Apply returned.
// Reply is the caller's own copy.
type Result struct {
	Reply   any            // *ledger.AcquireReply, *ledger.ReserveReply, *ledger.ReleaseReply or *ledger.SweepReply
	Changed ledger.Changes // the records the command changed; empty for a retry answered from its session
	Err     error
}

// FSM is the raft state machine: a ledger.State that applies the commands
// of committed log entries in log order. Replicas that apply the same
// entries hold the same state, byte for byte (ledger.State.Snapshot).
//
// Time comes from the commands: each carries its Now, set by whoever
// proposed it, and is applied at max(its Now, the latest Now applied
// before it) (see clampNow), so the applied time never goes back. The FSM
// never reads a clock; the instant a snapshot is restored at is the latest
// Now the FSM had applied when it was taken.
type FSM struct {
	cfg ledger.Config

	mu    sync.Mutex // guards state and now (raft applies on its goroutine, readers read on theirs), and writes to index
	state *ledger.State
	now   bucket.Instant // the latest Now applied (or restored): the floor for the next command's

	// index is the last log index applied (or restored); written under mu,
	// read without it too, so that readiness and metrics never wait for an
	// Apply in progress.
	index    atomic.Uint64
	restores atomic.Int64 // snapshots restored, for tests and metrics
}

// NewFSM returns an FSM with an empty state under cfg. Every replica must
// use the same cfg.
func NewFSM(cfg ledger.Config) (*FSM, error) {
	st, err := ledger.New(cfg)
	if err != nil {
		return nil, err
	}
	return &FSM{cfg: cfg, state: st}, nil
}

var _ raft.FSM = (*FSM)(nil)

// Apply applies one committed entry: its commands in order. The response
// is []Result, one per command, or an error wrapping ErrBadEntry when the
// entry does not decode (then nothing is applied).
func (f *FSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index.Store(max(f.index.Load(), l.Index))
	if l.Type != raft.LogCommand {
		return nil
	}
	cmds, err := decodeEntry(l.Data)
	if err != nil {
		return err
	}
	res := make([]Result, len(cmds))
	for i, c := range cmds {
		c, f.now = clampNow(c, f.now)
		reply, changed, err := f.state.Apply(c)
		res[i] = Result{Reply: cloneReply(reply), Changed: changed, Err: err}
	}
	return res
}

// Admit returns the error applying cmd would return from the state's
// checks of its spender id, exactly-once record and quota
// (ledger.State.Admit), without applying it: a leader refuses such calls
// before they take log space.
func (f *FSM) Admit(cmd ledger.Command) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.Admit(cmd)
}

// clampNow returns c as the FSM applies it, at max(c's Now, floor), with
// that instant; floor is the latest Now applied before c. This is the one
// place the rule lives: the applied Now never goes back, even when a new
// leader's clock is behind the commands its predecessor proposed, so no
// lease or holding gets an instant earlier than one already applied. It
// depends only on the log, so every replica applies the same commands.
func clampNow(c ledger.Command, floor bucket.Instant) (ledger.Command, bucket.Instant) {
	switch c := c.(type) {
	case ledger.Acquire:
		c.Now = max(c.Now, floor)
		return c, c.Now
	case ledger.ReserveAhead:
		c.Now = max(c.Now, floor)
		return c, c.Now
	case ledger.Release:
		c.Now = max(c.Now, floor)
		return c, c.Now
	case ledger.Sweep:
		c.Now = max(c.Now, floor)
		return c, c.Now
	}
	return c, floor
}

// cloneReply copies a reply the state keeps (a session's stored reply,
// which a later retry refreshes in place) for the caller, who reads it on
// another goroutine.
func cloneReply(r any) any {
	switch r := r.(type) {
	case *ledger.AcquireReply:
		c := *r
		c.Keys = slices.Clone(r.Keys)
		return &c
	case *ledger.ReserveReply:
		c := *r
		c.Keys = slices.Clone(r.Keys)
		return &c
	case *ledger.ReleaseReply:
		c := *r
		c.Returned = slices.Clone(r.Returned)
		return &c
	case *ledger.SweepReply:
		c := *r
		return &c
	}
	return r
}

// Snapshot captures the state for raft (called on raft's FSM goroutine,
// between Applies); Persist writes it while Applies continue.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{b: f.encode()}, nil
}

// encode returns the state in the snapshot format, with the last index
// and the latest Now applied.
func (f *FSM) encode() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return appendSnapshot(nil, f.index.Load(), f.now, f.state.Snapshot())
}

// Snapshot format: version byte, last applied index and latest Now as
// varints, then the state (ledger.State.Snapshot, a record batch).
const snapshotVersion = 1

func appendSnapshot(b []byte, index uint64, now bucket.Instant, state []byte) []byte {
	b = append(b, snapshotVersion)
	b = binary.AppendUvarint(b, index)
	b = binary.AppendVarint(b, int64(now))
	return append(b, state...)
}

// Restore replaces the state with a snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("cluster: read snapshot: %w", err)
	}
	index, now, st, err := parseSnapshot(f.cfg, b)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state, f.now = st, now
	f.index.Store(index)
	f.restores.Add(1)
	return nil
}

// parseSnapshot decodes a snapshot (appendSnapshot's format) into a state
// under cfg, with its index and instant.
func parseSnapshot(cfg ledger.Config, b []byte) (index uint64, now bucket.Instant, st *ledger.State, err error) {
	index, now, state, err := splitSnapshot(b)
	if err != nil {
		return 0, 0, nil, err
	}
	st, err = ledger.Restore(cfg, state, now)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("cluster: restore snapshot: %w", err)
	}
	return index, now, st, nil
}

// splitSnapshot returns a snapshot's index, instant and encoded state.
func splitSnapshot(b []byte) (index uint64, now bucket.Instant, state []byte, err error) {
	if len(b) == 0 || b[0] != snapshotVersion {
		return 0, 0, nil, errors.New("cluster: snapshot version")
	}
	b = b[1:]
	index, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, 0, nil, errors.New("cluster: snapshot index")
	}
	b = b[k:]
	at, k := binary.Varint(b)
	if k <= 0 {
		return 0, 0, nil, errors.New("cluster: snapshot instant")
	}
	return index, bucket.Instant(at), b[k:], nil
}

// StateSnapshot returns the current state as ledger.State.Snapshot
// encodes it, with the last log index applied.
func (f *FSM) StateSnapshot() (state []byte, index uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.Snapshot(), f.index.Load()
}

// Stats returns the state's counts (ledger.State.Stats; it walks every
// key, so call it at scrape rate). It waits for an Apply in progress.
func (f *FSM) Stats() ledger.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.Stats()
}

// AppliedNow returns the latest Now the FSM has applied (or restored):
// a command proposed at an earlier instant is applied at this one
// (clampNow). 0 before any command. It waits for an Apply in progress.
func (f *FSM) AppliedNow() bucket.Instant {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// AppliedIndex returns the last log index the FSM has applied or
// restored. It does not wait for an Apply in progress.
func (f *FSM) AppliedIndex() uint64 { return f.index.Load() }

// Restores returns how many snapshots the FSM has restored.
func (f *FSM) Restores() int { return int(f.restores.Load()) }

type fsmSnapshot struct{ b []byte }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s.b); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}
