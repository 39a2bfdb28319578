package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration/bucket"
)

// TestBackupRestore: a backup of one cluster's leader, restored on the
// leader of a new three-node cluster, becomes every node's state (the
// followers install it as a snapshot) at the new cluster's own log index,
// and the commands that follow get the replies a single State gives; a
// restore on a follower is refused with nothing changed.
func TestBackupRestore(t *testing.T) {
	w := newWorkload(t)
	src := newCluster(t, 3)
	w.run(src, 40, 4)
	w.check(src.converge())
	backup := src.leader().Backup()

	dst := newCluster(t, 3)
	lead := dst.leader()
	before, _ := lead.FSM().StateSnapshot()
	for _, nd := range dst.nodes {
		if nd == lead {
			continue
		}
		var nle *NotLeaderError
		if err := nd.RestoreBackup(t.Context(), backup, w.now, time.Second); !errors.As(err, &nle) || nle.Unknown {
			t.Fatalf("restore on a follower: %v, want a NotLeaderError", err)
		}
	}
	if st, _ := lead.FSM().StateSnapshot(); string(st) != string(before) || lead.FSM().Restores() != 0 {
		t.Fatal("a refused restore changed the state")
	}
	lead = restore(t, dst, backup, w.now)
	w.check(dst.converge())
	for _, nd := range dst.nodes {
		if nd.FSM().Restores() == 0 {
			t.Fatalf("%s did not restore a snapshot", nd.ID())
		}
		if i, last := nd.FSM().AppliedIndex(), lead.Raft().LastIndex(); i > last || last-i > ReadyLag {
			t.Fatalf("%s applied index %d after the restore; the leader's log ends at %d", nd.ID(), i, last)
		}
	}
	w.run(dst, 20, 3)
	w.check(dst.converge())
	members, err := lead.Members()
	if err != nil || len(members) != 3 || members[0].ID != dst.nodes[0].ID() {
		t.Fatalf("members after the restore: %v %v, want the new cluster's own", members, err)
	}
}

// TestRestoreRefusesHostileBackups: a backup cut short, extended, with a
// flipped byte, without the header, with a state that does not decode, a
// log index of 2^64-1, or an instant a year ahead of the leader's clock
// (or before 1970) is refused with ErrBadBackup and the reason, before
// raft sees it: the state, the log and the snapshots stay as they were.
func TestRestoreRefusesHostileBackups(t *testing.T) {
	w := newWorkload(t)
	c := newCluster(t, 3)
	w.run(c, 20, 2)
	w.check(c.converge())
	lead := c.leader()
	good := lead.Backup()
	contents, err := ReadBackup(good)
	if err != nil {
		t.Fatal(err)
	}
	reseal := func(index uint64, now bucket.Instant, state []byte) []byte {
		return BackupContents{Index: index, Now: now, State: state}.Encode()
	}
	if !bytes.Equal(reseal(contents.Index, contents.Now, contents.State), good) {
		t.Fatal("ReadBackup and Encode do not round-trip")
	}
	flipped := append([]byte{}, good...)
	flipped[len(flipped)-3] ^= 0x10
	year := bucket.Instant(365 * 24 * time.Hour / time.Microsecond)
	for _, tc := range []struct {
		name, backup, reason string
	}{
		{"cut short", string(good[:len(good)-1]), "cut short or extended"},
		{"extended", string(good) + "x", "cut short or extended"},
		{"a flipped byte", string(flipped), "checksum mismatch"},
		{"no header", string(good[backupHeader:]), "not a ration backup"},
		{"empty", "", "not a ration backup"},
		{"a state that does not decode", string(reseal(contents.Index, contents.Now, []byte{0xff, 0xff, 0xff})), "backup refused: "},
		{"index 2^64-1", string(reseal(math.MaxUint64, contents.Now, contents.State)), "log index 18446744073709551615"},
		{"an instant a year ahead", string(reseal(contents.Index, w.now+year, contents.State)), "ahead of this leader's clock"},
		{"an instant before 1970", string(reseal(contents.Index, -1, contents.State)), "before 1970"},
		{"a length of 2^64-1", string(binary.BigEndian.AppendUint64([]byte(backupMagic), math.MaxUint64)) + string(good[len(backupMagic)+8:]), "cut short or extended"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, index := lead.FSM().StateSnapshot()
			last := lead.Raft().LastIndex()
			err := lead.RestoreBackup(t.Context(), []byte(tc.backup), w.now, time.Second)
			if !errors.Is(err, ErrBadBackup) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("%v, want ErrBadBackup saying %q", err, tc.reason)
			}
			if st, i := lead.FSM().StateSnapshot(); string(st) != string(state) || i != index || lead.Raft().LastIndex() != last || lead.FSM().Restores() != 0 {
				t.Fatal("a refused restore changed the state or reached raft")
			}
		})
	}
	w.check(c.converge())
	// Within the leader's wait for its clock, an instant ahead is taken.
	restore(t, c, reseal(contents.Index, w.now+bucket.Instant(time.Second/time.Microsecond)/2, contents.State), w.now)
}

// restore restores b on c's leader and returns that leader. A restore
// whose outcome is unknown (the leader lost its leadership before the
// cluster took it: an election on a loaded machine) is repeated at the
// leader, as an operator would: restoring the same backup twice gives the
// same state.
func restore(t *testing.T, c *testCluster, b []byte, now bucket.Instant) *Node {
	t.Helper()
	for deadline := time.Now().Add(waitFor); ; {
		lead := c.leader()
		err := lead.RestoreBackup(t.Context(), b, now, time.Second)
		if err == nil {
			return lead
		}
		if !errors.Is(err, ErrOutcomeUnknown) && !errors.Is(err, ErrNotLeader) || time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}

// TestReadBackupFrom: a backup is read whole within its bound; one that
// declares more is refused from its header, before its bytes are read;
// one cut short or longer than it declares is refused.
func TestReadBackupFrom(t *testing.T) {
	good := BackupContents{Index: 7, Now: 1, State: bytes.Repeat([]byte("s"), 1000)}.Encode()
	if b, err := ReadBackupFrom(bytes.NewReader(good), int64(len(good))); err != nil || !bytes.Equal(b, good) {
		t.Fatalf("%v", err)
	}
	huge := BackupContents{State: make([]byte, 1)}.Encode()
	binary.BigEndian.PutUint64(huge[len(backupMagic):], 1<<40)
	endless := io.MultiReader(bytes.NewReader(huge), neverEnding{})
	if _, err := ReadBackupFrom(endless, 1<<20); !errors.Is(err, ErrBackupTooLarge) {
		t.Fatalf("a backup declaring a TiB: %v", err)
	}
	for name, tc := range map[string]struct {
		data   []byte
		reason string
	}{
		"cut short":   {good[:len(good)-1], "cut short"},
		"extended":    {append(bytes.Clone(good), 'x'), "extended"},
		"no header":   {good[backupHeader:], "not a ration backup"},
		"a few bytes": {good[:10], "reading its header"},
		"other bytes": {[]byte("not a backup"), "not a ration backup"},
	} {
		if _, err := ReadBackupFrom(bytes.NewReader(tc.data), 1<<20); !errors.Is(err, ErrBadBackup) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: %v, want ErrBadBackup saying %q", name, err, tc.reason)
		}
	}
}

// neverEnding reads zeros for ever.
type neverEnding struct{}

func (neverEnding) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
