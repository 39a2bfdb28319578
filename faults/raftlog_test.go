//go:build faults

package faults

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

// call names one call of a spender: what the exactly-once records key on.
type call struct {
	spender         string
	epoch, sequence uint64
}

// replay is one member's raft log as the member applied it: every
// command entry, in log order, through the ledger's own state machine
// (cluster.FSM), as a member's raft does.
type replay struct {
	member      string
	first, last uint64
	entries     int                     // command entries
	applied     map[call]bucket.Instant // calls that changed the state (Acquire and ReserveAhead), with the instant they were proposed at
	released    int                     // Release calls applied
	twice       []string                // calls applied a second time: must be none
	retried     int                     // calls answered from their stored reply (a retry after a failover)
	refused     int                     // calls refused (stale, conflicting or invalid)
	backupAt    uint64                  // the log index whose state equals the backup, 0 if none
}

// replayLog opens the raft log of a stopped member (its data directory's
// raft.db, read-only) and replays it under cfg, the state machine's
// configuration the member ran with. It compares the state after every
// command entry with backup (a leader's GET /admin/backup) and records
// where they are equal, byte for byte.
//
// A call applied for the first time changes its spender's exactly-once
// record (cluster.Result.Changed names the session); a call answered
// from the stored reply changes nothing. A call that changes the state a
// second time was applied twice: its grant was taken from the key's
// bucket twice and answered once.
func replayLog(t *testing.T, member, dataDir string, cfg ledger.Config, backup []byte) *replay {
	t.Helper()
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dataDir, "raft.db"),
		BoltOptions: &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second}})
	if err != nil {
		t.Fatalf("%s: opening its raft log: %v", member, err)
	}
	defer store.Close()
	r := &replay{member: member, applied: map[call]bucket.Instant{}}
	if r.first, err = store.FirstIndex(); err == nil {
		r.last, err = store.LastIndex()
	}
	if err != nil {
		t.Fatalf("%s: raft log: %v", member, err)
	}
	if r.first != 1 {
		// Raft compacts the log only after a snapshot, which it takes
		// after 8192 entries or 120 s: a case shorter than both keeps it.
		t.Fatalf("%s: its raft log starts at index %d, not 1 (compacted after a snapshot): the replay needs the whole log", member, r.first)
	}
	fsm, err := cluster.NewFSM(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, err := cluster.ReadBackup(backup)
	if err != nil {
		t.Fatal(err)
	}
	for i := r.first; i <= r.last; i++ {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			t.Fatalf("%s: log index %d: %v", member, i, err)
		}
		if l.Type != raft.LogCommand {
			continue // raft gives the FSM command entries only
		}
		r.entries++
		cmds, err := cluster.DecodeEntry(l.Data)
		if err != nil {
			t.Fatalf("%s: log index %d: %v", member, i, err)
		}
		out := fsm.Apply(&l)
		res, ok := out.([]cluster.Result)
		if !ok || len(res) != len(cmds) {
			t.Fatalf("%s: log index %d: the FSM answered %v for %d commands", member, i, out, len(cmds))
		}
		for k, cmd := range cmds {
			r.count(i, cmd, res[k])
		}
		if st, at := fsm.StateSnapshot(); r.backupAt == 0 && at == want.Index && bytes.Equal(st, want.State) {
			r.backupAt = i
		}
	}
	return r
}

// count classifies one command's outcome.
func (r *replay) count(index uint64, cmd ledger.Command, res cluster.Result) {
	var c call
	var now bucket.Instant
	release := false
	switch x := cmd.(type) {
	case ledger.Acquire:
		c, now = call{x.Caller.SpenderID, x.Caller.Epoch, x.Caller.Sequence}, x.Now
	case ledger.ReserveAhead:
		c, now = call{x.Caller.SpenderID, x.Caller.Epoch, x.Caller.Sequence}, x.Now
	case ledger.Release:
		c, release = call{x.Caller.SpenderID, x.Caller.Epoch, x.Caller.Sequence}, true
	default:
		return // a sweep: no caller
	}
	switch {
	case res.Err != nil:
		r.refused++
	case len(res.Changed.Sessions) == 0:
		r.retried++
	case release:
		r.released++
	default:
		if _, dup := r.applied[c]; dup {
			r.twice = append(r.twice, fmt.Sprintf("spender %s epoch %d sequence %d again at index %d", c.spender, c.epoch, c.sequence, index))
		}
		r.applied[c] = now
	}
}

func (r *replay) String() string {
	return fmt.Sprintf("%s: log %d..%d, %d command entries: %d calls applied, %d answered again from their stored reply, %d refused, %d releases",
		r.member, r.first, r.last, r.entries, len(r.applied), r.retried, r.refused, r.released)
}

// appliedBy counts spender's calls applied that were proposed before at.
func (r *replay) appliedBy(spender string, at time.Time) int {
	n := 0
	for c, now := range r.applied {
		if c.spender == spender && now < ledger.InstantOf(at) {
			n++
		}
	}
	return n
}

// fetchBackup takes a backup of the cluster's state from its leader, at
// url, through the admin API with the admin token. (A follower would
// redirect, and the HTTP client drops the token on a redirect to another
// host.)
func fetchBackup(ctx context.Context, t *testing.T, url string) []byte {
	t.Helper()
	code, b := adminWith(ctx, t, http.MethodGet, url+"/admin/backup", adminToken, nil)
	if code != http.StatusOK {
		t.Fatalf("backup: status %d: %s", code, strings.TrimSpace(string(b)))
	}
	return b
}
