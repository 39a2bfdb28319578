package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

// ErrBadBackup is wrapped by RestoreBackup's error for a backup it
// refuses: not a backup, damaged (its checksum), or implausible (its
// index, or its instant ahead of the leader's clock); nothing changed.
var ErrBadBackup = errors.New("cluster: backup refused")

// A backup is a header, then the FSM's snapshot format (a version byte,
// the last log index applied, the latest Now applied, then the ledger's
// state):
//
//	"RATNBKP1"   magic
//	uint64       the snapshot's length, big-endian
//	[32]byte     its SHA-256
//	snapshot
//
// so that a restore refuses a backup cut short, extended or with any
// byte changed before it reads a record of it.
const (
	backupMagic  = "RATNBKP1"
	backupHeader = len(backupMagic) + 8 + sha256.Size
	// maxBackupIndex bounds a backup's log index: a cluster appending a
	// million entries a second would reach it after eight years. The
	// index is not given to raft (the restore goes in at the leader's
	// next index), but one beyond it says the backup is not what it
	// claims.
	maxBackupIndex = 1 << 48
)

// Backup returns this member's applied state as a backup (see above).
// Taken on the leader it holds every call answered so far. It waits for
// an Apply in progress, not for raft.
func (n *Node) Backup() []byte { return sealBackup(n.fsm.encode()) }

func sealBackup(snap []byte) []byte {
	b := make([]byte, 0, backupHeader+len(snap))
	b = append(b, backupMagic...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(snap)))
	sum := sha256.Sum256(snap)
	b = append(b, sum[:]...)
	return append(b, snap...)
}

// ErrBackupTooLarge is wrapped by ReadBackupFrom's error for a backup
// whose header declares more than it accepts.
var ErrBackupTooLarge = errors.New("cluster: backup too large")

// ReadBackupFrom reads a backup from r, at most max bytes: it reads the
// header first and refuses a backup that declares more (ErrBackupTooLarge)
// before reading any of it, then reads exactly what the header declares,
// into memory of that size, and refuses bytes beyond it (ErrBadBackup).
// It does not check the checksum (ReadBackup, RestoreBackup do).
func ReadBackupFrom(r io.Reader, max int64) ([]byte, error) {
	head := make([]byte, backupHeader)
	k, err := io.ReadFull(r, head)
	if m := min(k, len(backupMagic)); string(head[:m]) != backupMagic[:m] || k == 0 {
		return nil, fmt.Errorf("%w: not a ration backup (no %q header)", ErrBadBackup, backupMagic)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading its header: %w (cut short?)", ErrBadBackup, err)
	}
	n := binary.BigEndian.Uint64(head[len(backupMagic):])
	if n > uint64(max-int64(backupHeader)) {
		return nil, fmt.Errorf("%w: it declares %d bytes, at most %d", ErrBackupTooLarge, n, max-int64(backupHeader))
	}
	b := make([]byte, backupHeader+int(n))
	copy(b, head)
	if _, err := io.ReadFull(r, b[backupHeader:]); err != nil {
		return nil, fmt.Errorf("%w: %d bytes declared: %w (cut short?)", ErrBadBackup, n, err)
	}
	if k, _ := r.Read(make([]byte, 1)); k > 0 {
		return nil, fmt.Errorf("%w: more than the %d bytes its header declares (extended)", ErrBadBackup, n)
	}
	return b, nil
}

// BackupContents is what a backup holds.
type BackupContents struct {
	Index uint64         // the last log index the member had applied
	Now   bucket.Instant // the latest Now it had applied
	State []byte         // the ledger's state, as ledger.State.Snapshot encodes it
}

// Encode returns c as a backup, the format ReadBackup reads.
func (c BackupContents) Encode() []byte {
	return sealBackup(appendSnapshot(nil, c.Index, c.Now, c.State))
}

// ReadBackup checks a backup's header and checksum and returns what it
// holds; its error wraps ErrBadBackup. It does not decode the state.
func ReadBackup(b []byte) (BackupContents, error) {
	if len(b) < backupHeader || string(b[:len(backupMagic)]) != backupMagic {
		return BackupContents{}, fmt.Errorf("%w: not a ration backup (no %q header)", ErrBadBackup, backupMagic)
	}
	n := binary.BigEndian.Uint64(b[len(backupMagic):])
	snap := b[backupHeader:]
	if n != uint64(len(snap)) {
		return BackupContents{}, fmt.Errorf("%w: %d bytes after the header, which says %d (cut short or extended)", ErrBadBackup, len(snap), n)
	}
	if sum := sha256.Sum256(snap); !bytes.Equal(sum[:], b[len(backupMagic)+8:backupHeader]) {
		return BackupContents{}, fmt.Errorf("%w: checksum mismatch (the file is damaged)", ErrBadBackup)
	}
	index, now, state, err := splitSnapshot(snap)
	if err != nil {
		return BackupContents{}, fmt.Errorf("%w: %w", ErrBadBackup, err)
	}
	return BackupContents{Index: index, Now: now, State: state}, nil
}

// RestoreBackup replaces the cluster's state with a backup (from Backup),
// on the leader: raft installs it as a snapshot at its next log index and
// current term, and sends it to every follower. It is for disaster
// recovery into a new cluster: calls answered since the backup are lost,
// so their spenders' next calls may be refused as stale or find less
// than they were granted.
//
// Before anything changes it refuses (ErrBadBackup) a backup that is
// damaged (OpenBackup), does not decode, names an index beyond
// maxBackupIndex, or whose latest instant is more than maxAhead ahead of
// now (the leader's clock): the leader would stamp no call until its clock
// got there, so every call would be refused meanwhile. Not the leader: a
// *NotLeaderError.
func (n *Node) RestoreBackup(ctx context.Context, b []byte, now bucket.Instant, maxAhead time.Duration) error {
	c, err := ReadBackup(b)
	if err != nil {
		return err
	}
	switch {
	case c.Index > maxBackupIndex:
		return fmt.Errorf("%w: log index %d, beyond any a cluster reaches (%d)", ErrBadBackup, c.Index, uint64(maxBackupIndex))
	case c.Now < 0:
		return fmt.Errorf("%w: its latest instant is before 1970", ErrBadBackup)
	case c.Now.Sub(now) > maxAhead:
		return fmt.Errorf("%w: its latest instant, %s, is %v ahead of this leader's clock, more than the %v a leader waits for its clock",
			ErrBadBackup, c.Now.Time(time.Unix(0, 0)).UTC().Format(time.RFC3339), c.Now.Sub(now).Round(time.Millisecond), maxAhead)
	}
	if _, err := ledger.Restore(n.fsm.cfg, c.State, c.Now); err != nil {
		return fmt.Errorf("%w: %w", ErrBadBackup, err)
	}
	if err := n.leading(); err != nil {
		return err
	}
	// raft restores only once this leader has applied its log (a new
	// leader has not yet applied its configuration entry): wait for that.
	if err := n.wait(ctx, n.raft.Barrier(timeout(ctx))); err != nil {
		return err
	}
	// The snapshot goes in at raft's next index (raft takes the larger of
	// its last index and the meta's, plus one): the FSM's applied index
	// after the restore is then this cluster's, not the backup's.
	next := n.raft.LastIndex() + 1
	snap := appendSnapshot(nil, next, c.Now, c.State)
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: next - 1, Size: int64(len(snap))}
	if err := n.raft.Restore(meta, bytes.NewReader(snap), timeout(ctx)); err != nil {
		// Not restored (raft cannot now: a configuration change is under
		// way, its queue is full, it shut down), or restored here and its
		// replication not seen through: take a backup to see which.
		return fmt.Errorf("%w: restore: %w", ErrOutcomeUnknown, err)
	}
	return nil
}

// Members returns the cluster's latest configuration as this member
// knows it.
func (n *Node) Members() ([]raft.Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("cluster: configuration: %w", err)
	}
	return f.Configuration().Servers, nil
}
